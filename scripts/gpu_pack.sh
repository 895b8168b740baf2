#!/usr/bin/env bash
# Run HERE (a machine with pip access): package vLLM 0.23.0 and the Python packages the GPU image lacks
# into two ~59 MiB parts that fit the device tool's 64 MiB-per-call transfer limit.
#   gpu_wheels/p1/site.part00of02, gpu_wheels/p2/site.part01of02   (gpu_wheels/ is git-ignored)
# The GPU image has python 3.12, torch 2.11.0+cu130, transformers 5.x and no vLLM; see BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
W=gpu_wheels
mkdir -p $W/vllm $W/deps
PLAT=""; for n in 5 12 17 24 27 28 31 34 35; do PLAT="$PLAT --platform manylinux_2_${n}_x86_64"; done
PLAT="$PLAT --platform manylinux2014_x86_64 --platform manylinux1_x86_64"
DL="python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLAT"
$DL -d $W/vllm vllm==0.23.0
# Imported when our engine starts (found by running it with only the image's packages visible);
# transformers/tokenizers/huggingface_hub replace the image's newer versions.
$DL -d $W/deps transformers==4.57.3 tokenizers==0.22.2 huggingface_hub==0.36.2 pydantic==2.12.3 \
  pydantic_core==2.41.4 annotated-types==0.8.0 typing-inspection==0.4.5 cbor2==6.3.0 pyzmq==27.3.0 gguf==0.19.0 \
  msgspec==0.23.0 openai-harmony==0.0.8 openai==3.57.0 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 \
  jiter==0.19.0 distro sniffio==1.3.1 pybase64==1.5.1 cachetools==8.0.2 xgrammar==0.2.9 apache-tvm-ffi==0.1.15.post2 \
  llguidance==1.7.6 soundfile==0.14.0 cffi==2.1.1 pycparser==3.12 blake3==1.0.11 depyf==0.20.0 astor==0.8.1
rm -rf $W/site && mkdir $W/site
for w in $W/deps/*.whl $W/vllm/*.whl; do unzip -q -o "$w" -d $W/site; done
# Not needed on an H200 (FA3 is used; MoE kernels, the Rust router and other Pythons' DeepGEMM are unused).
rm -f $W/site/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so $W/site/vllm/_moe_C.abi3.so $W/site/vllm/vllm-rs \
  $W/site/vllm/third_party/deep_gemm/_C.cpython-3{10,11,13,14}-x86_64-linux-gnu.so
rm -rf $W/site/vllm/entrypoints/serve/instrumentator/static
tar -C $W/site -cf - . | xz -T0 -6 > $W/site.tar.xz
rm -rf $W/p1 $W/p2 && mkdir $W/p1 $W/p2
split -n 2 -d $W/site.tar.xz $W/site.part
mv $W/site.part00 $W/p1/site.part00of02 && mv $W/site.part01 $W/p2/site.part01of02
ls -la $W/p1 $W/p2
