"""The app's own life: `/readyz` only after warm-up, a graceful stop on SIGTERM (new work 503, the stream
in flight completes, exit 0, `engine.close()` runs), and no temporary folders left behind.

Its own `app.py --demo` process (the shared live app is stopped by the session, not by a test)."""

from __future__ import annotations

import signal
import threading
import time

import httpx

from tests.conftest import free_port, start_app

SPEECH = {"input": "A stream that must finish after the signal.", "voice": "sample", "response_format": "pcm",
          "stream": True, "max_new_tokens": 60}


def test_readiness_graceful_stop_and_clean_exit(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc, log = start_app(tmp_path, port, "--drain-s", "60")
    seen: list[tuple[int, int]] = []      # (healthz, readyz) while starting
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, "app exited during start-up:\n" + log.read_text()[-3000:]
            assert time.monotonic() < deadline, "app never became ready:\n" + log.read_text()[-3000:]
            try:
                state = (httpx.get(url + "/healthz", timeout=2).status_code,
                         httpx.get(url + "/readyz", timeout=2).status_code)
            except httpx.HTTPError:
                state = None
            if state is not None:
                seen.append(state)
                if state[1] == 200:
                    break
            time.sleep(0.02)   # polling the server's state while it starts
        assert (200, 503) in seen, f"/readyz was never 503 while live but warming up: {seen[:5]}"

        received: dict[str, object] = {}
        first_bytes = threading.Event()

        def stream() -> None:
            try:
                with httpx.stream("POST", url + "/v1/audio/speech", json=SPEECH, timeout=120) as r:
                    received["status"] = r.status_code
                    data = b""
                    for part in r.iter_bytes():
                        data += part
                        first_bytes.set()
                    received["bytes"] = len(data)
            except Exception as exc:  # noqa: BLE001 -- asserted below
                received["error"] = exc
                first_bytes.set()

        reader = threading.Thread(target=stream)
        reader.start()
        assert first_bytes.wait(120), "the stream never started"
        proc.send_signal(signal.SIGTERM)
        refused = None
        for _ in range(100):
            try:
                refused = httpx.post(url + "/v1/audio/speech", json={"input": "Too late.", "voice": "sample"},
                                     timeout=10)
            except httpx.HTTPError:
                refused = None
            if refused is not None and refused.status_code == 503:
                break
            time.sleep(0.05)   # until the signal has been handled
        assert refused is not None and refused.status_code == 503, refused and refused.text
        assert refused.json()["error"]["code"] == "engine_unavailable" and refused.headers["retry-after"]
        assert httpx.get(url + "/readyz", timeout=5).status_code == 503
        reader.join(timeout=120)
        assert "error" not in received, received
        assert received["status"] == 200 and received["bytes"] > 0 and received["bytes"] % 2 == 0
        assert proc.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    text = log.read_text()
    assert "draining" in text and "stopped" in text, text[-3000:]
    # ours: only the reusable demo checkpoint (gradio's upload cache and torch's compile cache have fixed names)
    left = sorted(p.name for p in (tmp_path / "tmp").iterdir() if p.name.startswith("tts_"))
    assert left == ["tts_demo"], f"temporary folders left behind: {left}"


def test_a_taken_port_is_a_clear_error_before_the_engine_loads(tmp_path):
    """The app binds its port first: another program on it stops the start at once with a message that names the
    address, before a minute of engine loading (and the engine's own free-port picks cannot take it meanwhile)."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc, log = start_app(tmp_path, port)
        try:
            code = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    text = log.read_text()
    assert code != 0, text[-2000:]
    assert f"cannot listen on 127.0.0.1:{port}" in text and "Address already in use" in text, text[-2000:]
    assert "demo model (random weights)" not in text, "the engine's checkpoint was prepared before the port was checked"
