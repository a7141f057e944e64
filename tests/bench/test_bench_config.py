"""Every option of every config group composes, validates and instantiates; bad values fail in one clear line."""

from __future__ import annotations

import importlib
from pathlib import Path

import hydra.utils
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from lightning.pytorch.loggers import CSVLogger, WandbLogger
from omegaconf import DictConfig, OmegaConf

from altgrad.config import ConfigError, RunConfig, valid_formats, validate
from altgrad.data.datamodule import TextDataModule
from altgrad.model import GPT, GPTConfig
from altgrad.module import WarmupCosine
from altgrad.optim import build_optimizer
from altgrad.optim.factory import weight_decay_groups
from altgrad.preflight import check_overrides
from altgrad.train import build_callbacks, build_loggers, build_module, build_trainer

from bench_helpers import REPO

CONF = REPO / "conf"


def group_options() -> list[tuple[str, str]]:
    """(group, option) for every selectable group in conf/ (and hydra/launcher), as Hydra itself lists them."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        # conf/study holds study plans (altgrad.study), not options of the train config
        groups = [g for g in loader.list_groups("") if not g.startswith("_") and g not in ("hydra", "study")]
        groups += ["hydra/launcher"]
        return [(g, o) for g in groups for o in loader.get_group_options(g)]


OPTIONS = group_options()


def compose_cfg(tmp_path: Path, *overrides: str, hydra_cfg: bool = False) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("train", overrides=[f"paths.output_dir={tmp_path / 'run'}", *overrides],
                       return_hydra_config=hydra_cfg)


def test_every_group_has_options() -> None:
    groups = {g for g, _ in OPTIONS}
    assert {"format", "layer_map", "optimizer", "data", "model", "trainer", "logger", "callbacks", "experiment",
            "hydra/launcher"} <= groups
    assert {o for g, o in OPTIONS if g == "hydra/launcher"} >= {"basic", "joblib", "submitit_local",
                                                                "submitit_slurm"}


def first_sweep_point(tmp_path: Path, experiment: str) -> tuple[list[str], DictConfig]:
    """The overrides of an experiment's first job (the first value of each of its sweeper params), and the experiment
    as composed with Hydra's own config."""
    cfg = compose_cfg(tmp_path, f"experiment={experiment}", hydra_cfg=True)
    params = cfg.hydra.sweeper.get("params")
    params = OmegaConf.to_container(params, resolve=False) if params is not None else {}
    return [f"{key}={str(value).split(',')[0].strip()}" for key, value in params.items()], cfg


def data_folder(tmp_path: Path, cfg: DictConfig) -> list[str]:
    """For a folder data source (data=folder, data=eurlex_en and the experiments on them): a tiny folder holding its
    train and validation files, as data.dir (no checksum file: data.checksums=null)."""
    if cfg.data.get("source") != "folder":
        return []
    folder = tmp_path / "folder"
    folder.mkdir(exist_ok=True)
    for name in (cfg.data.train_file, cfg.data.val_file):
        (folder / name).write_text("Article 1\nThis Regulation applies.\n\n" * 200)
    return [f"data.dir={folder}", "data.checksums=null"]


def instantiate_run(run: RunConfig) -> None:
    """Build everything train() builds before it fits, the way it builds it: the data module, the module (on the
    meta device: the big presets cost nothing), the callbacks with FakeQuantCallback first (applied to the model),
    the loggers and the Trainer."""
    from altgrad.callbacks.fake_quant import FakeQuantCallback

    datamodule = hydra.utils.instantiate(run.composed.data, _convert_="all")
    assert isinstance(datamodule, TextDataModule) and datamodule.batch_size == run.data.batch_size
    with torch.device("meta"):
        module = build_module(run, 257)
    assert module.model.config.n_layer == run.model.n_layer
    callbacks = build_callbacks(run, run.run_dir)
    assert isinstance(callbacks[0], FakeQuantCallback) and callbacks[0].stats == run.quant.stats
    with torch.device("meta"):
        callbacks[0].apply(module.model)
    if run.trainer.accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        run.trainer.accelerator = "cpu"  # same settings otherwise (bf16-mixed autocast exists on CPU too)
    trainer = build_trainer(run, run.run_dir, callbacks, build_loggers(run, run.run_dir))
    assert trainer.max_steps == run.trainer.max_steps


