"""Voice agents: text pushed in pieces is spoken on a session's audio track (say / interrupt / stats).

`SpeechSession` is the transport-free half of a voice-agent connection: clauses are assembled from
streamed text and synthesized one after another by a worker task while earlier audio plays
(`ClauseSpeaker`, shared with the WebSocket), and their PCM is put on `session.audio` for the transport
(the fastrtc handler in app.py) to send. `interrupt` cancels the worker (aborting the engine request in
both stages) and drops queued audio at once. `realtime_router` serves the HTTP side over any lookup of
sessions by `webrtc_id`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

import numpy as np
from fastapi import APIRouter

from tts_engine.request import resolve_language
from tts_engine.serving.errors import ApiError, route_class
from tts_engine.serving.metrics import UNDERRUN_SECONDS, UNDERRUNS
from tts_engine.serving.schemas import Interrupt, Say
from tts_engine.serving.settings import ServingSettings
from tts_engine.serving.speaker import Clause, ClauseSpeaker
from tts_engine.serving.voice_library import VoiceLibrary, voice_request_fields

SAMPLE_RATE = 24000
TAIL_SILENCE = np.zeros(SAMPLE_RATE // 10, np.float32)   # flushes a transport's last partial 20 ms frame


class Preroll:
    """Holds the first `seconds` of an utterance's audio back, then passes everything through.

    A real-time transport plays frames at real-time pace as they arrive; when the engine produces audio
    only a little faster than real time (CPU), the growing chunk schedule would leave the listener
    waiting between early chunks. A short pre-roll trades that much latency for gapless playback.
    """

    def __init__(self, seconds: float):
        self.needed = max(0.0, seconds) * SAMPLE_RATE
        self.held: list[np.ndarray] = []

    def push(self, audio: np.ndarray, finished: bool) -> list[np.ndarray]:
        if not self.held and self.needed <= 0:
            return [audio] if audio.size else []
        if audio.size:
            self.held.append(audio)
        if finished or sum(a.shape[0] for a in self.held) >= self.needed:
            out, self.held, self.needed = self.held, [], 0.0
            return [np.concatenate(out)] if out else []
        return []


class PlaybackClock:
    """When the audio handed to a real-time transport so far will have played.

    The transport plays at real-time pace and waits when it has nothing queued, so a piece handed over after
    the previous audio ran out starts late: the end is `max(end, now) + duration`, not the sum of durations.
    A listener's gaps (underruns) therefore move the end back, and `hand_over` reports each one. (fastrtc's
    tracks keep to this after a gap only if re-anchored: the UI's by `webrtc.patch_fastrtc_generator_track`,
    the agents' by fastrtc itself after 200 ms without frames; a shorter gap goes out there as a catch-up burst.)
    """

    def __init__(self):
        self.until = 0.0   # monotonic time at which everything handed over has played; 0 = nothing yet

    def hand_over(self, samples: int, now: float | None = None) -> float:
        """Account a piece of `samples` handed over now; returns the silence the listener heard before it
        (0.0 when audio was still queued, or for the first piece)."""
        now = time.monotonic() if now is None else now
        gap = now - self.until if 0.0 < self.until < now else 0.0
        self.until = max(self.until, now) + samples / SAMPLE_RATE
        return gap

    def remaining(self, now: float | None = None) -> float:
        """Seconds of handed-over audio not yet played."""
        return max(0.0, self.until - (time.monotonic() if now is None else now))

    def reset(self) -> None:
        self.until = 0.0


class SpeechSession(ClauseSpeaker):
    """One voice-agent conversation over WebRTC: clauses spoken in turn (`ClauseSpeaker`), their audio queued
    on `audio` for the track. `on_interrupt` lets the transport drop what it already holds.

    Underruns: the session keeps the time its audio so far will have played (`playback`); audio of an
    utterance that arrives after that moment means the listener heard a gap mid-utterance. Each is
    counted (`underruns`, `underrun_s`, and the process-wide Prometheus counters).
    """

    transport = "webrtc"

    def __init__(self, engine, preroll_s: float = 0.0, on_interrupt: Callable[[], None] | None = None):
        super().__init__(engine)
        self.preroll_s = preroll_s
        self.on_interrupt = on_interrupt
        self.audio: asyncio.Queue[np.ndarray] = asyncio.Queue()   # float32 24 kHz pieces, in play order
        self.playback = PlaybackClock()
        self.in_utterance = False  # audio of an unfinished utterance has been handed out
        self.underruns, self.underrun_s = 0, 0.0
        self._held: Preroll | None = None

    def begin_clause(self, clause: Clause) -> None:
        self._held = Preroll(self.preroll_s - self.playback.remaining())

    async def on_audio(self, audio: np.ndarray, finished: bool) -> None:
        for piece in self._held.push(audio, finished):
            await self._play(piece)

    async def end_clause(self, clause: Clause, metrics) -> None:
        if clause.last:
            await self._play(TAIL_SILENCE)
            self.in_utterance = False

    async def on_error(self, clause: Clause, exc: Exception) -> None:
        await super().on_error(clause, exc)
        self.in_utterance = False

    async def _play(self, audio: np.ndarray) -> None:
        gap = self.playback.hand_over(audio.shape[-1])
        if self.in_utterance and gap > 0.0:
            self.underruns += 1
            self.underrun_s += gap
            UNDERRUNS.inc()
            UNDERRUN_SECONDS.inc(gap)
        self.in_utterance = True
        await self.audio.put(audio)

    def interrupt(self) -> None:
        self.playback.reset()
        self.in_utterance = False
        self.cancel()
        while not self.audio.empty():
            self.audio.get_nowait()
        if self.on_interrupt is not None:
            self.on_interrupt()

    def close(self) -> None:
        self.cancel()


class SessionLookup(Protocol):
    def get(self, webrtc_id: str) -> SpeechSession | None: ...


def realtime_router(engine, library: VoiceLibrary, settings: ServingSettings, sessions: SessionLookup) -> APIRouter:
    """`/v1/realtime/*` over the sessions a transport holds (open one with `POST /webrtc/offer`)."""
    router = APIRouter(route_class=route_class(settings.max_body_bytes), tags=["realtime"])
    config = engine.config

    def session_for(webrtc_id: str) -> SpeechSession:
        session = sessions.get(webrtc_id)
        if session is None:
            raise ApiError("unknown_session", f"no WebRTC session {webrtc_id!r}: open one with POST /webrtc/offer",
                           "webrtc_id")
        return session

    @router.post("/v1/realtime/say", summary="Speak text on a WebRTC session",
                 description="Queue text for a session opened with POST /webrtc/offer. Text may arrive in pieces "
                             "(final=false); speech starts once the first clause is complete.")
    async def say(body: Say) -> dict:
        session = session_for(body.webrtc_id)
        if not body.text.strip() and not body.final:
            raise ApiError("empty_input", "text is empty", "text")
        if session.buffered_chars + len(body.text) > settings.max_input_chars:
            raise ApiError("input_too_long", f"utterance exceeds {settings.max_input_chars} characters", "text")
        language = resolve_language(body.language, config.supported_languages)
        fields, _ = voice_request_fields(config, library, body.voice, body.instructions, settings.voice_aliases)
        fields["trim_leading_silence"] = body.trim_leading_silence
        queued = session.say(body.text, fields, language, body.final)
        return {"webrtc_id": body.webrtc_id, "clauses_queued": queued}

    @router.post("/v1/realtime/interrupt", summary="Stop speaking at once")
    async def interrupt(body: Interrupt) -> dict:
        session_for(body.webrtc_id).interrupt()
        return {"webrtc_id": body.webrtc_id, "interrupted": True}

    @router.get("/v1/realtime/stats/{webrtc_id}", summary="Per-clause latency and playback gaps of a session")
    async def stats(webrtc_id: str) -> dict:
        session = session_for(webrtc_id)
        return {"webrtc_id": webrtc_id, "clauses": session.stats,
                "underruns": session.underruns, "underrun_s": round(session.underrun_s, 4)}

    return router
