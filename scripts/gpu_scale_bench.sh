#!/usr/bin/env bash
# Issue 10 items 6-7 on two GPUs (device kind nvidia-h200-x2), one device call. Needs the site and serve sets
# (scripts/gpu_setup.sh serve). 1.7B shapes, configs/qwen3_tts.yaml per replica, 50-frame requests.
#  1. Ray Serve, the way configs/serve.yaml runs it (one engine replica per GPU), with 2 replicas and then 1
#     (the same application resized), under the same closed-loop HTTP load (`bench --url` through Serve's
#     proxy): 64 and 128 streams.
#  2. One engine with both stages on GPU 0 vs Stage 1 on GPU 1 (configs/qwen3_tts_split_gpus.yaml), in process,
#     16 and 64 streams (scripts/gpu_split_bench.sh).
# Knobs: SCALE_LEVELS ("64 128"), PER_STREAM (4 requests per stream), CLIENTS (4 client processes), REPLICAS
# ("2 1": resized in this order), SPLIT (1), T_READY (420).
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
# One application, resized: two replicas start once (~150 s, in parallel), are measured, then one is stopped
# (scripts/serve_scale.py: a config deploy, so the other stays up, warm) and measured alone.
cat > /tmp/serve.yaml <<CFG
proxy_location: HeadOnly
http_options: {host: 127.0.0.1, port: 8000}
applications:
  - name: tts
    route_prefix: /
    import_path: tts_engine.serving.ray_app:build
    args: {model: $M, config: configs/qwen3_tts.yaml, voices: /tmp/serve_voices}
    deployments:
      - name: TTSReplica
        num_replicas: 2
        ray_actor_options: {num_gpus: 1, num_cpus: 8}
CFG
for n in ${REPLICAS:-2 1}; do
  python3 scripts/serve_scale.py /tmp/serve.yaml $n --timeout ${T_READY:-420} > $OUT/serve_scale_$n.log 2>&1 \
    || { echo "== $n replica(s) not running:"; grep -vE '^\s*$' $OUT/serve_scale_$n.log | tail -8; break; }
  echo "== $(tail -1 $OUT/serve_scale_$n.log)"
  grep -h "ready:" /tmp/ray/session_latest/logs/serve/*.log 2>/dev/null | tail -2
  LEVELS_LIST=${SCALE_LEVELS:-64 128}
  for level in ${LEVELS_LIST//,/ }; do   # one level per bench run: each stream makes PER_STREAM requests
    timeout ${T_LOAD:-150} python3 -m tts_engine.tools.bench --url http://127.0.0.1:8000 --voice ryan --frames 50 \
      --concurrency $level --requests $(( level * ${PER_STREAM:-4} )) --client-processes ${CLIENTS:-4} \
      --label "Ray Serve, $n replica(s)" \
      --json $OUT/serve_${n}rep_$level.json --markdown $OUT/serve_${n}rep_$level.md > $OUT/serve_${n}rep_$level.log 2>&1
    echo "== bench $n replica(s), $level streams rc=$?"; grep -E '^\|' $OUT/serve_${n}rep_$level.md | tail -1
  done
done
python3 -m ray.scripts.scripts stop --force > /dev/null 2>&1
unset RAY_ADDRESS
[ "${SPLIT:-1}" = 1 ] && LEVELS=${SPLIT_LEVELS:-16,64} bash scripts/gpu_split_bench.sh
