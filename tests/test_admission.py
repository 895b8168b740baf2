"""The admission thread: submissions that wait while it is busy are started together, one failure stays
with its batch, a caller that gave up is skipped, and nothing waits forever after close."""

from __future__ import annotations

import threading

import pytest

from tts_engine.stages.admission import Admission, Submission


class Closed(Exception):
    pass


class _Starter:
    """start_many that records its batches; the first call waits at a gate, so the test can queue more."""

    def __init__(self, fail_on: str | None = None):
        self.batches: list[list[str]] = []
        self.gate, self.inside = threading.Event(), threading.Event()
        self.fail_on = fail_on

    def __call__(self, batch: list[Submission]) -> None:
        self.batches.append([s.request for s in batch])
        if len(self.batches) == 1:
            self.inside.set()
            assert self.gate.wait(30)
        if self.fail_on in [s.request for s in batch]:
            raise ValueError(f"{self.fail_on} broke its batch")
        for s in batch:
            s.future.set_result(f"started {s.request}")


def _admission(starter) -> Admission:
    return Admission(starter, lambda: Closed("closed"))


def _submit(admission: Admission, name: str):
    return admission.submit(name, deliver=lambda item: None, request_id=name)


def test_submissions_waiting_while_it_is_busy_start_together():
    starter = _Starter()
    admission = _admission(starter)
    try:
        first = _submit(admission, "a")
        assert starter.inside.wait(30)
        rest = [_submit(admission, name) for name in "bcd"]
        starter.gate.set()
        assert [f.result(30) for f in [first, *rest]] == [f"started {n}" for n in "abcd"]
        assert starter.batches == [["a"], ["b", "c", "d"]]
    finally:
        admission.close()


def test_one_at_a_time_when_told():
    starter = _Starter()
    admission = _admission(starter)
    admission.max_batch = 1
    try:
        first = _submit(admission, "a")
        assert starter.inside.wait(30)
        rest = [_submit(admission, name) for name in "bc"]
        starter.gate.set()
        for f in [first, *rest]:
            f.result(30)
        assert starter.batches == [["a"], ["b"], ["c"]]
    finally:
        admission.close()


def test_a_caller_that_gave_up_before_its_turn_is_skipped():
    starter = _Starter()
    admission = _admission(starter)
    try:
        _submit(admission, "a")
        assert starter.inside.wait(30)
        gone, kept = _submit(admission, "gone"), _submit(admission, "kept")
        assert gone.cancel()
        starter.gate.set()
        assert kept.result(30) == "started kept"
        assert starter.batches == [["a"], ["kept"]]
    finally:
        admission.close()


def test_a_batch_that_raises_fails_its_own_requests_only():
    starter = _Starter(fail_on="bad")
    admission = _admission(starter)
    try:
        first = _submit(admission, "a")
        assert starter.inside.wait(30)
        bad, other = _submit(admission, "bad"), _submit(admission, "other")
        starter.gate.set()
        assert first.result(30) == "started a"
        for f in (bad, other):
            with pytest.raises(ValueError, match="bad broke its batch"):
                f.result(30)
        assert _submit(admission, "later").result(30) == "started later"
        assert admission.alive
    finally:
        admission.close()


def test_a_batch_left_unsettled_is_failed_not_left_waiting():
    admission = _admission(lambda batch: None)
    try:
        with pytest.raises(RuntimeError, match="unsettled"):
            _submit(admission, "a").result(30)
    finally:
        admission.close()


def test_barrier_returns_once_earlier_submissions_started():
    starter = _Starter()
    starter.gate.set()
    admission = _admission(starter)
    try:
        futures = [_submit(admission, name) for name in "abc"]
        admission.barrier()
        assert all(f.done() for f in futures)
    finally:
        admission.close()


def test_after_close_nothing_waits_forever():
    starter = _Starter()
    admission = _admission(starter)
    first = _submit(admission, "a")
    assert starter.inside.wait(30)
    queued = _submit(admission, "queued")
    closer = threading.Thread(target=admission.close)
    closer.start()
    assert admission._closed.wait(30)      # closed while the first batch runs: "queued" is never taken
    starter.gate.set()
    closer.join(30)
    assert first.result(30) == "started a"
    with pytest.raises(Closed):
        queued.result(30)
    with pytest.raises(Closed):
        _submit(admission, "late").result(30)
    admission.barrier()      # returns at once on a closed admission
    assert not admission.alive
