"""Admission: one thread takes every submission that is waiting and starts them together.

Why one thread and not one executor thread per request: a burst (64 streams starting at once) had each prompt
built on its own thread of the asyncio default executor, about 20 threads taking turns under the GIL, each
prompt with its own read-back of the prefill, queued on the builder's stream behind the others' (closed 64 on
the H200, p95: 57-80 ms waiting for a thread, then 39 ms building). Taken together, a burst's prompts are
built in one pass with one read-back (`PromptBuilder.build_many`) and reach Stage 0 in one command drain, so
they can join one step. A lone request is taken at once, as before.

Threads: `submit` and `close` from any thread; only the `tts-admission` thread calls `start_many`.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from tts_engine.stages.owner_thread import OwnerThread


@dataclass
class Submission:
    """A request waiting to be started; `future` gets what `start_many` sets (a route, or the error)."""

    request: Any
    deliver: Callable[[Any], None]
    request_id: str | None
    abandoned: threading.Event | None = None   # set by a caller that stopped waiting: start, then abort
    future: Future = field(default_factory=Future)


class Admission:
    def __init__(self, start_many: Callable[[list[Submission]], None], closed_error: Callable[[], Exception],
                 on_death: Callable[[BaseException], None] | None = None):
        """`start_many(batch)` must settle every submission's future (the thread settles those it leaves);
        `closed_error()` is what submissions get once `close` has been called."""
        self._start_many = start_many
        self._closed_error = closed_error
        self.max_batch: int | None = None     # None: all that wait; 1: one at a time (bench `prompts-one-by-one`)
        self._inbox: queue.Queue = queue.Queue()
        self._closed = threading.Event()
        self._thread = OwnerThread("tts-admission", self._run, on_death)

    def submit(self, request, deliver: Callable[[Any], None], request_id: str | None = None,
               abandoned: threading.Event | None = None) -> Future:
        submission = Submission(request, deliver, request_id, abandoned)
        if self._closed.is_set():
            submission.future.set_exception(self._closed_error())
        else:
            self._inbox.put(submission)
        return submission.future

    def barrier(self, timeout: float = 30.0) -> None:
        """Return once every submission made before this call has been started (or has failed)."""
        reached = threading.Event()
        self._inbox.put(reached)
        if not self._closed.is_set() and not reached.wait(timeout):
            raise TimeoutError("admission did not reach the barrier")

    def close(self) -> None:
        """Stop the thread; submissions it has not taken fail with `closed_error()` (none waits forever)."""
        self._closed.set()
        self._inbox.put(None)
        self._thread.join(timeout=30)
        self._fail(self._drain())

    @property
    def alive(self) -> bool:
        return self._thread.alive

    # ---- the admission thread --------------------------------------------------------------------
    def _run(self) -> None:
        while not self._closed.is_set():
            first = self._inbox.get()
            if first is None:
                continue
            batch = [first] + self._drain(self.max_batch - 1 if self.max_batch else None)
            barriers = [b for b in batch if isinstance(b, threading.Event)]
            taken = [s for s in batch if isinstance(s, Submission)
                     and s.future.set_running_or_notify_cancel()]     # a caller that cancelled is skipped
            if taken:
                self._start(taken)
            for reached in barriers:
                reached.set()

    def _start(self, taken: list[Submission]) -> None:
        try:
            self._start_many(taken)
        except Exception as exc:  # a bug in one batch fails that batch, not every later request
            for s in taken:
                if not s.future.done():
                    s.future.set_exception(exc)
        for s in taken:
            if not s.future.done():
                s.future.set_exception(RuntimeError("admission left the request unsettled"))

    def _drain(self, limit: int | None = None) -> list:
        """What waits in the inbox (up to `limit` submissions; barriers do not count), sentinels dropped."""
        out: list = []
        while limit is None or sum(isinstance(s, Submission) for s in out) < limit:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                out.append(item)
        return out

    def _fail(self, items: list) -> None:
        for item in items:
            if isinstance(item, threading.Event):
                item.set()
            elif item.future.set_running_or_notify_cancel():
                item.future.set_exception(self._closed_error())
