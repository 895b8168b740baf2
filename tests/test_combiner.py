"""Combining callers' items into batch calls (stages/combiner.py): each caller gets its own result or its own
error, a burst becomes a few batch calls, and switched off every item is a call of its own."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tts_engine.stages.combiner import Combiner


class _SlowSquares:
    """A batch call that takes a while (like a GPU read-back), so callers pile up behind it."""

    def __init__(self):
        self.sizes: list[int] = []
        self.overlapping = 0
        self._inside = threading.Lock()

    def __call__(self, items: list[int]) -> list[int | Exception]:
        if not self._inside.acquire(blocking=False):
            self.overlapping += 1          # two batch calls at once: the combiner must never do that
            self._inside.acquire()
        try:
            self.sizes.append(len(items))
            time.sleep(0.02)
            return [ValueError(f"bad item {x}") if x < 0 else x * x for x in items]
        finally:
            self._inside.release()


def _burst(combiner: Combiner, items: list[int]) -> list:
    start = threading.Barrier(len(items))

    def call(x):
        start.wait()
        try:
            return combiner.run(x)
        except ValueError as exc:
            return exc
    with ThreadPoolExecutor(len(items)) as pool:
        return list(pool.map(call, items))


def test_a_burst_is_combined_and_every_caller_gets_its_own_result():
    call = _SlowSquares()
    combiner = Combiner(call)
    items = list(range(24)) + [-1, -2]
    results = _burst(combiner, items)
    for x, result in zip(items, results):
        if x < 0:
            assert isinstance(result, ValueError) and str(result) == f"bad item {x}"   # only its own caller
        else:
            assert result == x * x
    assert sum(call.sizes) == len(items) and call.overlapping == 0
    assert len(call.sizes) < len(items) / 2 and max(call.sizes) > 1        # combined, not one by one
    assert combiner.batches == len(call.sizes)


def test_switched_off_every_item_is_built_alone():
    call = _SlowSquares()
    combiner = Combiner(call)
    combiner.combine = False
    assert _burst(combiner, list(range(8))) == [x * x for x in range(8)]
    assert call.sizes == [1] * 8 and call.overlapping == 0


def test_a_failing_batch_call_fails_only_its_batch_and_the_combiner_goes_on():
    def broken(items):
        if 13 in items:
            raise RuntimeError("the GPU is gone")
        return items
    combiner = Combiner(broken)
    with pytest.raises(RuntimeError, match="the GPU is gone"):
        combiner.run(13)
    assert combiner.run(7) == 7                     # not stuck "busy" after the failure


def test_a_batch_call_returning_the_wrong_count_is_an_error_not_a_hang():
    combiner = Combiner(lambda items: [])
    with pytest.raises(RuntimeError, match="0 results for 1 items"):
        combiner.run(1)
