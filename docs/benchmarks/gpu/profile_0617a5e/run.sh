#!/bin/bash
# issue 31: where a quantized bf16 step's time goes on model=gpt_50m trainer=gpu (e4m3 vs bf16, and e4m3 callbacks=none)
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/.gpusite:$PWD/.gpucache:$PWD ALTGRAD_CACHE=$PWD/.gpucache PYTHONUNBUFFERED=1 WANDB_MODE=offline
START=$(date +%s)
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; nproc
  python3 -c "import torch,lightning,hydra,triton;print('torch',torch.__version__,'lightning',lightning.__version__,'hydra',hydra.__version__,'triton',triton.__version__)"
  cat .gpucache/commit.txt; } > $OUT/machine.txt 2>&1
cat $OUT/machine.txt
run() { # name, seconds, extra args...
  local name=$1 secs=$2; shift 2
  mkdir -p $OUT/$name
  timeout $secs python3 -m altgrad.train trainer=gpu model=gpt_50m logger=csv trainer.max_steps=300 \
    trainer.val_check_interval=300 trainer.initial_validation=false trainer.sample_tokens=0 \
    trainer.peak_flops=9.89e14 hydra.run.dir=/tmp/run_$name "$@" > $OUT/$name/train.log 2>&1
  echo "$name rc=$? at $(( $(date +%s)-START )) s"
  cp /tmp/run_$name/summary.json /tmp/run_$name/metrics.csv $OUT/$name/ 2>/dev/null
  python3 -c "import json;d=json.load(open('/tmp/run_$name/summary.json'));t=d.get('timing',{});print('$name', d['status'], d['steps'], 'val', d['final_val_loss'], 'steady tok/s', t.get('steady_tokens_per_second'), 'steady_mfu', d.get('steady_mfu'), 'wall', d.get('wall_seconds'), {k: v for k, v in t.items() if 'second' in k})" 2>&1 | tee -a $OUT/results.txt
}
SP="+callbacks.stepprof._target_=stepprof.StepProfile +callbacks.stepprof.start=120 +callbacks.stepprof.steps=20"
run e4m3 250 format=e4m3 $SP +callbacks.stepprof.out=$OUT/e4m3
run fp32 120 format=fp32 $SP +callbacks.stepprof.out=$OUT/fp32
LEFT=$(( 575 - ($(date +%s) - START) ))
echo "left: $LEFT s"
[ $LEFT -gt 60 ] && run e4m3_cbnone $((LEFT-5)) format=e4m3 callbacks=none
grep -h "stepprof:" $OUT/*/train.log
exit 0
