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


def _run(tokens: int, ends_on_stop: bool, lag: bool) -> list[int]:
    """Simulate one request of `tokens` sampled tokens; returns the token index of each frame handed out."""
    pending: list[int] = []          # token index of each made, not yet handed-out frame
    handed: list[int] = []
    reported = 0

    def deliver(finished: bool) -> None:
        count = frames_to_hand_out(len(pending), len(handed), reported, finished)
        assert all(t < reported for t in pending[:count]), "a frame went out before its token was reported"
        handed.extend(pending[:count])
        del pending[:count]

    if not lag:                                       # sync: step k = hook(k-1), sample k, report k
        for k in range(tokens):
            if k:
                pending.append(k - 1)
            reported += 1
            deliver(finished=k == tokens - 1)
        return handed
    # async: step() k launches step k (its hook makes the frame of token k-1), then reports token k-1
    for k in range(1, tokens + 1):
        last_reported = k == tokens
        if k < tokens or ends_on_stop:                # the scheduler knows in advance when max_tokens ends it
            pending.append(k - 1)
        reported += 1
        deliver(finished=last_reported)
    return handed


@pytest.mark.parametrize("tokens", [1, 2, 3, 17])
@pytest.mark.parametrize("ends_on_stop", [True, False])
def test_sync_and_async_hand_out_the_same_frames(tokens, ends_on_stop):
    expected = list(range(tokens - 1))               # every token's frame but the last token's
    assert _run(tokens, ends_on_stop, lag=False) == expected
    assert _run(tokens, ends_on_stop, lag=True) == expected


def test_a_frame_waits_for_its_token_and_the_stop_frame_is_dropped():
    assert frames_to_hand_out(pending=1, handed_out=3, tokens=3, finished=False) == 0   # token 3 not reported
    assert frames_to_hand_out(pending=1, handed_out=3, tokens=4, finished=False) == 1
    assert frames_to_hand_out(pending=1, handed_out=3, tokens=4, finished=True) == 0    # token 3 was the stop
    assert frames_to_hand_out(pending=2, handed_out=0, tokens=3, finished=True) == 2
