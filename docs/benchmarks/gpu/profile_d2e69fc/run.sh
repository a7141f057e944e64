#!/bin/bash
# issue 31: e4m3 with default diagnostics after the diagnostics' per-step work was cut, beside the bf16 job
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/.gpusite:$PWD/.gpucache:$PWD ALTGRAD_CACHE=$PWD/.gpucache PYTHONUNBUFFERED=1 WANDB_MODE=offline
START=$(date +%s)
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; cat .gpucache/commit.txt; } > $OUT/machine.txt 2>&1
cat $OUT/machine.txt
run() { # name, seconds, extra args...
  local name=$1 secs=$2; shift 2
  timeout $secs python3 -m altgrad.train trainer=gpu model=gpt_50m logger=csv trainer.max_steps=300 \
    trainer.val_check_interval=300 trainer.initial_validation=false trainer.sample_tokens=0 \
    trainer.peak_flops=9.89e14 hydra.run.dir=/tmp/run_$name "$@" > /tmp/$name.log 2>&1
  echo "$name rc=$? at $(( $(date +%s)-START )) s" | tee -a $OUT/results.txt
  tail -c 600 /tmp/$name.log
  cp /tmp/run_$name/summary.json $OUT/summary_$name.json 2>/dev/null
  python3 -c "import json;d=json.load(open('/tmp/run_$name/summary.json'));t=d.get('timing',{});print('$name', d['status'], d['steps'], 'val', d['final_val_loss'], 'steady tok/s', t.get('steady_tokens_per_second'), 'steady_mfu', d.get('steady_mfu'), {k: round(v, 1) for k, v in t.items() if 'seconds' in k})" 2>&1 | tee -a $OUT/results.txt
}
run fp32 90 format=fp32
run e4m3 $(( 395 - ($(date +%s) - START) )) format=e4m3 +callbacks.stepprof._target_=stepprof.StepProfile \
  +callbacks.stepprof.start=100 +callbacks.stepprof.steps=20 +callbacks.stepprof.out=$OUT/e4m3prof
rm -f $OUT/e4m3prof/host_ops.txt $OUT/e4m3prof/kernels.txt
exit 0
