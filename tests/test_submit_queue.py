"""SubmitQueue alone: how `generate`'s requests reach the engine's submit (no engine: a recording stand-in)."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest

from tts_engine.request import RequestError
from tts_engine.submit_queue import Submission, SubmitQueue


class Recorder:
    """Stands in for `TTSEngine._submit_many`: records each call's request ids; "bad" requests fail; the first call
    can be held until the test lets it go."""

    def __init__(self):
        self.calls: list[list[str]] = []
        self.aborted: list[str] = []
        self.entered, self.release = threading.Event(), threading.Event()
        self.release.set()

    def submit_many(self, submissions: list[Submission]) -> list:
        self.calls.append([s.request_id for s in submissions])
        self.entered.set()
        self.release.wait(10)
        return [RequestError(f"{s.request_id} is bad") if s.request_id.startswith("bad")
                else (SimpleNamespace(request_id=s.request_id), None) for s in submissions]


def _submission(request_id: str) -> Submission:
    return Submission(request=None, deliver=lambda item: None, request_id=request_id)


def test_requests_waiting_for_the_thread_are_submitted_together_each_with_its_own_result():
    recorder = Recorder()
    queue = SubmitQueue(recorder.submit_many, recorder.aborted.append)
    recorder.release.clear()          # the first submit holds the thread until the rest of the burst waits

    async def burst():
        first = asyncio.ensure_future(queue.submit(_submission("r0"), threading.Event()))
        await asyncio.get_running_loop().run_in_executor(None, recorder.entered.wait, 10)
        rest = [asyncio.ensure_future(queue.submit(_submission(name), threading.Event()))
                for name in ("r1", "bad2", "r3")]
        await asyncio.sleep(0)        # every submit of the burst is waiting now
        assert queue.waiting == 3
        recorder.release.set()
        return await asyncio.gather(first, *rest, return_exceptions=True)
    try:
        results = asyncio.run(burst())
    finally:
        queue.close()
    assert recorder.calls == [["r0"], ["r1", "bad2", "r3"]]
    assert [getattr(r, "request_id", None) for r in results] == ["r0", "r1", None, "r3"]
    assert isinstance(results[2], RequestError) and queue.waiting == 0 and recorder.aborted == []


def test_a_caller_that_gives_up_before_its_turn_is_never_submitted_and_one_that_gives_up_during_it_is_aborted():
    recorder = Recorder()
    queue = SubmitQueue(recorder.submit_many, recorder.aborted.append)
    recorder.release.clear()

    async def run():
        held_flag, late_flag = threading.Event(), threading.Event()   # set by a caller that gives up
        held = asyncio.ensure_future(queue.submit(_submission("held"), held_flag))
        await asyncio.get_running_loop().run_in_executor(None, recorder.entered.wait, 10)
        late = asyncio.ensure_future(queue.submit(_submission("late"), late_flag))
        await asyncio.sleep(0)
        assert queue.waiting == 1
        late.cancel()                 # still waiting for the thread: it must never be submitted
        with pytest.raises(asyncio.CancelledError):
            await late
        held_flag.set()               # gave up while its submit runs: the thread aborts it once it is in
        recorder.release.set()
        return await held
    try:
        route = asyncio.run(run())
        queue._pool.submit(lambda: None).result(10)      # one thread: every submit before this one is done
    finally:
        queue.close()
    assert route.request_id == "held" and recorder.aborted == ["held"]
    assert recorder.calls == [["held"]], "a cancelled waiting submit was submitted"


@pytest.mark.parametrize("threads", [1, None], ids=["own_thread", "loops_executor"])
def test_without_batches_every_request_is_submitted_alone(threads):
    recorder = Recorder()
    queue = SubmitQueue(recorder.submit_many, recorder.aborted.append, threads=threads, batched=False)
    assert queue.serial is (threads is not None)

    async def burst():
        return await asyncio.gather(*(queue.submit(_submission(f"r{i}"), threading.Event()) for i in range(4)),
                                    queue.submit(_submission("bad"), threading.Event()), return_exceptions=True)
    try:
        results = asyncio.run(burst())
    finally:
        queue.close()
    assert sorted(recorder.calls) == [["bad"], ["r0"], ["r1"], ["r2"], ["r3"]]
    assert [r.request_id for r in results[:4]] == ["r0", "r1", "r2", "r3"] and isinstance(results[4], RequestError)
