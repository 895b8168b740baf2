"""The UI's audio track after the engine fell behind playback: what comes next is paced at real time again.

fastrtc's generator track (`ServerToClientAudio`, the one the Gradio demo streams on) paces its frames by the
stream's timeline since the first frame. When the generator hands over audio after the track has played
everything (a loaded CPU: the engine slower than real time), those frames are late on that timeline and would
go out in a burst; patched (`patch_fastrtc_generator_track`, as the app is), they go out at real-time pace from
the first late one. Runs the real fastrtc track without a peer connection: the test takes frames with `recv()`
as aiortc would.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from tts_engine.serving.webrtc import patch_fastrtc_generator_track

SR = 24000
FRAME_S = 0.02          # fastrtc's frames: 20 ms
LATE_S = 1.0            # the second piece comes this long after the first was handed over (it plays for 0.2 s)


def _frame_times_of_the_late_piece() -> list[float]:
    from aiortc.mediastreams import MediaStreamError
    from fastrtc.tracks import ServerToClientAudio
    from fastrtc.utils import Context

    patch_fastrtc_generator_track()
    first, late = np.full(SR // 5, 0.1, np.float32), np.full(SR, 0.2, np.float32)   # 0.2 s, then 1 s

    def speak():
        yield SR, first.reshape(1, -1)
        time.sleep(LATE_S)                 # the engine falls behind: the track plays 0.2 s, then has nothing
        yield SR, late.reshape(1, -1)

    async def main() -> list[float]:
        track = ServerToClientAudio(speak, Context("pacing-test"))
        track.set_args(["pacing-test"])
        times = []
        while True:
            try:
                frame = await asyncio.wait_for(track.recv(), 30)
            except MediaStreamError:       # the generator ended (the patched track says so)
                break
            if frame.pts / frame.sample_rate >= first.shape[0] / SR:   # a frame of the late piece
                times.append(time.monotonic())
        return times

    return asyncio.run(main())


def test_audio_after_the_track_ran_dry_is_paced_not_burst():
    times = _frame_times_of_the_late_piece()
    assert len(times) >= 45, f"{len(times)} frames of a 1 s piece"   # the resampler may hold the last back
    # Paced, 20 frames take 19 frame intervals; a burst (the timeline ~0.8 s behind) takes a few milliseconds.
    spans = [times[i + 19] - times[i] for i in range(len(times) - 19)]
    assert min(spans) >= 19 * FRAME_S * 0.9, f"20 frames went out within {1000 * min(spans):.0f} ms: a burst"
