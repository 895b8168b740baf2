"""Combining: callers on many threads hand in one item each; one of them runs a batch call for every item
waiting, and each caller gets its own result back.

Why not one thread per request doing its own work: a burst of requests (64 voice-agent turns at once)
built their prompts on 20 executor threads, each taking turns on the interpreter and each waiting for its
own GPU read-back: ~100 ms before the last one reached Stage 0 (BENCHMARKS.md, sixth pass). Combined,
the burst is built by one caller in one pass with one read-back, while the others sleep. Why not a thread
of its own: a combiner adds no thread to watch; the first caller to find nobody building becomes the
builder, and a lone request is built at once on its own thread, as before.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")
_PENDING = object()


class _Slot:
    __slots__ = ("item", "result")

    def __init__(self, item):
        self.item = item
        self.result = _PENDING


class Combiner(Generic[Item, Result]):
    """`run(item)` returns `batch_call(items)[i]` for its item; `batch_call` returns one result per item in
    order, an Exception for an item that failed (raised to that caller only). `combine = False` runs each
    item alone (the bench's switch)."""

    def __init__(self, batch_call: Callable[[list[Item]], list[Result | Exception]]):
        self._batch_call = batch_call
        self._cond = threading.Condition()
        self._waiting: list[_Slot] = []
        self._busy = False
        self.combine = True
        self.batches = 0          # batch calls made (for tests and the bench)

    def run(self, item: Item) -> Result:
        slot = _Slot(item)
        with self._cond:
            self._waiting.append(slot)
            while slot.result is _PENDING and self._busy:
                self._cond.wait()
            if slot.result is _PENDING:          # nobody is building: this caller builds what waits
                self._busy = True
                if self.combine:
                    batch, self._waiting = self._waiting, []
                else:
                    batch = [slot]
                    self._waiting.remove(slot)
        if slot.result is _PENDING:
            self._call(batch)
        if isinstance(slot.result, BaseException):
            raise slot.result
        return slot.result

    def _call(self, batch: list[_Slot]) -> None:
        try:
            results = self._batch_call([s.item for s in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"batch call returned {len(results)} results for {len(batch)} items")
        except BaseException as exc:  # noqa: BLE001 -- every caller of the batch gets the failure
            results = [exc] * len(batch)
        with self._cond:
            for s, result in zip(batch, results):
                s.result = result
            self.batches += 1
            self._busy = False
            self._cond.notify_all()
