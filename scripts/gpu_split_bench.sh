#!/usr/bin/env bash
# Two GPUs (device kind nvidia-h200-x2), one device call: the same closed-loop load on one engine with both
# stages on GPU 0, then with Stage 1 on GPU 1 (configs/qwen3_tts_split_gpus.yaml). Results in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
OUT=${OUT:-/tmp/bench_out}; mkdir -p "$OUT"
CK=/tmp/ckpt; mkdir -p $CK
nvidia-smi -L
demo_checkpoint 1.7b > /dev/null || exit 1
for layout in one:configs/qwen3_tts.yaml split:configs/qwen3_tts_split_gpus.yaml; do
  name=${layout%%:*}; cfg=${layout#*:}
  timeout ${T:-240} python3 -m tts_engine.tools.bench --demo 1.7b --demo-dir $CK --stage-config $cfg --frames 50 \
    --gpu-memory-utilization 0.3 --concurrency ${LEVELS:-16,64} --warmup 2 --label "layout $name" \
    --json $OUT/split_$name.json --markdown $OUT/split_$name.md > $OUT/split_$name.log 2>&1
  echo "== $name rc=$?"; grep -E '^\||Traceback|Error|captured|warm-up' $OUT/split_$name.log | tail -12
done
