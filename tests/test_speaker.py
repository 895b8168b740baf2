"""The clause worker shared by WebRTC `say` and the WebSocket (`ClauseSpeaker`), and the WebRTC session's
underrun count, on a stand-in engine (no model): clauses are spoken one at a time in order, `then` runs
after what was queued before it, cancel aborts the running request, and a session whose audio arrives
slower than it plays counts the gaps."""

from __future__ import annotations

import asyncio

import numpy as np
from prometheus_client import REGISTRY

from tts_engine.request import RequestMetrics, StreamingChunkOutput
from tts_engine.serving.realtime import TAIL_SILENCE, SpeechSession
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
