#!/bin/bash
# The next device call (issue 31): where the e4m3 job with its default diagnostics spends its first steps under
# trainer.compile_mode=reduce-overhead (at 26bdf0b it logged no step-20 progress line in ≈ 500 s). Every step's
# progress, dynamo's recompiles and inductor's perf hints (they name skipped CUDA graphs), and every thread's Python
# stack each 60 s (faulthandler; the job goes on). Run from the repository root with .whl/ carried; results in $OUT/rod.
# Arguments are extra overrides for the job, e.g. quant.stats=always (statistics in every step's graph, so no
# `_track_stats` guard switches graphs between steps): bash reduce_overhead_diagnostics_call.sh quant.stats=always
set -u
D=${OUT:-/tmp/out}/rod; mkdir -p "$D"
. docs/benchmarks/gpu/device_env.sh "$D/machine.txt"
s=$(date +%s)
TORCH_LOGS=recompiles,graph_breaks,perf_hints timeout -k 10 ${LIMIT:-420} python3 -c "
import faulthandler, runpy, sys
faulthandler.dump_traceback_later(60, repeat=True, file=sys.stderr)
sys.argv = ['altgrad.train'] + sys.argv[1:]
runpy.run_module('altgrad.train', run_name='__main__')
" trainer=gpu model=gpt_50m format=e4m3 logger=csv trainer.max_steps=300 trainer.val_check_interval=300 \
  trainer.initial_validation=false trainer.sample_tokens=0 trainer.peak_flops=9.89e14 trainer.progress_refresh=1 \
  trainer.compile_mode=reduce-overhead hydra.run.dir="$D/e4m3" "$@" > "$D/e4m3.log" 2>&1
echo "e4m3 $* rc=$? wall_s=$(( $(date +%s) - s ))" | tee -a "$D/calls.txt"
find "$D" -name '*.ckpt' -delete 2>/dev/null
tr '\r' '\n' < "$D/e4m3.log" | grep -v '^\s*$' > "$D/e4m3.lines.log"; rm "$D/e4m3.log"
