"""The owner thread of a stage: runs its loop, and if the loop dies, says so instead of hanging callers.

Each stage (talker, decoder) owns its state from one thread fed by a command queue. An exception that
escapes the loop (a bug, an out-of-memory error) must not leave requests waiting forever: the thread
records the error (`died`) and calls `on_death`, which the engine uses to fail every request in flight
and to answer health checks unhealthy.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class OwnerThread:
    def __init__(self, name: str, loop: Callable[[], None], on_death: Callable[[BaseException], None] | None):
        self.name = name
        self.died: BaseException | None = None
        self._loop, self._on_death = loop, on_death
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.died is None

    def join(self, timeout: float) -> None:
        self._thread.join(timeout=timeout)

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # noqa: BLE001 -- reported, then the thread ends
            self.died = exc
            log.exception("%s stopped", self.name)
            if self._on_death is not None:
                self._on_death(exc)
