#!/usr/bin/env bash
# Issue "real time under load": where a frame's time goes (one H200; needs /tmp/site from scripts/gpu_setup.sh).
# 1. The code predictor alone (scripts/gpu_microbench.py, 1.7B shapes): plain graphs, compiled, autotuned;
# wall ms, kernels, kernel and busy time per call. 2. The engine (scripts/gpu_load_bench.sh): a Poisson level
# and closed 64 (underruns by chunk index; Stage 0's step times, split by whether a request joined), the
# breakdown and the kernel profile (idle time by gap length); each level's first-chunk path (queue, prompt,
# admit, first frame, decode, delivery).
# 0. CHECKS=handover,prompt,copy first (HANDOVER_CHECK=1: handover): a switch on vs off, bit for bit (gpu_async_check.py
# --switch, tiny shapes, an engine each): early vs late hand-over of frames to Stage 1; prompts from host pieces vs read
# back; prefills copied to the host while Stage 0 waits vs the builder waiting.
# Knobs: MICRO / LOAD (1: run that part; each fits one 10-minute call), DECODER (1: the microbench times the
# decoder's graphs too, with and without SnakeBeta's cached scales), BATCHES (1,16,64), PREDICTOR_VARIANTS
# (all), T_MICRO (300), and gpu_load_bench.sh's (defaults here: CONCURRENCY 20,1, CLOSED 64).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
OUT=${OUT:-/tmp/bench_out}; mkdir -p "$OUT"
[ "${HANDOVER_CHECK:-0}" = 1 ] && CHECKS=${CHECKS:+$CHECKS,}handover
CHECKS=${CHECKS:-}
for check in ${CHECKS//,/ }; do
  timeout 200 python3 scripts/gpu_async_check.py --switch $check --requests 8 > $OUT/${check}_check.log 2>&1
  echo "== $check check rc=$?"; grep -E "^$check|Error|Traceback" $OUT/${check}_check.log
done
[ "${MICRO:-1}" = 1 ] && { timeout ${T_MICRO:-300} python3 scripts/gpu_microbench.py --shapes 1.7b --batches ${BATCHES:-1,16,64} $([ "${DECODER:-0}" = 1 ] || echo --skip-decoder) \
  ${PREDICTOR_VARIANTS:+--predictor-variants $PREDICTOR_VARIANTS} --out $OUT/predictor_micro.json \
  > $OUT/predictor_micro.log 2>&1
echo "== microbench rc=$?"; grep -E '^\{' $OUT/predictor_micro.log | grep -E '"variant"|"what"' | cut -c1-600; }
[ "${LOAD:-1}" = 1 ] || exit 0
KERNEL_PROFILE=${KERNEL_PROFILE:-3} SINGLE=0 CLOSED=${CLOSED:-64} CONCURRENCY=${CONCURRENCY:-20,1} \
  VARIANTS=${VARIANTS:-default} VARIANT_LEVELS=${VARIANT_LEVELS:-1} T_MAIN=${T_MAIN:-300} \
  bash scripts/gpu_load_bench.sh
python3 -c "
import json; d = json.load(open('$OUT/load_full${ENGINE_VARIANT:+_$ENGINE_VARIANT}.json'))
for r in d['results']:
    keys = ('name', 'level', 'mode', 'variant', 'underruns_by_chunk', 'steps', 'step_ms_p50', 'step_ms_p95',
            'step_ms_p95_joined', 'step_ms_p95_not_joined', 'steps_joined_pct', 'first_chunk_path_ms', 'cudagraph_mode',
            'idle_ms_per_frame_by_gap', 'stage1_calls', 'stage1_calls_overdue', 'stage1_calls_by_pass_over',
            'prompt_rows_cached', 'prompt_rows_computed', 'late_chunk_legs_ms')
    print({k: r[k] for k in keys if r.get(k) is not None})"
