#!/usr/bin/env bash
# Issue "real time under load", closed 64: what a step that a burst of new requests joins spends its time on
# (tools/burst_profile.py), one H200, 1.7B shapes: each RUNNINGxBURST pair of BURSTS submits BURST requests at
# once beside RUNNING streams under torch.profiler. Needs /tmp/site (scripts/gpu_setup.sh). Results in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
OUT=${OUT:-/tmp/bench_out}; mkdir -p "$OUT"
CK=/tmp/ckpt; mkdir -p $CK
demo_checkpoint 1.7b > /dev/null || exit 1
timeout ${T_MAIN:-500} python3 -m tts_engine.tools.bench --demo 1.7b --demo-dir $CK --frames 50 --gpu-memory-utilization 0.3 \
  ${ENGINE_VARIANT:+--engine-variant $ENGINE_VARIANT} --concurrency 1 --requests 4 --warmup 2 \
  --burst-profile ${BURSTS:-48x16,0x64} --json $OUT/burst_profile.json --markdown $OUT/burst_profile.md > $OUT/burst_profile.log 2>&1
echo "== burst profile rc=$?"; grep -E 'Traceback|Error' $OUT/burst_profile.log | tail -5; cat $OUT/burst_profile.md
