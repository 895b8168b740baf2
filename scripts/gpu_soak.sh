#!/usr/bin/env bash
# Issue 13's soak on the GPU: 64 concurrent streams for 10 minutes on the 1.7B shapes (tools/soak.py:
# hang-ups, no-pre-buffer underruns, GPU and host memory every 10 s). Longer than one device call, so it
# runs detached (setsid) and a later call on the same warm machine collects it:
#   bash scripts/gpu_soak.sh start      # returns at once; GPU from SOAK_GPU (default 0)
#   bash scripts/gpu_soak.sh collect    # waits up to WAIT_S (default 0) for it to end; copies to $OUT
# Needs /tmp/site (scripts/gpu_setup.sh). Knobs: STREAMS (64), DURATION (600), GPU_UTIL (0.3).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
S=/tmp/soak; CK=/tmp/ckpt_soak;  # its own copy: other calls build /tmp/ckpt meanwhile
 OUT=${OUT:-/tmp/bench_out}
case "${1:-}" in
start)
  mkdir -p $S $CK
  cat > $S/run.sh <<RUN
cd $(pwd); source scripts/gpu_env.sh
export CUDA_VISIBLE_DEVICES=${SOAK_GPU:-0}
demo_checkpoint 1.7b $CK > /dev/null || exit 1
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader -i ${SOAK_GPU:-0} -l 10 > $S/nvidia_smi.csv &
python3 -m tts_engine.tools.soak --demo 1.7b --demo-dir $CK --streams ${STREAMS:-64} --duration ${DURATION:-600} \
  --gpu-memory-utilization ${GPU_UTIL:-0.3} --json $S/soak.json --label "H200 soak" > $S/soak.log 2>&1
echo \$? > $S/rc
kill %1 2>/dev/null
RUN
  setsid nohup bash $S/run.sh > $S/runner.log 2>&1 < /dev/null &
  echo "soak started (pid $!) on GPU ${SOAK_GPU:-0}";;
collect)
  for _ in $(seq 1 "${WAIT_S:-0}"); do [ -f $S/rc ] && break; sleep 1; done
  mkdir -p "$OUT"; cp $S/soak.json $S/soak.log $S/nvidia_smi.csv "$OUT"/ 2>/dev/null
  echo "rc=$(cat $S/rc 2>/dev/null || echo running)"; grep -v '^INFO\|^WARNING\|it/s\]' $S/soak.log | tail -25;;
*) echo "usage: $0 start|collect"; exit 2;;
esac
