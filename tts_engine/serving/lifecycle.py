"""Readiness and graceful stop: what `/readyz` answers and whether new requests are taken.

    starting --(warm-up done)--> ready --(SIGTERM)--> draining --(streams done or deadline)--> stopped

Only `ready` admits new synthesis work; in any other state new requests get 503 `engine_unavailable`
with Retry-After, so a load balancer (or a Hugging Face Space) sends them elsewhere while streams
already running finish. `/healthz` is the liveness probe: it asks the engine whether its stage
threads still run, whatever the state here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

STARTING, READY, DRAINING, STOPPED = "starting", "ready", "draining", "stopped"


class Lifecycle:
    def __init__(self, state: str = STARTING):
        self.state = state
        self._changed = threading.Condition()

    @property
    def ready(self) -> bool:
        return self.state == READY

    def set(self, state: str) -> None:
        with self._changed:
            self.state = state
            self._changed.notify_all()

    def why_not_ready(self) -> str:
        return {STARTING: "the server is starting (warming up the engine); retry shortly",
                DRAINING: "the server is shutting down; retry on another replica or shortly",
                STOPPED: "the server has stopped"}.get(self.state, "the server is not ready")

    def drain(self, busy: Callable[[], int], deadline_s: float, poll_s: float = 0.05) -> int:
        """Stop admitting, then wait until `busy()` reaches 0 or `deadline_s` passes; returns what is
        still running (those streams are cut when the process exits)."""
        self.set(DRAINING)
        end = time.monotonic() + deadline_s
        while (left := busy()) and time.monotonic() < end:
            time.sleep(poll_s)
        self.set(STOPPED)
        return left
