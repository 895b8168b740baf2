#!/usr/bin/env bash
# Issue "real time under load" in one device call (BENCHMARKS.md, section "Under load"): 1.7B shapes,
# the first Poisson level right after start-up ("cold") and warm, then closed loop 1..128 streams, the
# component breakdown; then the same cold level with only the old one-request warm-up (the variant that
# switches the full start-up warm-up off; SINGLE=0 skips it). Knobs: VARIANTS (default), VARIANT_LEVELS (1,16),
# CLOSED (1,16,64,128), FRAMES (50), CONCURRENCY (16,1,16,20: Poisson req/s, the first one cold), ENGINE_VARIANT
# (e.g. sync-scheduling: an engine started with that optimization off; its files get the name as suffix),
# KERNEL_PROFILE (3: one-stream requests under torch.profiler at the end, 0: none), DEMO_TYPE (custom_voice; base: a
# cloned voice, its speaker vector only, the text fed a step at a time; VOICE_VECTOR_SEED: a random vector, no librosa
# needed). Needs /tmp/site
# (scripts/gpu_setup.sh). Results in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
OUT=${OUT:-/tmp/bench_out}; mkdir -p "$OUT"
CK=/tmp/ckpt; mkdir -p $CK
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
demo_checkpoint 1.7b > /dev/null || exit 1
B="python3 -m tts_engine.tools.bench --demo 1.7b --demo-type ${DEMO_TYPE:-custom_voice} ${VOICE_VECTOR_SEED:+--voice-vector-seed $VOICE_VECTOR_SEED} --demo-dir $CK --frames ${FRAMES:-50} --gpu-memory-utilization ${GPU_UTIL:-0.3}"
EV=${ENGINE_VARIANT:-}; [ -n "$EV" ] && B="$B --engine-variant $EV"
SUF=${EV:+_$EV}
# VARIANTS: each switches one optimization off in the running engine, at VARIANT_LEVELS and the closed levels
timeout ${T_MAIN:-540} $B --cold --warmup 2 --arrival poisson --concurrency ${CONCURRENCY:-16,1,16,20} --requests 40 \
  --closed-levels ${CLOSED:-1,16,64,128} --breakdown --kernel-profile ${KERNEL_PROFILE:-3} --label "load: full start-up warm-up" \
  --variants ${VARIANTS:-default} --variant-levels ${VARIANT_LEVELS:-1,16} \
  --json $OUT/load_full$SUF.json --markdown $OUT/load_full$SUF.md > $OUT/load_full$SUF.log 2>&1
echo "== full rc=$?"; grep -E '^\||frames, .* kernels|Traceback|Error|warm-up' $OUT/load_full$SUF.log | tail -60
[ "${SINGLE:-1}" = 1 ] || exit 0
timeout ${T_VARIANT:-240} $B --cold --warmup 0 --startup-warmup single --arrival poisson --concurrency 16 --requests 40 \
  --label "load: one-request start-up warm-up (variant)" \
  --json $OUT/load_single$SUF.json --markdown $OUT/load_single$SUF.md > $OUT/load_single$SUF.log 2>&1
echo "== single rc=$?"; grep -E '^\||Traceback|Error|warm-up' $OUT/load_single$SUF.log | tail -12
