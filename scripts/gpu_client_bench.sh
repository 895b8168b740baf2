#!/usr/bin/env bash
# Issue 9 item 6, one device call: the app (app.py, 1.7B shapes, configs/qwen3_tts.yaml) on one GPU, measured
# where the bytes arrive: `bench --url` (concurrent HTTP streaming clients of /v1/audio/speech, raw PCM) and
# `bench --webrtc` (aiortc peers + /v1/realtime/say, first audible 20 ms frame), beside the in-process
# numbers of BENCHMARKS.md "Under load". Needs the site and serve sets (scripts/gpu_setup.sh serve).
# Knobs: URL_RUNS (1; 0: WebRTC only), SHAPE (1.7b), CONFIG (configs/qwen3_tts.yaml), APP_GPU (0), URL_CLOSED (1,16,64), URL_POISSON (16,20), WEBRTC_LEVELS (1,4,16), FRAMES (50).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
OUT=${OUT:-/tmp/bench_out}; mkdir -p "$OUT"
M=$(demo_checkpoint ${SHAPE:-1.7b}) || exit 1
PORT=7860; URL=http://127.0.0.1:$PORT
CUDA_VISIBLE_DEVICES=${APP_GPU:-0} python3 app.py --model $M --config ${CONFIG:-configs/qwen3_tts.yaml} --port $PORT \
  --voices /tmp/app_voices > $OUT/app.log 2>&1 &
APP=$!
t0=$(date +%s)
ready() { python3 -c "import urllib.request; urllib.request.urlopen('$URL/readyz', timeout=2)" 2>/dev/null; }
until ready; do
  kill -0 $APP 2>/dev/null || { echo "app died"; tail -40 $OUT/app.log; exit 1; }
  [ $(( $(date +%s) - t0 )) -gt ${T_START:-300} ] && { echo "app not ready"; tail -20 $OUT/app.log; kill $APP; exit 1; }
  sleep 2
done
echo "app ready in $(( $(date +%s) - t0 )) s"; grep -E "warm-up|captured|ready" $OUT/app.log | tail -5
B="python3 -m tts_engine.tools.bench --voice ${VOICE:-ryan} --frames ${FRAMES:-50}"
[ "${URL_RUNS:-1}" = 1 ] && {
timeout ${T_URL:-200} $B --url $URL --concurrency ${URL_CLOSED:-1,16,64} --label "client side: HTTP, closed loop" \
  --json $OUT/url_closed.json --markdown $OUT/url_closed.md > $OUT/url_closed.log 2>&1; echo "== url closed rc=$?"
timeout ${T_URL:-200} $B --url $URL --arrival poisson --concurrency ${URL_POISSON:-16,20} --requests 40 \
  --label "client side: HTTP, Poisson" --json $OUT/url_poisson.json --markdown $OUT/url_poisson.md \
  > $OUT/url_poisson.log 2>&1; echo "== url poisson rc=$?"
}
python3 -m pip list 2>/dev/null | grep -i -E "^(aiortc|aioice|av|fastrtc|gradio) " | tr '\n' ' '; echo
# one short session first: on failure its error says whether frames arrived and what the server's clause stats say
timeout 60 $B --webrtc $URL --concurrency 1 --requests 1 --webrtc-timeout 15 --label "client side: WebRTC probe" \
  --json $OUT/webrtc_probe.json > $OUT/webrtc_probe.log 2>&1; echo "== webrtc probe rc=$?"
grep -E '"error_messages"' $OUT/webrtc_probe.log | head -2 | cut -c1-1500
timeout ${T_WEBRTC:-200} $B --webrtc $URL --concurrency ${WEBRTC_LEVELS:-1,4,16} --label "client side: WebRTC" \
  --json $OUT/webrtc.json --markdown $OUT/webrtc.md > $OUT/webrtc.log 2>&1; echo "== webrtc rc=$?"
cat $OUT/url_closed.md $OUT/url_poisson.md $OUT/webrtc.md 2>/dev/null
grep -E "Traceback|Error" $OUT/*.log | head -10
kill -TERM $APP; wait $APP; echo "app exit $?"
