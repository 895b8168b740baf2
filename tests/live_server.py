"""Run an ASGI app on uvicorn in a thread on a free loopback port (for tests that need a real socket)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn


@contextmanager
def serve_in_thread(app, name: str = "test-server") -> Iterator[str]:
    """Yields the base URL (http://127.0.0.1:PORT); stops the server on exit."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, name=name, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive(), "uvicorn exited during start-up"
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)   # waiting for the server socket, not for a result
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        assert not thread.is_alive(), "uvicorn did not shut down"


def spy_aborts(engine, monkeypatch) -> list[str]:
    """Request ids the engine is asked to abort from now on (for the rest of the test)."""
    seen: list[str] = []
    original = engine.abort

    def spy(request_id):
        seen.append(request_id)
        original(request_id)

    monkeypatch.setattr(engine, "abort", spy)
    return seen
