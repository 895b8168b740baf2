#!/usr/bin/env bash
# Issue 10 items 6-7 on two GPUs (device kind nvidia-h200-x2), one device call. Needs the site and serve sets
# (scripts/gpu_setup.sh serve). 1.7B shapes, configs/qwen3_tts.yaml per replica, 50-frame requests.
#  1. Ray Serve, the way configs/serve.yaml runs it (one engine replica per GPU, `serve run`), with 1 replica
#     and then 2, under the same closed-loop HTTP load (`bench --url` through Serve's proxy): 64 and 128 streams.
#  2. One engine with both stages on GPU 0 vs Stage 1 on GPU 1 (configs/qwen3_tts_split_gpus.yaml), in process,
#     16 and 64 streams (scripts/gpu_split_bench.sh).
# Knobs: SCALE_LEVELS ("64 128"), PER_STREAM (4 requests per stream), CLIENTS (4 client processes), REPLICAS
# ("1 2"), SPLIT (1), T_READY (420).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
OUT=${OUT:-/tmp/bench_out}; mkdir -p "$OUT"
CK=/tmp/ckpt; mkdir -p $CK; M=$CK/tts_bench_1.7b_custom_voice
nvidia-smi -L
demo_checkpoint 1.7b > /dev/null || exit 1
export RAY_USAGE_STATS_ENABLED=0 RAY_ADDRESS=127.0.0.1:6379
python3 -m ray.scripts.scripts start --head --port 6379 --include-dashboard=false --num-gpus 2 > $OUT/ray_start.log 2>&1 \
  || { echo "ray start failed"; tail -20 $OUT/ray_start.log; }
for n in ${REPLICAS:-1 2}; do
  cat > /tmp/serve_$n.yaml <<CFG
proxy_location: HeadOnly
http_options: {host: 127.0.0.1, port: 8000}
applications:
  - name: tts
    route_prefix: /
    import_path: tts_engine.serving.ray_app:build
    args: {model: $M, config: configs/qwen3_tts.yaml, voices: /tmp/serve_voices}
    deployments:
      - name: TTSReplica
        num_replicas: $n
        ray_actor_options: {num_gpus: 1, num_cpus: 8}
CFG
  python3 -m ray.serve.scripts run /tmp/serve_$n.yaml > $OUT/serve_$n.log 2>&1 &
  SERVE=$!; t0=$(date +%s)
  # ready when every replica logged its "ready:" line (after its warm-up) and the proxy answers
  until [ "$(grep -c 'ray_app: replica .* ready:' $OUT/serve_$n.log)" -ge $n ] \
        && python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/v1/audio/voices', timeout=3)" 2>/dev/null; do
    kill -0 $SERVE 2>/dev/null || { echo "serve run exited"; break; }
    [ $(( $(date +%s) - t0 )) -gt ${T_READY:-420} ] && { echo "not deployed in time"; break; }
    sleep 3
  done
  echo "== $n replica(s) deployed after $(( $(date +%s) - t0 )) s"; grep -E "ready:|Error|Traceback" $OUT/serve_$n.log | tail -5
  LEVELS_LIST=${SCALE_LEVELS:-64 128}
  for level in ${LEVELS_LIST//,/ }; do   # one level per bench run: each stream makes PER_STREAM requests
    timeout ${T_LOAD:-150} python3 -m tts_engine.tools.bench --url http://127.0.0.1:8000 --voice ryan --frames 50 \
      --concurrency $level --requests $(( level * ${PER_STREAM:-4} )) --client-processes ${CLIENTS:-4} \
      --label "Ray Serve, $n replica(s)" \
      --json $OUT/serve_${n}rep_$level.json --markdown $OUT/serve_${n}rep_$level.md > $OUT/serve_${n}rep_$level.log 2>&1
    echo "== bench $n replica(s), $level streams rc=$?"; grep -E '^\|' $OUT/serve_${n}rep_$level.md | tail -1
  done
  kill -INT $SERVE; wait $SERVE 2>/dev/null   # serve run shuts its application down on SIGINT
done
python3 -m ray.scripts.scripts stop --force > /dev/null 2>&1
unset RAY_ADDRESS
[ "${SPLIT:-1}" = 1 ] && LEVELS=${SPLIT_LEVELS:-16,64} bash scripts/gpu_split_bench.sh