@pytest.mark.parametrize(("group", "option"), OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_option_composes_validates_and_instantiates(tmp_path: Path, group: str, option: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    extra, cfg = [], None
    if group == "experiment":
        text = tmp_path / "evidence.txt"  # the GPU confirmation's debug twins read a text file named by this variable
        text.write_text("Article 1\nThis Regulation applies.\n" * 50)
        monkeypatch.setenv("ALTGRAD_EVIDENCE_TEXT", str(text))
        extra, plain = first_sweep_point(tmp_path, option)
        if any(e.lstrip("+~").startswith("data") for e in extra):  # the first job's data differ from the plain one's
            plain = compose_cfg(tmp_path, f"{group}={option}", *extra)
        extra += data_folder(tmp_path, plain)
        cfg = compose_cfg(tmp_path, f"{group}={option}", *extra)
        if "${tuned_lr." in str(OmegaConf.to_container(cfg, resolve=False)):
            # a sweep that reads its lrs from a table that tuning writes: until the table exists it stops in one line
            try:
                validate(cfg)
            except ConfigError as err:
                assert "tuned_lr" in str(err) and "\n" not in str(err)
                return
    if group == "data":
        extra = data_folder(tmp_path, compose_cfg(tmp_path, f"{group}={option}"))
    if (group, option) == ("data", "local"):
        (tmp_path / "corpus.txt").write_text("Article 1\nThis Regulation applies.\n" * 50)
        extra = [f"data.path={tmp_path / 'corpus.txt'}"]
    if group == "optimizer" and option.startswith("grid"):
        extra = ["quant.master=none"]  # GridOptim needs the weights stored on the grid (config.validate says so)
    if cfg is None:
        cfg = compose_cfg(tmp_path, f"{group}={option}", *extra, hydra_cfg=group.startswith("hydra"))
    if group.startswith("hydra"):
        # Hydra refuses to instantiate its own internal BasicLauncher declaratively; build each class directly.
        params = OmegaConf.to_container(cfg.hydra.launcher, resolve=False)
        module, name = params.pop("_target_").rsplit(".", 1)
        launcher = getattr(importlib.import_module(module), name)(**params)
        assert type(launcher).__name__.endswith("Launcher")
        return
    run = validate(cfg)
    run_dir = run.run_dir
    if group == "data":
        dm = hydra.utils.instantiate(cfg.data, _convert_="all")
        assert isinstance(dm, TextDataModule) and dm.name == option
    elif group == "model":
        with torch.device("meta"):  # the big presets cost nothing on the meta device
            model = GPT(GPTConfig(**{k: v for k, v in cfg.model.items() if k != "name"} | {"vocab_size": 257}))
        assert model.num_params() > 0
    elif group == "trainer":
        if run.trainer.accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
            run.trainer.accelerator = "cpu"  # same settings otherwise (bf16-mixed autocast exists on CPU too)
        trainer = build_trainer(run, run_dir, build_callbacks(run, run_dir), [])
        assert trainer.max_steps == cfg.trainer.max_steps
    elif group == "optimizer":
        factory = hydra.utils.instantiate({k: v for k, v in cfg.optimizer.items() if k not in ("name", "label")})
        assert issubclass(factory.func, torch.optim.Optimizer)
        # built the way configure_optimizers builds it: over a quantized GPT, each weight told its grid
        from altgrad.callbacks.fake_quant import FakeQuantCallback

        model = GPT(GPTConfig(block_size=8, vocab_size=16, n_layer=1, n_head=1, n_embd=8))
        FakeQuantCallback({"name": "e4m3", "grad": "e5m2"}, {"base_rules": []}).apply(model)
        opt, info = build_optimizer(cfg.optimizer, model)
        assert isinstance(opt, factory.func) and info["name"] == option
        if option == "adamw":
            assert isinstance(opt, torch.optim.AdamW) and tuple(opt.defaults["betas"]) == (0.9, 0.99)
    elif group in ("format", "layer_map"):
        quant = pytest.importorskip("altgrad.callbacks.fake_quant")
        callback = quant.FakeQuantCallback(OmegaConf.to_container(cfg.format, resolve=True),
                                           OmegaConf.to_container(cfg.layer_map, resolve=True))
        callback.apply(GPT(GPTConfig(block_size=8, vocab_size=16, n_layer=2, n_head=1, n_embd=8)))
    elif group == "logger":
        loggers = build_loggers(run, run_dir)
        assert any(isinstance(lg, CSVLogger) and Path(lg.log_dir) == run_dir for lg in loggers)
        for lg in loggers:
            if isinstance(lg, WandbLogger):
                assert lg._offline and lg.save_dir == str(run_dir)  # W&B never touches the network by default
    elif group == "callbacks":
        callbacks = build_callbacks(run, run_dir)
        assert type(callbacks[-2]).__name__ == "LastCheckpoint"
    instantiate_run(validate(cfg))  # every option, whatever its group: the whole run builds


def test_experiment_sweeps_are_hydra_sweeper_params(tmp_path: Path) -> None:
    cfg = compose_cfg(tmp_path, "experiment=seeds", hydra_cfg=True)
    assert cfg.hydra.sweeper.params.seed == "1,2,3" and cfg.experiment_name == "seeds"


# --- validation: one line naming key, value and what is valid -----------------------------------------------------
@pytest.mark.parametrize(("override", "expected"), [
    ("trainer.max_steps=abc", "trainer.max_steps='abc' is invalid: expected an integer"),
    ("trainer.max_steps=0", "trainer.max_steps=0 is invalid: expected an integer >= 1"),
    ("trainer.peak_flops=fast", "trainer.peak_flops='fast' is invalid: expected null, auto (the GPU's dense 16-bit "
                                "peak) or the peak FLOP/s > 0"),
    ("trainer.peak_flops=-1", "trainer.peak_flops=-1 is invalid"),
    ("trainer.precision=fp8", "trainer.precision='fp8' is not valid; valid: 32-true"),
    ("trainer.accelerator=tpu9", "trainer.accelerator='tpu9' is not valid; valid: cpu, gpu"),
    ("model.n_head=3", "model.n_embd=128 is invalid: expected a multiple of model.n_head=3"),
    ("model.dropout=1.5", "model.dropout=1.5 is invalid: expected a float in [0, 1)"),
    ("data.tokenizer=klingon", "data.tokenizer='klingon' is not valid; valid: bytes, "),
    ("data.val_fraction=0", "data.val_fraction=0.0 is invalid"),
    ("optimizer.lr=-1", "optimizer.lr=-1.0 is invalid: expected a finite float > 0"),
    ("format.name=e9m9", "format.name='e9m9' is not valid; valid: "),
    ("format.rounding=up", "format.rounding='up' is not valid; valid: nearest, stochastic, toward_zero"),
    ("quant.master=fp16", "quant.master='fp16' is not valid; valid: fp32, none"),
    ("quant.stats=never", "quant.stats='never' is not valid; valid: demand, always"),
    ("schedule.min_lr_ratio=2", "schedule.min_lr_ratio=2.0 is invalid"),
    ("+trainer.foo=1", "trainer.foo is not a known key of trainer; valid: name, accelerator"),
    ("+bogus=1", "bogus is not a known top-level key"),
    ("seed=abc", "seed='abc' is invalid: expected an integer"),
    ("ckpt_path=/no/such/run", "ckpt_path='/no/such/run' is not a checkpoint file or a run dir"),
    ("data=local", "data.path is required for data=local"),
    ("+layer_map.rules=[{match: lm_head, input: e9m9}]",
     "layer_map rule 0 ('lm_head'): role 'input': unknown format 'e9m9'; valid: "),
])
def test_bad_values_fail_in_one_line(tmp_path: Path, override: str, expected: str) -> None:
    cfg = compose_cfg(tmp_path, override)
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_format_names_are_the_presets_plus_fp32_and_every_format_option_is_one(tmp_path: Path) -> None:
    from altgrad.quant import get_format

    names = valid_formats()
    assert "fp32" in names and "e9m9" not in names
    for name in set(names) - {"fp32"}:
        assert get_format(name).name == name  # every accepted name is a preset the quantization core builds
    options = {OmegaConf.load(p).get("name") for p in (CONF / "format").glob("*.yaml")}
    assert options and options <= set(names)  # every format= option validates
    for name, value in (("format.name", "e9m9"), ("format.grad", "e9m9")):
        with pytest.raises(ConfigError, match="is not valid; valid: "):
            validate(compose_cfg(tmp_path, f"{name}={value}"))


@pytest.mark.parametrize(("override", "expected"), [
    ("quant.kernel=fast", "quant.kernel='fast' is not valid; valid: auto, native, compiled, eager"),
    ("optimizer=manifold optimizer.kernel=fused",
     "optimizer.kernel='fused' is not valid; valid: auto, native, compiled, eager"),
    ("optimizer=grid quant.master=none optimizer.kernel=native",
     "optimizer.kernel='native' is invalid: expected compiled or eager for optimizer=grid"),
    ("trainer.compile=true", "trainer.compile=true is off on the CPU"),
    ("trainer.compile=maybe", "trainer.compile='maybe' is not valid; valid: false, true, force"),
    ("trainer.compile=force trainer.compile_mode=fast", "trainer.compile_mode='fast' is not valid; valid: default, "
     "reduce-overhead, max-autotune, max-autotune-no-cudagraphs"),
    ("trainer.compile_mode=max-autotune", "trainer.compile_mode=max-autotune needs a compiled model"),
    ("trainer.compile=force trainer.compile_mode=reduce-overhead",
     "trainer.compile_mode=reduce-overhead needs a CUDA GPU (CUDA graphs)"),
])
def test_implementation_choices_are_config_checked_in_one_line(tmp_path: Path, override: str, expected: str) -> None:
    cfg = compose_cfg(tmp_path, *override.split())
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_the_configs_kernel_lists_are_the_codes() -> None:
    """config.py keeps its own copies (it imports no torch); they must name what the code accepts."""
    from altgrad.config import NATIVE_STEP_OPTIMIZERS, OPTIM_KERNELS, QUANT_KERNELS
    from altgrad import optim
    from altgrad.optim.kernels import NATIVE_STEP_KERNELS
    from altgrad.quant.compiled import KERNELS

    assert OPTIM_KERNELS == NATIVE_STEP_KERNELS and QUANT_KERNELS == KERNELS
    p = [torch.nn.Parameter(torch.zeros(2))]
    for name in ("ManifoldAdamW", "RelativeAdamW", "GridOptim"):
        try:
            getattr(optim, name)(p, kernel="auto")
            takes_auto = True
        except ValueError as err:
            takes_auto = "valid: compiled, eager" not in str(err)
        assert takes_auto == (name in NATIVE_STEP_OPTIMIZERS), name


def test_implementation_choices_default_to_what_make_train_runs(tmp_path: Path) -> None:
    assert validate(compose_cfg(tmp_path)).quant.kernel == "auto"
    for option, kernel in (("manifold", "auto"), ("relative", "auto"), ("manifold_grad", "auto"),
                           ("grid", "compiled"), ("grid_real", "compiled")):
        assert validate(compose_cfg(tmp_path, f"optimizer={option}", "quant.master=none")).optimizer.kernel == kernel
    assert validate(compose_cfg(tmp_path, "trainer.compile=force")).trainer.compile == "force"
    assert validate(compose_cfg(tmp_path)).trainer.compile_mode == "default"
    gpu = validate(compose_cfg(tmp_path, "trainer=gpu", "trainer.compile_mode=reduce-overhead")).trainer
    assert (gpu.compile, gpu.compile_mode) == (True, "reduce-overhead")


def test_the_compile_mode_reaches_torch_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    """trainer.compile_mode is the ``mode`` the module compiles its GPT with (default: torch's own, mode=None)."""
    from altgrad.model import GPT, GPTConfig
    from altgrad.module import AltGradModule, WarmupCosine

    seen: list = []
    monkeypatch.setattr(GPT, "compile", lambda self, **kwargs: seen.append(kwargs))
    cfg = GPTConfig(block_size=8, vocab_size=16, n_layer=1, n_head=1, n_embd=8)
    for mode, expected in (("default", None), ("max-autotune-no-cudagraphs", "max-autotune-no-cudagraphs")):
        module = AltGradModule(cfg, {"name": "adamw"}, WarmupCosine(0, 10, 0.1), compile=True, compile_mode=mode)
        module.configure_model()
        assert seen.pop() == {"mode": expected}
    AltGradModule(cfg, {"name": "adamw"}, WarmupCosine(0, 10, 0.1), compile=False).configure_model()
    assert seen == []  # not compiled at all


def test_defaults_validate(tmp_path: Path) -> None:
    cfg = compose_cfg(tmp_path)
    run = validate(cfg)
    assert run.model.name == "nano" and run.data.tokenizer == "bytes" and run.quant.stats == "demand"
    assert run.composed is cfg and run.seed == 1337 and run.run_dir == Path(cfg.paths.output_dir)
    assert run.decay_steps == run.trainer.max_steps  # schedule.decay_steps: null
    assert cfg.data.cache_dir  # never inside the repo: ALTGRAD_CACHE or ~/.cache/altgrad
    assert not Path(cfg.data.cache_dir).expanduser().resolve().is_relative_to(REPO)


# --- preflight: what the command line reports before Hydra starts ----------------------------------------------
@pytest.mark.parametrize(("argv", "expected"), [
    (["format=e9m9"], "format=e9m9 is not an option of the format group; valid: "),
    (["-m", "model=nano,huge"], "model=huge is not an option of the model group; valid: gpt2_124m, gpt_50m, nano"),
    (["seed=1,2"], "seed=1,2 is a sweep; add -m"),
    (["trainer.max_steps=abc"], "trainer.max_steps='abc' is invalid: expected an integer"),
    (["-m", "seed=1,2", "trainer.max_steps=abc"], "trainer.max_steps='abc' is invalid"),
    (["trainer.foo=1"], "cannot compose the config: Could not override 'trainer.foo'"),
    (["hydra/launcher=rocket"], "hydra/launcher=rocket is not an option of the hydra/launcher group"),
    (["model=[nano"], "cannot parse the overrides"),
])
def test_preflight_messages(argv: list[str], expected: str) -> None:
    message = check_overrides(argv, CONF)
    assert message is not None and expected in message and "\n" not in message


@pytest.mark.parametrize("argv", [[], ["-m", "seed=1,2", "format=fp32"], ["--help"], ["--cfg", "job"],
                                  ["experiment=smoke"],
                                  # sweeps format itself: checked at its first format, not the default fp32
                                  ["-m", "experiment=study_cpu_tune_arms", "optimizer=manifold",
                                   "optimizer.lr=0.1,0.3"]])
def test_preflight_accepts_good_command_lines(argv: list[str]) -> None:
    assert check_overrides(argv, CONF) is None


@pytest.mark.parametrize(("overrides", "jobs"), [
    ([], [[]]),
    (["seed=1,2", "format=e4m3,e5m2"], [["seed=1", "format=e4m3"], ["seed=1", "format=e5m2"],
                                        ["seed=2", "format=e4m3"], ["seed=2", "format=e5m2"]]),
    (["+x=1,2", "~y", "seed=3", "seed=range(1,3)"], [["+x=1", "~y=null", "seed=1"], ["+x=1", "~y=null", "seed=2"],
                                                    ["+x=2", "~y=null", "seed=1"], ["+x=2", "~y=null", "seed=2"]]),
    (["optimizer.lr=choice(0.1,0.3)", "model=nano"], [["optimizer.lr=0.1", "model=nano"],
                                                      ["optimizer.lr=0.3", "model=nano"]]),
    (["optimizer.lr=interval(0.1,0.3)"], []),  # only other sweepers sample intervals: left to Hydra
])
def test_sweep_combinations_are_the_basic_sweepers_jobs(overrides: list[str], jobs: list[list[str]]) -> None:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from altgrad.preflight import sweep_combinations

    assert sweep_combinations(OverridesParser.create().parse_overrides(overrides)) == jobs


# --- schedule and optimizer groups ------------------------------------------------------------------------------
def test_warmup_cosine_schedule() -> None:
    s = WarmupCosine(warmup_steps=10, decay_steps=110, min_ratio=0.1)
    assert s(0) == pytest.approx(1 / 11) and s(9) == pytest.approx(10 / 11)
    assert s(10) == pytest.approx(1.0)
    assert s(60) == pytest.approx(0.55)  # half-way down the cosine: min + (1 - min) / 2
    assert s(110) == pytest.approx(0.1) and s(1000) == pytest.approx(0.1)
    assert all(s(i) >= s(i + 1) for i in range(10, 200))


def test_param_groups_list_tied_weights_once() -> None:
    model = GPT(GPTConfig(block_size=8, vocab_size=16, n_layer=1, n_head=1, n_embd=8, bias=True))
    groups, _ = weight_decay_groups(model, 0.1)
    flat = [p for g in groups for p in g["params"]]
    assert len(flat) == len({id(p) for p in flat}) == len(list(model.parameters()))


def test_records_from_before_the_kernel_keys_resume_and_skip_as_before(tmp_path: Path) -> None:
    """Runs recorded before quant.kernel / optimizer.kernel existed are the same configuration as today's defaults
    (resume_sweep skips them, a checkpoint resumes); quant.kernel never counts (every road gives the same bits),
    optimizer.kernel does where the arithmetic differs (eager vs compiled, in float32 rounding), not between compiled,
    native and auto (the same bits)."""
    import copy

    from altgrad.resume_check import config_differences as state_differences
    from altgrad.sweep.resume import config_differences as identity_differences

    current = OmegaConf.to_container(compose_cfg(tmp_path, "optimizer=manifold"), resolve=True)
    old = copy.deepcopy(current)
    del old["quant"]["kernel"], old["optimizer"]["kernel"], old["trainer"]["compile_mode"]
    assert identity_differences(old, current) == [] and state_differences(old, current) == []
    other_mode = copy.deepcopy(current)  # a mode compiles other kernels: another configuration
    other_mode["trainer"]["compile_mode"] = "max-autotune"
    assert identity_differences(other_mode, current) == ["trainer.compile_mode: 'max-autotune' → 'default'"]
    other_road = copy.deepcopy(current)
    other_road["quant"]["kernel"] = "eager"
    assert identity_differences(other_road, current) == [] and state_differences(other_road, current) == []
    for same_bits in ("compiled", "native"):  # auto's (today's default) steps: the compiled step's bits
        step = copy.deepcopy(current)
        step["optimizer"]["kernel"] = same_bits
        assert identity_differences(step, current) == [] and state_differences(step, current) == []
    eager_step = copy.deepcopy(current)
    eager_step["optimizer"]["kernel"] = "eager"
    assert identity_differences(eager_step, current) == ["optimizer.kernel: 'eager' → 'compiled'"]
    assert state_differences(eager_step, current) == ["optimizer.kernel: 'eager' → 'compiled'"]
