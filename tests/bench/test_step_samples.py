"""The sampling profile's parts (altgrad.bench._step_samples): which samples count, where each is charged."""

from __future__ import annotations

from pathlib import Path

import pytest

from altgrad.bench import _step_samples as ss

JOB = ("_run_module_as_main (<frozen runpy>:198);main (altgrad/train.py:582);Trainer.fit (lightning/pytorch/trainer/"
       "trainer.py:560);_TrainingEpochLoop.advance (lightning/pytorch/loops/training_epoch_loop.py:330)")
LOOP = "_run_module_as_main (<frozen runpy>:198);main (altgrad/bench/_reference_loop.py:121);" \
       "run (altgrad/bench/_reference_loop.py:70)"

LINES = [
    f"{JOB};Closure.closure (lightning/pytorch/loops/optimization/automatic.py:140);backward (torch/autograd/"
    "__init__.py:360);_engine_run_backward (torch/autograd/graph.py:829) 50",
    f"{JOB};GPT.forward (altgrad/model.py:170);Linear.forward (torch/nn/modules/linear.py:134) 20",
    f"{JOB};GPT.forward (altgrad/model.py:170);GELU.forward (torch/nn/modules/activation.py:734) 6",
    f"{JOB};GPT.forward (altgrad/model.py:166) 4",
    f"{JOB};Adam.step (torch/optim/adam.py:247);_single_tensor_adam (torch/optim/adam.py:400) 4",
    f"{JOB};clip_grad_norm_ (torch/nn/utils/clip_grad.py:180);_get_total_norm (torch/nn/utils/clip_grad.py:90) 1",
    f"{JOB};_call_callback_hooks (lightning/pytorch/trainer/call.py:228) 2",
    f"{JOB};DivergenceCallback.on_before_optimizer_step (altgrad/callbacks/divergence.py:262) 1",
    f"{JOB};AltGradModule.training_step (altgrad/module.py:300);rank_zero (lightning_utilities/core/rank_zero.py:42) 2",
    # not in a step: validation, an import inside the loop, start-up
    f"{JOB};_EvaluationLoop.run (lightning/pytorch/loops/evaluation_loop.py:140);GPT.forward (altgrad/model.py:170) 9",
    f"{JOB};_find_and_load (<frozen importlib._bootstrap>:1176) 7",
    "_run_module_as_main (<frozen runpy>:198);main (altgrad/train.py:582) 30",
    " 11",  # a sample without Python frames
    "",
]


def test_a_jobs_samples_go_to_their_parts_and_scale_to_ms_a_step() -> None:
    parts = ss.ms_per_step(LINES, "job", steps=10, rate=100.0)  # one sample = 1 ms a step
    assert parts == {"backward": 50.0, "linear": 20.0, "other forward": 10.0, "optimizer": 4.0, "grad norm": 1.0,
                     "lightning": 2.0, "callbacks": 1.0, "rest": 2.0, "all": 90.0}


def test_the_loops_steps_are_its_run_frame_less_evaluation_and_imports() -> None:
    lines = [f"{LOOP};GPT.forward (altgrad/model.py:170);Linear.forward (torch/nn/modules/linear.py:134) 8",
             f"{LOOP};clip_grad_norm_ (torch/nn/utils/clip_grad.py:180) 2",
             f"{LOOP};evaluate (altgrad/bench/_reference_loop.py:58);GPT.forward (altgrad/model.py:170) 5",
             f"{LOOP};_find_and_load (<frozen importlib._bootstrap>:1176) 3",
             *LINES[:2]]  # a job's stack never counts as the loop's
    parts = ss.ms_per_step(lines, "loop", steps=1, rate=1000.0)
    assert parts["linear"] == 8.0 and parts["grad norm"] == 2.0 and parts["all"] == 10.0


@pytest.mark.parametrize("leaf, expected", [
    ("_engine_run_backward (torch/autograd/graph.py:829)", "backward"),
    ("forward (altgrad/quant/linear_node.py:120)", "linear"),  # a quantized Linear's node
    ("Optimizer.zero_grad (torch/optim/optimizer.py:1000)", "optimizer"),
    ("layer_norm (torch/nn/functional.py:2900)", "other forward"),
    ("_clip_grads_with_norm_ (torch/nn/utils/clip_grad.py:200)", "grad norm"),
    ("FlipCallback.on_train_batch_end (altgrad/callbacks/flips.py:300)", "callbacks"),
    ("_LoggerConnector.metrics (lightning/pytorch/trainer/connectors/logger_connector/logger_connector.py:9)",
     "lightning"),
    ("json_dumps_safer_history (wandb/util.py:800)", "rest"),
])
def test_a_leaf_frame_names_its_part(leaf: str, expected: str) -> None:
    assert ss.part(leaf) == expected


def test_bad_input_says_what_was_wrong(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="line 2 is not"):
        ss.ms_per_step([LINES[0], "no count here"], "job", 1, 100.0)
    with pytest.raises(ValueError, match="valid: job, loop"):
        ss.ms_per_step(LINES, "lightning", 1, 100.0)
    raw = tmp_path / "job.txt"
    raw.write_text("\n".join(LINES) + "\n")
    assert ss.main([str(raw), "--kind", "job", "--steps", "10"]) == 0
    assert "all 90.00 ms a step | backward 50.00 | linear 20.00" in capsys.readouterr().out
    for argv, message in ([str(tmp_path / "none.txt"), "--kind", "job", "--steps", "1"], "no such file"), \
                         ([str(raw), "--kind", "job", "--steps", "0"], "valid: steps >= 1"):
        with pytest.raises(SystemExit) as stop:
            ss.main(argv)
        assert stop.value.code == 2 and message in capsys.readouterr().err


def test_each_callbacks_hooks_take_what_they_call() -> None:
    lines = [f"{JOB};FlipCallback.on_train_batch_end (altgrad/callbacks/flips.py:300);quantize_scaled "
             "(altgrad/quant/fake_quant.py:90) 3",
             f"{JOB};FlipCallback.on_train_batch_end (altgrad/callbacks/flips.py:301) 1",
             f"{JOB};DivergenceCallback.on_before_optimizer_step (altgrad/callbacks/divergence.py:262);"
             "Instrument.log_scalars (altgrad/callbacks/base.py:140);"
             "_get_total_norm (torch/nn/utils/clip_grad.py:90) 2",
             *LINES]
    assert ss.per_callback(lines, "job", steps=10, rate=100.0) == {"flips": 4.0, "divergence": 3.0}
