#!/usr/bin/env bash
# Run HERE: package the serving stack the GPU image lacks (FastAPI/uvicorn, Gradio + fastrtc + aiortc/av for
# the app and its WebRTC route, soxr, Ray Serve) for the client-side and scale-out runs on the GPU machine.
# Same pins as requirements*.txt (check with .venv/bin/pip freeze); packages the image already holds
# (KINDS.md's list) and those of scripts/gpu_pack.sh are left out. Unpacked by gpu_setup.sh into /tmp/site.
#   gpu_wheels/p3/serve.part00of02, gpu_wheels/p4/serve.part01of02
set -euo pipefail
cd "$(dirname "$0")/.."
W=gpu_wheels/serve
rm -rf $W && mkdir -p $W/dl $W/keep $W/site
PLAT=""; for n in 5 12 17 24 26 27 28 31 34 35; do PLAT="$PLAT --platform manylinux_2_${n}_x86_64"; done
PLAT="$PLAT --platform manylinux2014_x86_64 --platform manylinux1_x86_64"
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp $PLAT -d $W/dl \
  "ray[serve]==2.55.1" fastapi==0.163.2 starlette==0.52.1 uvicorn==0.54.0 python-multipart==0.0.34 soxr==1.0.0 \
  gradio==5.50.0 fastrtc==0.0.34 aiortc==1.16.0 av==18.1.0 pydantic==2.12.3 pydantic_core==2.41.4 websockets==15.0.1 protobuf==6.33.6
# In the GPU image already (KINDS.md) or in the vLLM pack (gpu_pack.sh): not carried twice. protobuf is carried:
# the image's newer one breaks Ray 2.55.1's generated code (Serve controller: FieldDescriptor has no `label`).
HAVE="absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs certifi charset-normalizer
click cloudpickle colorama contourpy cycler filelock fonttools frozenlist fsspec grpcio h11 hf-xet httpcore httpx
huggingface-hub idna jinja2 joblib kiwisolver lazy-loader llvmlite markdown-it-py markupsafe matplotlib mdurl msgpack
multidict networkx numba numpy packaging pandas pillow pip propcache psutil pygments pyparsing
python-dateutil pyyaml regex requests rich safetensors scikit-learn scipy setuptools shellingham six sympy
threadpoolctl tokenizers torch tqdm transformers typer typing-extensions typing-inspect urllib3 uvloop wheel wrapt
yarl zipp ruff pydantic pydantic-core annotated-types typing-inspection openai jiter distro sniffio soundfile cffi
pycparser"
norm() { echo "$1" | tr 'A-Z_.' 'a-z--'; }
for w in $W/dl/*.whl; do
  n=$(norm "$(basename "${w%%-[0-9]*}")"); skip=0
  for x in $HAVE; do [ "$n" = "$x" ] && skip=1 && break; done
  [ $skip = 0 ] && unzip -q -o "$w" -d $W/site
done
# py-spy (a Ray dependency) keeps its binary, as /tmp/site/bin/py-spy: scripts/gpu_profile.sh samples the GIL.
mkdir -p $W/site/bin && mv $W/site/py_spy-*.data/scripts/py-spy $W/site/bin/py-spy && chmod +x $W/site/bin/py-spy
# Unused on the GPU: Ray's Java, RLlib/Tune/Train/Data and dashboard UI; Gradio's SSR node server and sources.
rm -rf $W/site/ray/jars $W/site/ray/rllib $W/site/ray/tune $W/site/ray/train $W/site/ray/data \
  $W/site/ray/dashboard/client $W/site/gradio/templates/node $W/site/gradio/_frontend_code $W/site/py_spy-*.data
tar -C $W/site -cf - . | xz -T0 -6 > $W/serve.tar.xz
rm -rf gpu_wheels/p3 gpu_wheels/p4 && mkdir -p gpu_wheels/p3 gpu_wheels/p4
split -n 2 -d $W/serve.tar.xz $W/serve.part
mv $W/serve.part00 gpu_wheels/p3/serve.part00of02 && mv $W/serve.part01 gpu_wheels/p4/serve.part01of02
rm -rf $W/dl $W/site
ls -la gpu_wheels/p3 gpu_wheels/p4
