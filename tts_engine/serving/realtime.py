"""Voice agents: text pushed in pieces is spoken on a session's audio track (say / interrupt / stats).

`SpeechSession` is the transport-free half of a voice-agent connection: clauses are assembled from
streamed text (`ClauseAssembler`), synthesized one after another by a worker task while earlier audio
plays, and their PCM is put on `session.audio` for the transport (the fastrtc handler in app.py) to
send. `interrupt` cancels the worker (aborting the engine request in both stages) and drops queued
audio at once. `realtime_router` serves the HTTP side over any lookup of sessions by `webrtc_id`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

import numpy as np
from fastapi import APIRouter

from tts_engine.request import SpeechRequest, resolve_language
from tts_engine.serving.clauses import ClauseAssembler
from tts_engine.serving.errors import ApiError, route_class
from tts_engine.serving.schemas import Interrupt, Say
from tts_engine.serving.settings import ServingSettings
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


class SpeechSession:
    """One voice-agent conversation. `on_interrupt` lets the transport drop what it already holds."""

    def __init__(self, engine, preroll_s: float = 0.0, on_interrupt: Callable[[], None] | None = None):
        self.engine = engine
        self.preroll_s = preroll_s
        self.on_interrupt = on_interrupt
        self.audio: asyncio.Queue[np.ndarray] = asyncio.Queue()   # float32 24 kHz pieces, in play order
        self.clauses = ClauseAssembler()
        self.pending: asyncio.Queue = asyncio.Queue()
        self.worker: asyncio.Task | None = None
        self.stats: list[dict] = []
        self.playing_until = 0.0   # when the audio handed out so far will have played (monotonic)

    def say(self, text: str, fields: dict, language: str, final: bool) -> int:
        """Queue text; returns how many clauses became ready to speak."""
        clauses = self.clauses.push(text, final)
        for clause in clauses:
            self.pending.put_nowait((clause, fields, language, final and clause is clauses[-1]))
        if self.worker is None or self.worker.done():
            self.worker = asyncio.get_running_loop().create_task(self._speak())
        return len(clauses)

    async def _speak(self) -> None:
        while True:
            clause, fields, language, last = await self.pending.get()
            start = time.perf_counter()
            first, chunk = None, None
            request = SpeechRequest(text=clause, language=language, **fields)
            held = Preroll(self.preroll_s - max(0.0, self.playing_until - time.monotonic()))
            async for chunk in self.engine.generate(request):
                if first is None:
                    first = time.perf_counter() - start
                for piece in held.push(chunk.audio, chunk.is_finished):
                    await self._play(piece)
            if last:
                await self._play(TAIL_SILENCE)
            m = chunk.metrics if chunk is not None else None
            self.stats.append({"text": clause, "first_chunk_ms": round(1000 * (first or 0), 1),
                               "audio_s": round(m.audio_seconds, 3) if m else None,
                               "rtf": round(m.real_time_factor, 3) if m and m.real_time_factor else None})
            del self.stats[:-50]

    async def _play(self, audio: np.ndarray) -> None:
        self.playing_until = max(self.playing_until, time.monotonic()) + audio.shape[-1] / SAMPLE_RATE
        await self.audio.put(audio)

    def interrupt(self) -> None:
        self.playing_until = 0.0
        self.clauses.clear()
        while not self.pending.empty():
            self.pending.get_nowait()
        if self.worker is not None:
            self.worker.cancel()   # closes engine.generate -> aborts the request in both stages
            self.worker = None
        while not self.audio.empty():
            self.audio.get_nowait()
        if self.on_interrupt is not None:
            self.on_interrupt()

    def close(self) -> None:
        if self.worker is not None:
            self.worker.cancel()
            self.worker = None


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
        if len(session.clauses.buffer) + len(body.text) > settings.max_input_chars:
            raise ApiError("input_too_long", f"utterance exceeds {settings.max_input_chars} characters", "text")
        language = resolve_language(body.language, config.supported_languages)
        fields, _ = voice_request_fields(config, library, body.voice, body.instructions)
        fields["trim_leading_silence"] = body.trim_leading_silence
        queued = session.say(body.text, fields, language, body.final)
        return {"webrtc_id": body.webrtc_id, "clauses_queued": queued}

    @router.post("/v1/realtime/interrupt", summary="Stop speaking at once")
    async def interrupt(body: Interrupt) -> dict:
        session_for(body.webrtc_id).interrupt()
        return {"webrtc_id": body.webrtc_id, "interrupted": True}

    @router.get("/v1/realtime/stats/{webrtc_id}", summary="Per-clause latency of a session")
    async def stats(webrtc_id: str) -> dict:
        return {"webrtc_id": webrtc_id, "clauses": session_for(webrtc_id).stats}

    return router
