#!/usr/bin/env bash
# Issue "real time under load", items 7-8, in ONE device call: single stream on the same random 1.7B-shape
# CustomVoice checkpoint as scripts/gpu_load_bench.sh and the same fixed-length requests (FRAMES frames,
# bench.TEXTS, the checkpoint's first speaker, default sampling), one request at a time:
#   1. the official qwen-tts 0.1.1, bfloat16 on the GPU (no streaming: first audio = whole request)
#   2. faster-qwen3-tts 0.5.4 (CUDA graphs, streaming; one row per chunk size in FAST_CHUNKS)
#   3. ours, in process, closed loop at 1 stream, configured as served (max_num_seqs 64, full start-up warm-up)
# then one table with ratios (peer / ours). Results in $OUT: peers_{qwen,fast,ours}.json, peers.json,
# peers.md, peers.log.
# Needs /tmp/site (our vLLM stack: scripts/gpu_setup.sh with gpu_wheels/p1 and p2 in the two calls before)
# and gpu_wheels/p5/peers.tar.xz in this call's carry (made here by scripts/gpu_pack_peers.sh), which this
# script unpacks into /tmp/peers/{common,qwen,fast}. Each peer runs in its own process with its own
# PYTHONPATH: the official one on our stack's transformers 4.57.3 (/tmp/site), faster-qwen3-tts on its
# own transformers 5.17.0 WITHOUT /tmp/site. Each part is bounded by `timeout`; typical total ~5 min.
# Knobs: FRAMES (50), REQUESTS (4), FAST_CHUNKS (1,8), MAX_SEQS (64), GPU_UTIL (0.3), T_BUILD/T_QWEN/T_FAST/T_OURS
# (timeouts, s). CPU dry run: SHAPE=tiny MAX_SEQS=2 SITE=<folder with .ok> PEERS=<p5 unpacked for the host's
# Python> CKPT_DIR=<folder> PY=<python> (faster-qwen3-tts then runs its code eagerly: bench._faster_without_cuda).
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
source scripts/gpu_env.sh
OUT=${OUT:-/tmp/peers_out}; mkdir -p "$OUT"
LOG=$OUT/peers.log
FR=${FRAMES:-50}; N=${REQUESTS:-4}; CK=${CKPT_DIR:-/tmp/ckpt}; P=${PEERS:-/tmp/peers}; SITE=${SITE:-/tmp/site}
SHAPE=${SHAPE:-1.7b}; PY=${PY:-python3}
say() { echo "== $(date +%T) $*" | tee -a "$LOG"; }
say "start (frames $FR, requests $N)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$LOG"
[ -f $SITE/.ok ] || { say "no /tmp/site: run scripts/gpu_setup.sh with gpu_wheels/p1, then p2, first"; exit 2; }
if [ ! -f $P/.ok ]; then
  mkdir -p $P && xz -dc -T0 gpu_wheels/p5/peers.tar.xz | tar -x -C $P && touch $P/.ok || { say "cannot unpack p5"; exit 2; }
fi
say "peers unpacked: $(ls $P | tr '\n' ' ')"
mkdir -p $CK
[ -f $CK/tts_bench_${SHAPE}_custom_voice/config.json ] || timeout ${T_BUILD:-100} $PY -c "from tts_engine.tools.demo_checkpoint \
import build_demo_checkpoint as b; b('$CK/tts_bench_${SHAPE}_custom_voice', 'custom_voice', shape='$SHAPE', progress=False)" >> "$LOG" 2>&1
say "checkpoint rc=$? $(du -sh $CK/tts_bench_${SHAPE}_custom_voice 2>/dev/null | cut -f1)"
B="-m tts_engine.tools.bench --demo $SHAPE --demo-dir $CK --frames $FR --requests $N --concurrency 1"
show() { grep -E '^\||Traceback|Error|error|loaded in|warm-up|engine started' "$1" | grep -v '^| run' | tail -${2:-12}; }

say "1/3 official qwen-tts 0.1.1, bf16, cuda"
PYTHONPATH=$P/qwen:$P/common:$SITE:$REPO timeout ${T_QWEN:-140} $PY $B --reference-only \
  --json $OUT/peers_qwen.json > $OUT/qwen.log 2>&1
say "official rc=$?"; show $OUT/qwen.log | tee -a "$LOG"

say "2/3 faster-qwen3-tts 0.5.4 (transformers 5.17.0, no /tmp/site), chunks ${FAST_CHUNKS:-1,8}"
PYTHONPATH=$P/fast:$P/common:$REPO timeout ${T_FAST:-130} $PY $B --faster-only --faster-chunks ${FAST_CHUNKS:-1,8} \
  --json $OUT/peers_fast.json > $OUT/fast.log 2>&1
say "faster rc=$?"; show $OUT/fast.log | tee -a "$LOG"

say "3/3 ours, 1 stream"
timeout ${T_OURS:-170} $PY $B --warmup 2 --max-num-seqs ${MAX_SEQS:-64} --gpu-memory-utilization ${GPU_UTIL:-0.3} \
  --json $OUT/peers_ours.json > $OUT/ours.log 2>&1
say "ours rc=$?"; show $OUT/ours.log | tee -a "$LOG"

ls $OUT/peers_*.json > /dev/null 2>&1 && $PY -m tts_engine.tools.bench --combine $OUT/peers_*.json \
  --json $OUT/peers.json --markdown $OUT/peers.md 2>&1 | tee -a "$LOG"
# the three part logs go into peers.log (at most 8 files come back)
for f in qwen fast ours; do
  echo "---- $f.log (tail)" >> "$LOG"
  grep -v 'Initializing\|Loading weights\|flash-attn\|^\*\*\*\|^ *$' $OUT/$f.log 2>/dev/null | tail -60 >> "$LOG"; rm -f $OUT/$f.log
done
say "done"
