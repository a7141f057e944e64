# AltGrad: the README's two commands are `make train` and `make test`; each sets up .venv first when needed.
# Variables: PYTHON (interpreter that creates .venv), ARGS (extra overrides), EXP (experiment for `sweep`),
# RUN (sweep dir for `report`), NAME (benchmark for `bench`), TORCH_INDEX (extra index for the CPU torch wheel).
PYTHON ?= python3
# make study: the current study (conf/study/$(STUDY).yaml), sweeps at once, one thread each (the committed study
# records were computed with one thread); EURLEX: the eurlex-en folder (docs/data.md) study 2 reads
STUDY ?= ongrid
STUDY_JOBS ?= 2
EURLEX ?=
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH_VERSION := 2.13.0
TORCH_INDEX ?=
ARGS ?=
EXP ?= seeds
NAME ?= all
RUN ?= $(lastword $(sort $(wildcard multirun/*/*)))
EVIDENCE_DATA ?= $(CURDIR)/.cache/evidence-gpu
EVIDENCE_BUDGET ?= 540
GPU_JOBS ?= fp32,e4m3,e4m3 callbacks=none
# the steady MFU's peak: auto = the card's dense 16-bit FLOP/s by its name (altgrad/peak_flops.py), or a figure
GPU_PEAK ?= auto
PROFILE_DIR ?= outputs/profile-gpu-job/$(shell date +%Y%m%d-%H%M%S)
# the jobs profile-gpu-job runs, in order (a fresh machine compiles for ≈ 8 min in all: split them over two calls)
PROFILE_JOBS ?= bf16 e4m3_no_diagnostics e4m3
# the GPU targets on a machine whose python3 lacks them: the wheels of `make gpu-wheels` (.whl/), installed into a
# folder of their own first (where .whl/ is absent, nothing is installed)
GPU_SITE = if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/altgrad-site \
  .whl/*.whl && export PYTHONPATH=/tmp/altgrad-site:$$PWD; fi;

.DEFAULT_GOAL := help
.PHONY: install train test test-slow test-gpu bench-gpu bench-gpu-job profile-gpu-job gpu-wheels sweep report bench study evidence-gpu-data evidence-gpu lint clean help

# torch goes in first, pinned to the CPU build: a looser spec would pull the multi-GB CUDA wheels.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) torch==$(TORCH_VERSION)
	$(BIN)/pip install -e ".[dev]"
	touch $(STAMP)

install: $(STAMP) ## create .venv (if missing), install the CPU torch wheel, then altgrad[dev]

train: $(STAMP) ## train the default nanoGPT on the embedded corpus (≈2 min on 2 CPU cores); ARGS='key=value ...'
	$(BIN)/python -m altgrad.train $(ARGS)

test: $(STAMP) ## run the test suite (slow end-to-end tests excluded); EURLEX=DIR also reruns study-2 records
	$(BIN)/python -m pytest -q -n auto --dist loadscope $(if $(EURLEX),--eurlex=$(abspath $(EURLEX))) $(ARGS)

test-slow: $(STAMP) ## run only the slow tests (full default run, torch.compile, ...); EURLEX=DIR: every arm's record reruns
	$(BIN)/python -m pytest -q -n auto --dist loadscope -m slow $(if $(EURLEX),--eurlex=$(abspath $(EURLEX))) $(ARGS)

test-gpu: ## on a CUDA machine (its own torch): CUDA kernels and quantizers vs the CPU reference, bit for bit
	python3 -m pytest -q -p no:cacheprovider tests/gpu $(ARGS)

bench-gpu: ## on a CUDA machine: quantize at 2^24 and 2^28 vs a device copy, and the 50M model's train step (bf16)
	python3 -m altgrad.bench quantize --device cuda --log2n 24
	python3 -m altgrad.bench quantize --device cuda --log2n 28
	python3 -m altgrad.bench step --device cuda --model gpt_50m --vocab 50257 --bf16 --steps 20

# rounds of bench-gpu-job: a target's verdict needs two at least (paired intervals); its record keeps the finished
# jobs, so a call stopped by a timeout goes on in the next one
GPU_ROUNDS ?= 2
bench-gpu-job: ## on a CUDA machine: the job bench on model=gpt_50m trainer=gpu (bf16 vs quantized bf16, steady MFU)
	$(GPU_SITE) python3 -m altgrad.bench job --rounds $(GPU_ROUNDS) --threads default --recipes default --steps 600 --only '$(GPU_JOBS)' \
	  --set trainer=gpu --set model=gpt_50m --set trainer.peak_flops=$(GPU_PEAK) --no-calls \
	  --record docs/benchmarks/job_gpu_record.jsonl --markdown docs/benchmarks/job_gpu.md $(ARGS)

profile-gpu-job: ## on a CUDA machine: where a step's time goes, bf16 vs e4m3 without and with diagnostics (step profile)
	$(GPU_SITE) for name in $(PROFILE_JOBS); do \
	  case $$name in bf16) job="format=fp32";; e4m3_no_diagnostics) job="format=e4m3 callbacks=none";; \
	    e4m3) job="format=e4m3";; *) echo "PROFILE_JOBS: unknown job '$$name'; valid: bf16 e4m3_no_diagnostics e4m3"; exit 2;; esac; \
	  python3 -m altgrad.train trainer=gpu model=gpt_50m $$job logger=csv trainer.max_steps=300 \
	    trainer.val_check_interval=300 trainer.initial_validation=false trainer.sample_tokens=0 \
	    trainer.peak_flops=$(GPU_PEAK) +callbacks.step_profile._target_=altgrad.bench.step_profile.StepProfile \
	    +callbacks.step_profile.start=100 hydra.run.dir=$(PROFILE_DIR)/$$name $(ARGS) || exit 1; \
	done; \
	if [ -n "$$OUT" ]; then tar czf "$$OUT/profile-gpu-job.tgz" --exclude='*.ckpt' --exclude=wandb -C $(PROFILE_DIR) .; fi

gpu-wheels: $(STAMP) ## the wheels an offline CUDA machine's image lacks (hydra-core, omegaconf, antlr4) into .whl/
	rm -rf .whl && mkdir -p .whl
	$(BIN)/pip download -q --no-deps --only-binary=:all: -d .whl \
	  $$($(BIN)/python -c "import importlib.metadata as m; print(*(f'{n}=={m.version(n)}' for n in ('hydra-core', 'omegaconf')))")
	$(BIN)/pip wheel -q --no-deps -w .whl \
	  antlr4-python3-runtime==$$($(BIN)/python -c "import importlib.metadata as m; print(m.version('antlr4-python3-runtime'))")
	@ls .whl

sweep: $(STAMP) ## multirun an experiment: make sweep EXP=seeds ARGS='trainer.max_steps=100'
	$(BIN)/python -m altgrad.train -m experiment=$(EXP) $(ARGS)

report: $(STAMP) ## report on a sweep (default: the latest multirun/DATE/TIME): make report RUN=multirun/...
	$(if $(RUN),,$(error no multirun/DATE/TIME folder yet: run `make sweep` first or pass RUN=...))
	$(BIN)/python -m altgrad.report $(RUN) $(ARGS)

bench: $(STAMP) ## micro-benchmarks: make bench NAME=quantize (default: all)
	$(BIN)/python -m altgrad.bench $(NAME) $(ARGS)

study: $(STAMP) ## the study conf/study/$(STUDY).yaml, resumable (rerun to go on): make study EURLEX=/path/to/eurlex-en
	OMP_NUM_THREADS=1 $(BIN)/python -m altgrad.study $(STUDY) --jobs $(STUDY_JOBS) $(if $(EURLEX),--set data.dir=$(abspath $(EURLEX))) $(ARGS)

evidence-gpu-data: $(STAMP) ## with network: EurLex tokens + tiktoken's gpt2 files into EVIDENCE_DATA (.cache/evidence-gpu)
	ALTGRAD_CACHE=$(EVIDENCE_DATA) TIKTOKEN_CACHE_DIR=$(EVIDENCE_DATA)/tiktoken $(BIN)/python -m altgrad.data.prepare experiment=evidence_gpu $(ARGS)

evidence-gpu: ## on a CUDA machine (its own torch), offline: the GPU confirmation, ≤ 9-min chunks (exit 3: rerun to go on)
	ALTGRAD_CACHE=$(EVIDENCE_DATA) TIKTOKEN_CACHE_DIR=$(EVIDENCE_DATA)/tiktoken HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
	python3 -m altgrad.study evidence_gpu --budget-s $(EVIDENCE_BUDGET) $(ARGS); status=$$?; \
	if [ -n "$$OUT" ]; then cp -r docs/results/evidence-gpu "$$OUT"/; fi; exit $$status

lint: $(STAMP) ## ruff over the package and the tests
	$(BIN)/ruff check altgrad tests

clean: ## remove run outputs and caches (keeps .venv and the token cache in ~/.cache/altgrad)
	rm -rf outputs multirun wandb lightning_logs .pytest_cache .ruff_cache .hypothesis
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'
