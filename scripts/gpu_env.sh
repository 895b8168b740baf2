# source scripts/gpu_env.sh  (GPU machine): our repo + the carried packages ahead of the image's.
export PYTHONPATH=/tmp/site:$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# demo_checkpoint SHAPE [ROOT]: the random CustomVoice checkpoint in the released SHAPE (1.7b, 0.6b; tiny for a
# dry run) under ROOT (/tmp/ckpt), built once per machine; prints its folder (what `bench --demo SHAPE
# --demo-dir ROOT` reads too).
demo_checkpoint() {
  local shape=${1:-1.7b} root=${2:-/tmp/ckpt}
  local folder=$root/tts_bench_${shape}_custom_voice
  mkdir -p "$root"
  [ -f "$folder/config.json" ] || python3 -c "from tts_engine.tools.demo_checkpoint import build_demo_checkpoint as b
b('$folder', 'custom_voice', shape='$shape', progress=False)" >&2 || return 1
  echo "$folder"
}
