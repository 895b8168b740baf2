"""The clause worker shared by WebRTC `say` and the WebSocket (`ClauseSpeaker`), and the WebRTC session's
underrun count, on a stand-in engine (no model): clauses are spoken one at a time in order, `then` runs
after what was queued before it, cancel aborts the running request, and a session whose audio arrives
slower than it plays counts the gaps."""

from __future__ import annotations

import asyncio

import numpy as np
from prometheus_client import REGISTRY

from tts_engine.request import RequestMetrics, StreamingChunkOutput
from tts_engine.serving.realtime import TAIL_SILENCE, PlaybackClock, Preroll, SpeechSession
from tts_engine.serving.speaker import ClauseSpeaker

SR = 24000
FRAME = 1920   # 80 ms


class StandInEngine:
    """`generate` yields `chunks` chunks of one frame each, `delay_s` apart; remembers what ran and what was
    closed early (an abort)."""

    def __init__(self, chunks: int = 3, delay_s: float = 0.0):
        self.chunks, self.delay_s = chunks, delay_s
        self.texts: list[str] = []
        self.aborted: list[str] = []
        self.running = 0
        self.most_at_once = 0

    async def generate(self, request, request_id=None, max_buffered_s=None):
        self.texts.append(request.text)
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        finished = False
        try:
            for i in range(self.chunks):
                await asyncio.sleep(self.delay_s)
                finished = i == self.chunks - 1
                metrics = RequestMetrics(request.text, 0.0, finished_s=0.01, frames=self.chunks,
                                         audio_samples=self.chunks * FRAME) if finished else None
                yield StreamingChunkOutput(request.text, i, finished, (i + 1) * FRAME,
                                           np.full(FRAME, 0.1, np.float32), codec_codes=np.zeros((1, 16), np.int64),
                                           metrics=metrics)
        finally:
            self.running -= 1
            if not finished:
                self.aborted.append(request.text)


class Recorder(ClauseSpeaker):
    def __init__(self, engine):
        super().__init__(engine)
        self.log: list[tuple] = []

    async def on_audio(self, audio, finished):
        self.log.append(("audio", audio.shape[0], finished))

    async def end_clause(self, clause, metrics):
        self.log.append(("end", clause.text, clause.last))


def test_clauses_are_spoken_in_order_one_at_a_time_and_then_runs_after_them():
    async def main():
        engine = StandInEngine()
        speaker = Recorder(engine)
        assert speaker.say("First clause here. Second", {}, "english", final=False) == 1
        assert speaker.say(" clause. Third", {}, "english", final=False) == 1
        assert speaker.buffered_chars == len(" Third")
        done = asyncio.Event()

        async def mark():
            speaker.log.append(("then",))
            done.set()

        assert speaker.say("", {}, "english", final=True) == 1
        speaker.then(mark)
        await asyncio.wait_for(done.wait(), 30)
        return engine, speaker

    engine, speaker = asyncio.run(main())
    assert engine.texts == ["First clause here.", "Second clause.", "Third"] and engine.most_at_once == 1
    ends = [e for e in speaker.log if e[0] in ("end", "then")]
    assert ends == [("end", "First clause here.", False), ("end", "Second clause.", False), ("end", "Third", True),
                    ("then",)]
    assert [e for e in speaker.log if e[0] == "audio"].count(("audio", FRAME, True)) == 3
    assert len(speaker.stats) == 3


def test_cancel_aborts_the_running_request_and_drops_the_queue():
    async def main():
        engine = StandInEngine(chunks=50, delay_s=0.01)
        speaker = Recorder(engine)
        speaker.say("One. Two. Three. Four", {}, "english", final=False)
        while not speaker.log:                     # the first clause is speaking
            await asyncio.sleep(0.01)
        await speaker.cancel_and_wait()
        return engine, speaker

    engine, speaker = asyncio.run(main())
    assert engine.texts == ["One."] and engine.aborted == ["One."]
    assert speaker.buffered_chars == 0 and speaker.pending.empty() and speaker.worker is None


def _counter(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def _play(engine: StandInEngine, text: str) -> SpeechSession:
    async def main():
        session = SpeechSession(engine)
        session.say(text, {}, "english", final=True)
        pieces = []
        while not pieces or pieces[-1] is not TAIL_SILENCE:
            pieces.append(await asyncio.wait_for(session.audio.get(), 30))
        return session

    return asyncio.run(main())


def test_a_webrtc_session_counts_underruns_when_audio_comes_slower_than_it_plays():
    before = _counter("tts_playback_underruns_total")
    fast = _play(StandInEngine(chunks=4, delay_s=0.0), "Fast enough. Also fast.")
    assert fast.underruns == 0
    # 80 ms of audio every 250 ms: the listener hears gaps inside the utterance
    slow = _play(StandInEngine(chunks=4, delay_s=0.25), "Too slow. Gaps.")
    assert slow.underruns >= 3 and slow.underrun_s > 0.1
    assert _counter("tts_playback_underruns_total") - before == slow.underruns

    # ... and a session's stats say so, for the agent that drives it
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from tts_engine.serving.realtime import realtime_router
    from tts_engine.serving.settings import ServingSettings

    class Config:
        supported_languages = ["english"]

    engine = StandInEngine()
    engine.config = Config()
    app = FastAPI()
    app.include_router(realtime_router(engine, None, ServingSettings(), {"slow": slow, "fast": fast}))
    with TestClient(app) as client:
        answer = client.get("/v1/realtime/stats/slow").json()
        assert answer["underruns"] == slow.underruns and answer["underrun_s"] == round(slow.underrun_s, 4)
        assert len(answer["clauses"]) == len(slow.stats) == 2
        assert client.get("/v1/realtime/stats/fast").json()["underruns"] == 0


def test_the_playback_clock_moves_the_end_back_by_each_gap():
    """A transport that ran dry waits for the next piece, so audio handed over late ends later than the sum of
    the durations (the demo's "Finished" waited for that sum and came while audio still played)."""
    clock = PlaybackClock()
    assert clock.hand_over(SR, now=100.0) == 0.0          # 1 s, plays 100-101
    assert clock.hand_over(SR // 2, now=100.2) == 0.0     # queued behind it: 101-101.5
    assert clock.remaining(now=100.5) == 1.0
    assert clock.hand_over(SR, now=102.0) == 0.5          # ran dry at 101.5: heard 0.5 s of silence, 102-103
    assert clock.remaining(now=102.5) == 0.5 and clock.remaining(now=104.0) == 0.0
    clock.reset()
    assert clock.hand_over(SR, now=200.0) == 0.0 and clock.until == 201.0


def test_the_preroll_holds_the_first_audio_back_then_passes_everything_through():
    held = Preroll(0.1)                                    # 2,400 samples
    assert held.push(np.ones(1000, np.float32), False) == []
    assert held.push(np.zeros(0, np.float32), False) == []
    out = held.push(np.full(1500, 2, np.float32), False)   # 2,500 >= 2,400: all of it, in order, as one piece
    assert len(out) == 1 and out[0].shape == (2500,) and out[0][999] == 1 and out[0][1000] == 2
    assert [a.shape for a in held.push(np.ones(10, np.float32), False)] == [(10,)]   # then straight through
    short = Preroll(1.0)                                   # an utterance shorter than the pre-roll plays at its end
    assert short.push(np.ones(100, np.float32), False) == []
    assert [a.shape for a in short.push(np.ones(50, np.float32), True)] == [(150,)]
    assert [a.shape for a in Preroll(0.0).push(np.ones(5, np.float32), False)] == [(5,)]
    assert Preroll(-1.0).push(np.zeros(0, np.float32), True) == []
