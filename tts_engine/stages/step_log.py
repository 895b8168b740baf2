"""How long Stage 0's steps take, and which steps a new request joined: what makes a frame's p95 at 64
streams four times its median (BENCHMARKS "fourth pass")? A joining request's prefill rides in a decode
step (vLLM's chunked prefill), so its cost shows as a longer step for every stream in the batch.

With vLLM's async scheduling a `step()` call launches step t+1 and waits for step t, so a prefill
scheduled in call k is paid for in call k or k+1: a step counts as "joined" when a request was added
before it or before the call before it. The log is bounded and read by the bench between levels
(`tools.bench.summarize_steps`); the stage thread only appends (a deque append is atomic), so recording
costs no lock and no GPU sync.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class StepRecord:
    seconds: float      # wall time of one `engine.step()` call
    joined: bool        # a request was added before this call or the one before it


class StepLog:
    def __init__(self, capacity: int = 20_000):
        self._records: deque[StepRecord] = deque(maxlen=capacity)
        self._added_before: tuple[bool, bool] = (False, False)   # (before this call, before the previous one)

    def request_added(self) -> None:
        self._added_before = (True, self._added_before[1])

    def record(self, seconds: float) -> None:
        now, previous = self._added_before
        self._records.append(StepRecord(seconds, now or previous))
        self._added_before = (False, now)

    def take(self) -> list[StepRecord]:
        """The records since the last take (the bench calls this at a level's start and end)."""
        taken = []
        while True:
            try:
                taken.append(self._records.popleft())
            except IndexError:
                return taken
