"""Which frames Stage 0 hands to Stage 1 when vLLM reports tokens a step late (async scheduling).

A token's frame is made by the decode hook of the step after the one that sampled it. Synchronous
scheduling reports a token before the next step's hook runs; async scheduling launches that step (and
runs its hook) first, so the hook also makes a frame for a stop token that turns out to end the request.
Both timelines must hand out exactly the frames of every token but the last, in order, and never a frame
whose token has not been reported yet.
"""

from __future__ import annotations

import pytest

from tts_engine.stages.talker import frames_to_hand_out


def _run(tokens: int, ends_on_stop: bool, report_delay: int | None) -> list[int]:
    """Simulate one request of `tokens` sampled tokens; returns the token index of each frame handed out.

    report_delay None: synchronous scheduling (step k: hook(k-1), sample k, report k). Otherwise async: call
    k launches step k, whose hook makes the frame of token k-1, then reports token k-1-report_delay (0: the
    steady state; 1: a call that only refills vLLM's batch queue and reports nothing yet)."""
    pending: list[int] = []          # token index of each made, not yet handed-out frame
    handed: list[int] = []
    reported = 0

    def deliver(finished: bool) -> None:
        count = frames_to_hand_out(len(pending), len(handed), reported, finished)
        assert all(t < reported for t in pending[:count]), "a frame went out before its token was reported"
        handed.extend(pending[:count])
        del pending[:count]

    if report_delay is None:
        for k in range(tokens):
            if k:
                pending.append(k - 1)
            reported += 1
            deliver(finished=k == tokens - 1)
        return handed
    for k in range(1, tokens + 1 + report_delay):
        if k <= tokens and (k < tokens or ends_on_stop):   # the scheduler knows in advance when max_tokens ends it
            pending.append(k - 1)
        if 0 <= k - 1 - report_delay < tokens:
            reported += 1
            deliver(finished=reported == tokens)
    return handed


@pytest.mark.parametrize("tokens", [1, 2, 3, 17])
@pytest.mark.parametrize("ends_on_stop", [True, False])
@pytest.mark.parametrize("report_delay", [0, 1])
def test_async_hands_out_the_frames_sync_does(tokens, ends_on_stop, report_delay):
    expected = list(range(tokens - 1))               # every token's frame but the last token's
    assert _run(tokens, ends_on_stop, report_delay=None) == expected
    assert _run(tokens, ends_on_stop, report_delay=report_delay) == expected


def test_the_check_would_catch_a_frame_handed_out_early():
    """The simulation's assertion fires for a rule that ignores what was reported."""
    import tests.test_talker_delivery as me

    original = me.frames_to_hand_out
    me.frames_to_hand_out = lambda pending, handed_out, tokens, finished: pending
    try:
        with pytest.raises(AssertionError, match="before its token was reported"):
            _run(5, True, report_delay=1)
    finally:
        me.frames_to_hand_out = original


def test_a_frame_waits_for_its_token_and_the_stop_frame_is_dropped():
    assert frames_to_hand_out(pending=1, handed_out=3, tokens=3, finished=False) == 0   # token 3 not reported
    assert frames_to_hand_out(pending=1, handed_out=3, tokens=4, finished=False) == 1
    assert frames_to_hand_out(pending=1, handed_out=3, tokens=4, finished=True) == 0    # token 3 was the stop
    assert frames_to_hand_out(pending=2, handed_out=0, tokens=3, finished=True) == 2


class _CommandsArrivingWhileHandled:
    """Stands in for a TalkerStage around `_take_commands`: each add handled queues another (a burst whose prompts
    are built faster than Stage 0 takes them), up to `arrivals` more."""

    def __init__(self, queued: int, arrivals: int, drain: bool):
        import queue
        self._commands: queue.Queue = queue.Queue()
        self.drain_commands = drain
        self.handled: list[int] = []
        self._next, self._last = queued, queued + arrivals
        for i in range(queued):
            self._commands.put(("add", i))

    def _handle(self, cmd: str, arg) -> None:
        self.handled.append(arg)
        if self._next < self._last:
            self._commands.put(("add", self._next))
            self._next += 1


def test_stage0_steps_after_the_commands_queued_then_not_after_every_later_one():
    """Between two steps Stage 0 handles what was queued when it looked, so a burst's first prompts prefill while
    the rest are still arriving; draining until the queue is empty (the loop before, variant
    `stage0-drain-commands`) handled the whole burst first."""
    from tts_engine.stages.talker import TalkerStage

    stage = _CommandsArrivingWhileHandled(queued=3, arrivals=60, drain=False)
    TalkerStage._take_commands(stage, block=False)
    assert stage.handled == [0, 1, 2]
    assert stage._commands.qsize() == 3           # what came meanwhile waits for the next round, in order
    TalkerStage._take_commands(stage, block=False)
    assert stage.handled == [0, 1, 2, 3, 4, 5]

    drained = _CommandsArrivingWhileHandled(queued=3, arrivals=60, drain=True)
    TalkerStage._take_commands(drained, block=False)
    assert drained.handled == list(range(63)) and drained._commands.empty()

    idle = _CommandsArrivingWhileHandled(queued=0, arrivals=0, drain=False)
    TalkerStage._take_commands(idle, block=False)  # nothing queued: returns at once
    assert idle.handled == []
