"""Text that arrives in pieces, spoken clause by clause: the part every voice-agent transport shares.

`ClauseSpeaker` assembles clauses from streamed text (`ClauseAssembler`) and speaks them one after
another on a worker task (one engine request per clause, while earlier audio plays), so speech starts
as soon as the first clause is complete. A transport subclasses it and says what happens to the audio:
`SpeechSession` (realtime.py) queues it for a WebRTC track; the WebSocket context (stream_socket.py)
encodes it and sends it as events. `cancel` stops at once: the running engine request is aborted in
both stages, queued clauses are dropped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass

import numpy as np

from tts_engine.request import RequestMetrics, SpeechRequest
from tts_engine.serving.clauses import ClauseAssembler
from tts_engine.serving.metrics import instrument

log = logging.getLogger(__name__)


@dataclass
class Clause:
    text: str
    fields: dict            # SpeechRequest fields of the voice (see voice_request_fields) and sampling
    language: str
    last: bool              # the last clause of an utterance (`final` text): the speaker falls silent after it


class ClauseSpeaker:
    """Clauses in, audio out through the hooks, one engine request at a time. Not thread-safe: use it on the
    event loop that serves the transport."""

    transport = "agent"          # metrics label
    max_stats = 50

    def __init__(self, engine, max_buffered_s: float | None = None):
        self.engine = engine
        self.max_buffered_s = max_buffered_s
        self.clauses = ClauseAssembler()
        self.pending: asyncio.Queue[Clause | Callable[[], Awaitable[None]]] = asyncio.Queue()
        self.worker: asyncio.Task | None = None
        self.stats: list[dict] = []

    # ---- input -----------------------------------------------------------------------------------
    def say(self, text: str, fields: dict, language: str, final: bool) -> int:
        """Queue text; returns how many clauses became ready to speak (`final`: all of what is buffered)."""
        clauses = self.clauses.push(text, final)
        for clause in clauses:
            self.pending.put_nowait(Clause(clause, fields, language, final and clause is clauses[-1]))
        if clauses:
            self._wake()
        return len(clauses)

    def then(self, callback: Callable[[], Awaitable[None]]) -> None:
        """Run `callback` on the worker once everything queued before it has been spoken."""
        self.pending.put_nowait(callback)
        self._wake()

    @property
    def buffered_chars(self) -> int:
        return len(self.clauses.buffer)

    # ---- stopping ----------------------------------------------------------------------------------
    def cancel(self) -> asyncio.Task | None:
        """Stop now: drop buffered text and queued clauses, abort the running engine request. Returns the
        cancelled worker (await it to be sure no more audio comes), or None."""
        self.clauses.clear()
        while not self.pending.empty():
            self.pending.get_nowait()
        worker, self.worker = self.worker, None
        if worker is not None and not worker.done():
            worker.cancel()   # closes engine.generate -> aborts the request in both stages
            return worker
        return None

    async def cancel_and_wait(self) -> None:
        worker = self.cancel()
        if worker is not None:
            await asyncio.gather(worker, return_exceptions=True)

    # ---- hooks for the transport -------------------------------------------------------------------
    def begin_clause(self, clause: Clause) -> None:
        """Before the clause's engine request starts."""

    async def on_audio(self, audio: np.ndarray, finished: bool) -> None:
        """Each delta of the clause's audio (float32, 24 kHz), in order; `finished` on the clause's last."""

    async def end_clause(self, clause: Clause, metrics: RequestMetrics | None) -> None:
        """After the clause's last audio."""

    async def on_error(self, clause: Clause, exc: Exception) -> None:
        """The clause failed (a bad request, a stage fault, a slow consumer); the worker goes on with the next."""
        log.error("%s: clause %r failed: %s", type(self).__name__, clause.text[:40], exc)

    # ---- the worker ----------------------------------------------------------------------------------
    def _wake(self) -> None:
        if self.worker is None or self.worker.done():
            self.worker = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while not self.pending.empty():
            item = self.pending.get_nowait()
            if isinstance(item, Clause):
                await self._speak(item)
            else:
                await item()

    async def _speak(self, clause: Clause) -> None:
        start = time.perf_counter()
        first, chunk = None, None
        self.begin_clause(clause)
        try:
            request = SpeechRequest(text=clause.text, language=clause.language, **clause.fields)
            stream = instrument(self.engine.generate(request, max_buffered_s=self.max_buffered_s), self.transport)
            async with aclosing(stream):
                async for chunk in stream:
                    if first is None:
                        first = time.perf_counter() - start
                    await self.on_audio(chunk.audio, chunk.is_finished)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 -- the transport reports it; the next clause still runs
            await self.on_error(clause, exc)
            return
        m = chunk.metrics if chunk is not None else None
        await self.end_clause(clause, m)
        self.stats.append({"text": clause.text, "first_chunk_ms": round(1000 * (first or 0), 1),
                           "audio_s": round(m.audio_seconds, 3) if m else None,
                           "rtf": round(m.real_time_factor, 3) if m and m.real_time_factor else None})
        del self.stats[:-self.max_stats]
