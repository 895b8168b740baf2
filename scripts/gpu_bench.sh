#!/usr/bin/env bash
# The GPU benchmark in one device call (BENCHMARKS.md): random checkpoints in the released 1.7B and
# 0.6B shapes, then `python -m tts_engine.tools.bench` on each. Needs /tmp/site (scripts/gpu_setup.sh).
# Knobs (env): SHAPES, LEVELS, FRAMES, VARIANTS_1_7B, VARIANT_LEVELS, VARIANT_FRAMES, T_1_7B, T_0_6B.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
OUT=${OUT:-/tmp/bench_out}; mkdir -p "$OUT"
CK=/tmp/ckpt; mkdir -p $CK
python3 -c "import torch, vllm, transformers; print('vllm', vllm.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__, torch.cuda.get_device_name())" || exit 1
SHAPES=${SHAPES:-"1.7b 0.6b"}
for s in $SHAPES; do
  demo_checkpoint $s $CK > /dev/null &
done
wait
echo "checkpoints built: $(du -sh $CK | cut -f1)"
for s in $SHAPES; do
  if [ "$s" = "1.7b" ]; then V=${VARIANTS_1_7B:-default}; T=${T_1_7B:-300}; else V=${VARIANTS_0_6B:-default}; T=${T_0_6B:-200}; fi
  timeout $T python3 -m tts_engine.tools.bench --demo $s --demo-dir $CK --concurrency ${LEVELS:-1,4,16,64} \
    --frames ${FRAMES:-100} --variants $V --variant-levels ${VARIANT_LEVELS:-1,16} --variant-frames ${VARIANT_FRAMES:-40} \
    --breakdown --json $OUT/gpu_$s.json --markdown $OUT/gpu_$s.md > $OUT/gpu_$s.log 2>&1
  echo "== $s rc=$?"; grep -E '^\||Error|Traceback|error|compiled|started' $OUT/gpu_$s.log | tail -60
done
