#!/usr/bin/env bash
# Issue "real time under load": who holds the interpreter at LEVEL closed-loop streams (default 64) on the
# GPU. The bench runs in the background (1.7B shapes, 50-frame requests, enough of them for ~40 s); once
# its own warm-up is done, py-spy samples the thread holding the GIL for DURATION seconds without pausing
# the process, and tools/gil_profile.py says which thread and which of our functions held it, and how busy
# the GIL was. Needs /tmp/site with the serve set (py-spy comes with it: scripts/gpu_setup.sh serve).
# Knobs: SHAPE (1.7b; tiny for a dry run on a CPU), LEVEL (64), REQUESTS (1280), DURATION (20), RATE (250). Results in $OUT: gil.txt, gil.md, gil.json,
# profiled.{log,json} (the level's own row, measured while sampled).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
OUT=${OUT:-/tmp/bench_out}; mkdir -p "$OUT"
PYSPY=/tmp/site/bin/py-spy; [ -x $PYSPY ] || PYSPY=$(command -v py-spy) || { echo "no py-spy: gpu_setup.sh serve"; exit 1; }
SHAPE=${SHAPE:-1.7b}; demo_checkpoint $SHAPE > /dev/null || exit 1
LEVEL=${LEVEL:-64}; DURATION=${DURATION:-20}; RATE=${RATE:-250}
python3 -m tts_engine.tools.bench --demo $SHAPE --demo-dir /tmp/ckpt --frames 50 --gpu-memory-utilization 0.3 \
  --warmup 2 --concurrency $LEVEL --requests ${REQUESTS:-1280} --label "closed $LEVEL under py-spy" \
  --json $OUT/profiled.json > $OUT/profiled.log 2>&1 &
BENCH=$!
t0=$(date +%s)
until grep -q "then 1" $OUT/profiled.log; do          # the bench's warm-up line: the level starts next
  kill -0 $BENCH 2>/dev/null || { echo "bench died"; tail -20 $OUT/profiled.log; exit 1; }
  [ $(( $(date +%s) - t0 )) -gt ${T_START:-300} ] && { echo "bench not warm"; kill $BENCH; exit 1; }
  sleep 1
done
sleep 5                                               # past the level's first burst
$PYSPY record --pid $BENCH --gil --threads --nonblocking --rate $RATE --duration $DURATION --format raw \
  -o $OUT/gil.txt > $OUT/pyspy.log 2>&1; echo "== py-spy rc=$? $(tail -1 $OUT/pyspy.log)"
python3 -m tts_engine.tools.gil_profile $OUT/gil.txt --rate $RATE --duration $DURATION \
  --json $OUT/gil.json --markdown $OUT/gil.md
wait $BENCH; echo "== bench rc=$?"
grep -E '^\|' $OUT/profiled.log | tail -3
