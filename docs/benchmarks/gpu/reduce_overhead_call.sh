#!/bin/bash
# One device call (issue 31): does torch.compile's reduce-overhead mode (CUDA graphs) close the quantized job's
# host-bound gap? model=gpt_50m trainer=gpu, 300 steps, validation only at the end, logger=csv, as profile-gpu-job
# (no step profile: the profiler is not mixed with graph capture). Jobs in order: bf16, e4m3 (default diagnostics),
# e4m3 callbacks=none; each under its own timeout. Run from the repository root with .whl/ carried; results in $OUT/ro.
set -u
D=${OUT:-/tmp/out}/ro; mkdir -p "$D"
. docs/benchmarks/gpu/device_env.sh "$D/machine.txt"
for spec in "bf16:format=fp32:130" "e4m3:format=e4m3:250" "e4m3_no_diagnostics:format=e4m3 callbacks=none:200"; do
  IFS=: read -r name job limit <<< "$spec"
  s=$(date +%s)
  timeout "$limit" python3 -m altgrad.train trainer=gpu model=gpt_50m $job logger=csv trainer.max_steps=300 \
    trainer.val_check_interval=300 trainer.initial_validation=false trainer.sample_tokens=0 trainer.peak_flops=9.89e14 \
    trainer.compile_mode=reduce-overhead hydra.run.dir="$D/$name" > "$D/$name.log" 2>&1
  echo "$name rc=$? wall_s=$(( $(date +%s) - s ))" | tee -a "$D/calls.txt"
  find "$D/$name" -name '*.ckpt' -delete 2>/dev/null
done
