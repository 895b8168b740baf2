# source scripts/gpu_env.sh  (GPU machine): our repo + the carried packages ahead of the image's.
export PYTHONPATH=/tmp/site:$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
