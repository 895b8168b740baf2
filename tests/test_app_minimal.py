"""`app.py --demo` starts offline (tiny random model built locally) and synthesizes through its UI API."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import soundfile as sf

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_demo_app_starts_and_speaks(tmp_path, reference_clip):
    port = _free_port()
    log = open(tmp_path / "app.log", "w")
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"}
    proc = subprocess.Popen([sys.executable, "app.py", "--demo", "--port", str(port)], cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT, env=env)
    try:
        from gradio_client import Client, handle_file
        deadline = time.monotonic() + 400
        client = None
        while client is None:
            assert proc.poll() is None, (tmp_path / "app.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "app did not come up"
            try:
                client = Client(f"http://127.0.0.1:{port}/", verbose=False)
            except Exception:
                time.sleep(2)   # polling for the server socket, not standing in for a result
        audio_path, info = client.predict("Hello from the demo.", "english", "", "", handle_file(str(reference_clip)),
                                          "", True, api_name="/speak")
        wav, sr = sf.read(audio_path)
        assert sr == 24000 and len(wav) >= 1920 and "frames" in info
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()
