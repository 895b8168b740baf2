"""Shared fixtures: tiny official-format checkpoints and a real speech clip."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.checkpoints.tiny_qwen3_tts import write_tiny_checkpoint

# Ray started by a test (tests/test_ray_serve.py) stays on this machine: with Ray's single-machine switch the
# node address is 127.0.0.1 and every Ray server binds to it; without it Ray replaces 127.0.0.1 by the
# machine's address and its gRPC servers listen on all interfaces. Read when Ray is imported, hence here.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

# Small KV cache and context: tiny models, 2 cores. Engines are started once per test module.
ENGINE_OPTIONS = dict(max_num_seqs=8, max_model_len=512, kv_cache_gib=0.25)


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """Base 0.6B-like; CustomVoice and VoiceDesign 1.7B-like (code predictor behind a projection)."""
    root = tmp_path_factory.mktemp("checkpoints")
    return {
        "base": write_tiny_checkpoint(root / "base", "base", "0b6", seed=1),
        "custom_voice": write_tiny_checkpoint(root / "custom_voice", "custom_voice", "1b7", seed=2),
        "voice_design": write_tiny_checkpoint(root / "voice_design", "voice_design", "1b7", seed=3),
    }


@pytest.fixture(scope="session")
def reference_clip(tmp_path_factory) -> Path:
    """A real English utterance (espeak-ng, 22.05 kHz): the voice-cloning reference."""
    if shutil.which("espeak-ng") is None:
        pytest.fail("espeak-ng is required (apt-get install espeak-ng); .ci/run installs it")
    path = tmp_path_factory.mktemp("clips") / "reference.wav"
    subprocess.run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", str(path),
                    "The quick brown fox jumps over the lazy dog."], check=True)
    return path


REFERENCE_TEXT = "The quick brown fox jumps over the lazy dog."


ROOT = Path(__file__).resolve().parents[1]
LIVE_APP_SESSIONS = 3       # WebRTC agent sessions the live app accepts at once
LIVE_APP_CONNECT_TIMEOUT_S = 6   # an answered session must connect within this (fastrtc's own limit: 30 s)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def live_app(tmp_path_factory):
    """The real app (`app.py --demo`: tiny random Base model, sample voice) on a free port, shared by the
    WebRTC and browser tests. Yields its base URL."""
    port = free_port()
    work = tmp_path_factory.mktemp("live_app")
    log_path = work / "app.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [sys.executable, "app.py", "--demo", "--port", str(port), "--voices", str(work / "voices"),
         "--config", str(ROOT / "tests" / "configs" / "app_tiny.yaml"), "--max-sessions", str(LIVE_APP_SESSIONS),
         "--session-connect-timeout-s", str(LIVE_APP_CONNECT_TIMEOUT_S)],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 480
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail("app exited during start-up:\n" + log_path.read_text()[-4000:])
            if time.monotonic() > deadline:
                pytest.fail("app did not come up in 480 s:\n" + log_path.read_text()[-4000:])
            try:
                if httpx.get(url + "/readyz", timeout=2).status_code == 200:   # warmed up
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)   # polling for the server socket
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def start_app(work: Path, port: int, *args: str) -> tuple[subprocess.Popen, Path]:
    """Start `app.py --demo` (tests/configs/app_tiny.yaml) in `work` with its own TMPDIR; returns the process
    and its log file. For tests that stop or measure a process of their own."""
    temp = work / "tmp"
    temp.mkdir(parents=True, exist_ok=True)
    log = work / "app.log"
    proc = subprocess.Popen(
        [sys.executable, "app.py", "--demo", "--port", str(port), "--voices", str(work / "voices"),
         "--config", str(ROOT / "tests" / "configs" / "app_tiny.yaml"), *args],
        cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT,
        env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "TMPDIR": str(temp)})
    return proc, log


def wait_ready(proc: subprocess.Popen, url: str, log: Path, limit_s: float = 300) -> None:
    deadline = time.monotonic() + limit_s
    while True:
        if proc.poll() is not None:
            pytest.fail("app exited during start-up:\n" + log.read_text()[-4000:])
        if time.monotonic() > deadline:
            pytest.fail(f"app did not become ready in {limit_s} s:\n" + log.read_text()[-4000:])
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)   # polling for readiness
