#!/usr/bin/env bash
# Run HERE (a machine with pip access): package the two peers of issue 9 items 7-8 for the GPU image
# (python 3.12, torch 2.11.0+cu130, transformers 5.17.0, no network) into ONE xz part under the
# git-ignored gpu_wheels/:   gpu_wheels/p5/peers.tar.xz   (< 55 MiB: it travels beside the repo)
# Unpacked on the GPU by scripts/gpu_peers_bench.sh into three package folders under /tmp/peers:
#   common/  what both peers import and the image lacks: librosa 0.11 and its missing dependencies
#            (audioread, decorator, pooch, platformdirs, soxr), soundfile + cffi + pycparser, the `sox`
#            Python package (qwen_tts imports it at import time; the sox program itself is not needed)
#   qwen/    the official qwen-tts 0.1.1 (it runs on our vLLM stack's transformers 4.57.3 in /tmp/site:
#            PYTHONPATH=/tmp/peers/qwen:/tmp/peers/common:/tmp/site:REPO)
#   fast/    faster-qwen3-tts 0.5.4, qwen-tts-hf 0.1.1.post1 (its `qwen_tts`, ported to transformers 5),
#            transformers 5.17.0, tokenizers 0.23.2, huggingface_hub 1.33.0 (the image's versions, pinned
#            here so an image change cannot move them): PYTHONPATH=/tmp/peers/fast:/tmp/peers/common:REPO,
#            never /tmp/site (whose transformers is 4.57.3).
# Neither peer needs gradio at import (only their `qwen-tts-demo` CLI does); accelerate, onnxruntime,
# einops, torchaudio, numba, scipy, scikit-learn, lazy_loader, msgpack come from the image.
set -euo pipefail
cd "$(dirname "$0")/.."
W=gpu_wheels
B=$W/peers_build
rm -rf $B && mkdir -p $B/whl/common $B/whl/qwen $B/whl/fast $B/site
PLAT=""; for n in 5 12 17 24 27 28 31 34 35; do PLAT="$PLAT --platform manylinux_2_${n}_x86_64"; done
PLAT="$PLAT --platform manylinux2014_x86_64 --platform manylinux1_x86_64"
TAGS="--only-binary=:all: --python-version 3.12 --implementation cp $PLAT"
PIP="python3 -m pip"
[ -x /work/main/.venv/bin/python ] && PIP="/work/main/.venv/bin/python -m pip"
$PIP download -q --no-deps $TAGS -d $B/whl/common librosa==0.11.0 audioread==3.1.0 decorator==5.3.1 pooch==1.9.0 \
  platformdirs==4.14.9 soxr==1.0.0 soundfile==0.14.0 cffi==2.1.1 pycparser==3.12
$PIP wheel -q --no-deps -w $B/whl/common sox==1.5.0      # pure Python, published as a source archive only
$PIP download -q --no-deps $TAGS -d $B/whl/qwen qwen-tts==0.1.1
$PIP download -q --no-deps $TAGS -d $B/whl/fast faster-qwen3-tts==0.5.4 qwen-tts-hf==0.1.1.post1 transformers==5.17.0 \
  tokenizers==0.23.2 huggingface_hub==1.33.0
for part in common qwen fast; do
  $PIP install -q --no-deps --no-index --no-compile --no-warn-script-location $TAGS --target $B/site/$part $B/whl/$part/*.whl
  rm -rf $B/site/$part/bin
done
# what each folder holds, for the log
for part in common qwen fast; do echo "$part: $(ls $B/site/$part | grep -v dist-info | tr '\n' ' ')"; done
rm -rf $W/p5 && mkdir -p $W/p5
tar -C $B/site -cf - common qwen fast | xz -T0 -9 > $W/p5/peers.tar.xz
rm -rf $B
size=$(stat -c %s $W/p5/peers.tar.xz)
echo "gpu_wheels/p5/peers.tar.xz: $size bytes ($((size / 1048576)) MiB)"
[ "$size" -lt $((55 * 1048576)) ] || { echo "too large for one device call beside the repo" >&2; exit 1; }
