"""WebSocket `/v1/audio/speech/stream`: text in as an LLM writes it, audio out as it is made.

JSON text frames, each with a `type` (the README documents them message by message):

    client -> server   start {context_id, voice, language, instructions, response_format, sample_rate}
                       text {context_id, text}     flush {context_id}     end {context_id}     cancel {context_id}
    server -> client   audio {context_id, audio (base64), sample_rate, format}
                       done {context_id, metrics, cancelled}      error {context_id?, code, message, param}

Each context is a `ClauseSpeaker` (the clause assembly and worker shared with WebRTC `say`): speech starts
at the first complete clause; its audio is encoded in the context's format (`AudioEncoder`, resampled
with state across chunks) and sent as it comes. Several contexts run at once on one socket (each its own
engine request). A bad message gets an error event naming the context when it is known; the socket and
every other context go on. Closing the socket cancels its contexts (aborting their engine requests).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections import OrderedDict
from typing import Any

from fastapi import APIRouter, WebSocket

from tts_engine.request import resolve_language
from tts_engine.serving.errors import ApiError, translate
from tts_engine.serving.formats import AudioEncoder, output_format
from tts_engine.serving.lifecycle import Lifecycle
from tts_engine.serving.metrics import WEBSOCKETS
from tts_engine.serving.settings import ServingSettings
from tts_engine.serving.speaker import Clause, ClauseSpeaker
from tts_engine.serving.voice_library import VoiceLibrary, voice_request_fields

log = logging.getLogger(__name__)

PATH = "/v1/audio/speech/stream"
MESSAGE_TYPES = ("start", "text", "flush", "end", "cancel")
MAX_CONTEXT_ID = 128
REMEMBERED_CONTEXTS = 256      # ended context ids remembered per socket (to tell "ended" from "never started")


class StreamContext(ClauseSpeaker):
    """One context: its voice and format, its encoder, its numbers for the `done` event."""

    transport = "websocket"

    def __init__(self, connection: Connection, context_id: str, fields: dict, language: str, encoder: AudioEncoder):
        super().__init__(connection.engine, connection.settings.max_buffered_s)
        self.connection, self.context_id = connection, context_id
        self.fields, self.language, self.encoder = fields, language, encoder
        self.ending = False
        self.first_ready: float | None = None     # when the first clause was ready to speak
        self.first_audio: float | None = None     # when its first audio was sent
        self.clauses_spoken, self.frames, self.synth_s = 0, 0, 0.0

    def say(self, text: str, fields: dict, language: str, final: bool) -> int:
        queued = super().say(text, fields, language, final)
        if queued and self.first_ready is None:
            self.first_ready = time.perf_counter()
        return queued

    async def on_audio(self, audio, finished: bool) -> None:
        await self._send(self.encoder.push(audio))

    async def end_clause(self, clause: Clause, metrics) -> None:
        self.clauses_spoken += 1
        if metrics is not None:
            self.frames += metrics.frames
            self.synth_s += metrics.finished_s or 0.0
        if clause.last:   # the speaker falls silent: deliver the resampler's held-back tail
            await self._send(self.encoder.end_utterance())

    async def on_error(self, clause: Clause, exc: Exception) -> None:
        await self.connection.send_error(translate(exc), self.context_id)

    async def finish(self) -> None:
        """After `end`, once everything is spoken: the stream's last bytes, then `done`."""
        await self._send(self.encoder.finish())
        await self.connection.close_context(self, cancelled=False)

    async def _send(self, data: bytes) -> None:
        if not data:
            return
        if self.first_audio is None:
            self.first_audio = time.perf_counter()
        fmt = self.encoder.format
        await self.connection.send({"type": "audio", "context_id": self.context_id,
                                    "audio": base64.b64encode(data).decode("ascii"),
                                    "sample_rate": fmt.sample_rate, "format": fmt.name})

    def metrics(self) -> dict[str, Any]:
        fmt = self.encoder.format
        audio_s = self.encoder.samples_out / fmt.sample_rate
        ttfa = (None if self.first_audio is None or self.first_ready is None
                else round(1000 * (self.first_audio - self.first_ready), 1))
        return {"clauses": self.clauses_spoken, "frames": self.frames, "audio_seconds": round(audio_s, 3),
                "time_to_first_audio_ms": ttfa,
                "real_time_factor": round(self.synth_s / audio_s, 3) if audio_s and self.synth_s else None,
                "per_clause": self.stats}


class Connection:
    """One socket: its contexts, the messages it accepts, the one lock its sends go through."""

    def __init__(self, websocket: WebSocket, engine, library: VoiceLibrary, settings: ServingSettings):
        self.websocket, self.engine, self.library, self.settings = websocket, engine, library, settings
        self.contexts: dict[str, StreamContext] = {}
        self.ended: OrderedDict[str, None] = OrderedDict()
        self.closed = False
        self._send_lock = asyncio.Lock()

    # ---- sending -------------------------------------------------------------------------------------
    async def send(self, payload: dict) -> None:
        if self.closed:
            return
        text = json.dumps(payload, separators=(",", ":"))
        async with self._send_lock:
            try:
                await self.websocket.send_text(text)
            except Exception:  # noqa: BLE001 -- the client is gone; the receive loop ends the contexts
                self.closed = True

    async def send_error(self, error: ApiError, context_id: str | None = None) -> None:
        event: dict[str, Any] = {"type": "error"}
        if context_id is not None:
            event["context_id"] = context_id
        body = error.in_band()["error"]
        event.update(code=error.code, message=error.message, param=body["param"])
        await self.send(event)

    async def close_context(self, context: StreamContext, cancelled: bool) -> None:
        if self.contexts.get(context.context_id) is context:
            del self.contexts[context.context_id]
        self.ended[context.context_id] = None
        while len(self.ended) > REMEMBERED_CONTEXTS:
            self.ended.popitem(last=False)
        await self.send({"type": "done", "context_id": context.context_id, "cancelled": cancelled,
                         "metrics": context.metrics()})

    # ---- receiving -----------------------------------------------------------------------------------
    async def serve(self) -> None:
        try:
            while True:
                message = await self.websocket.receive()
                if message["type"] == "websocket.disconnect":
                    return
                context_id = None
                try:
                    data = self._decode(message)
                    context_id = data.get("context_id") if isinstance(data.get("context_id"), str) else None
                    self._check(data)
                    await getattr(self, f"_on_{data['type']}")(data)
                except Exception as exc:  # noqa: BLE001 -- every mistake is an error event; the socket goes on
                    await self.send_error(translate(exc), context_id)
        finally:
            self.closed = True
            for context in list(self.contexts.values()):
                await context.cancel_and_wait()   # aborts their engine requests
                context.encoder.close()
            self.contexts.clear()

    def _decode(self, message: dict) -> dict:
        text = message.get("text")
        if text is None:
            raise ApiError("invalid_message", "send JSON text frames (binary frames are not part of this protocol)")
        limit = self.settings.ws_max_message_bytes
        if len(text) > limit or len(text.encode("utf-8")) > limit:
            raise ApiError("message_too_large", f"message is larger than {limit} bytes; send text in smaller pieces")
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ApiError("invalid_json", f"message is not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise ApiError("invalid_message", "a message is a JSON object with a `type`")
        return data

    @staticmethod
    def _check(data: dict) -> None:
        kind = data.get("type")
        if kind not in MESSAGE_TYPES:
            raise ApiError("unknown_message_type", f"unknown message type {kind!r}; one of {', '.join(MESSAGE_TYPES)}",
                           "type")
        context_id = data.get("context_id")
        if context_id is None:
            raise ApiError("missing_field", "context_id is required", "context_id")
        if not isinstance(context_id, str) or not context_id or len(context_id) > MAX_CONTEXT_ID:
            raise ApiError("invalid_value", f"context_id must be a string of 1 to {MAX_CONTEXT_ID} characters",
                           "context_id")

    def _context(self, context_id: str, kind: str) -> StreamContext:
        """The open context a message names. `text` before `start` is its own mistake; other messages for a
        context that is not open name an unknown context (never started, or ended)."""
        context = self.contexts.get(context_id)
        if context is None:
            if context_id in self.ended:
                raise ApiError("unknown_context", f"context {context_id!r} has ended; start a new one", "context_id")
            if kind == "text":
                raise ApiError("context_not_started", f"text for context {context_id!r} before its start: send "
                               "{\"type\": \"start\", \"context_id\": ...} first", "context_id")
            raise ApiError("unknown_context", f"no open context {context_id!r} on this socket", "context_id")
        if kind != "cancel" and context.ending:
            raise ApiError("context_ended", f"context {context_id!r} is ending (end was sent); start a new one "
                           "for more text", "context_id")
        return context

    async def _on_start(self, data: dict) -> None:
        context_id = data["context_id"]
        if context_id in self.contexts:
            raise ApiError("context_exists", f"context {context_id!r} is already open", "context_id")
        limit = self.settings.ws_max_contexts
        if len(self.contexts) >= limit:
            raise ApiError("too_many_contexts", f"at most {limit} contexts may be open on one socket; end or cancel "
                                                "one first", "context_id")
        config = self.engine.config
        fmt = output_format(_optional(data, "response_format", str) or "pcm", _optional(data, "sample_rate", int))
        language = resolve_language(_optional(data, "language", str) or "auto", config.supported_languages)
        fields, _ = voice_request_fields(config, self.library, _optional(data, "voice", str),
                                         _optional(data, "instructions", str), self.settings.voice_aliases)
        max_new_tokens = _optional(data, "max_new_tokens", int)
        if max_new_tokens is not None and not 1 <= max_new_tokens <= self.settings.max_request_new_tokens:
            raise ApiError("invalid_value", f"max_new_tokens is 1 to {self.settings.max_request_new_tokens}",
                           "max_new_tokens")
        seed = _optional(data, "seed", int)
        trim = _optional(data, "trim_leading_silence", bool)
        fields = {**fields, "max_new_tokens": max_new_tokens or self.settings.max_new_tokens, "seed": seed,
                  "trim_leading_silence": True if trim is None else trim}
        self.ended.pop(context_id, None)
        self.contexts[context_id] = StreamContext(self, context_id, fields, language, AudioEncoder(fmt))

    async def _on_text(self, data: dict) -> None:
        context = self._context(data["context_id"], "text")
        text = data.get("text")
        if not isinstance(text, str):
            raise ApiError("invalid_value" if text is not None else "missing_field", "text must be a string", "text")
        if context.buffered_chars + len(text) > self.settings.max_input_chars:
            raise ApiError("input_too_long", f"more than {self.settings.max_input_chars} characters are waiting for a "
                                             "clause end; send punctuation or flush", "text")
        context.say(text, context.fields, context.language, final=False)

    async def _on_flush(self, data: dict) -> None:
        context = self._context(data["context_id"], "flush")
        context.say("", context.fields, context.language, final=True)

    async def _on_end(self, data: dict) -> None:
        context = self._context(data["context_id"], "end")
        context.ending = True
        context.say("", context.fields, context.language, final=True)
        context.then(context.finish)

    async def _on_cancel(self, data: dict) -> None:
        context = self._context(data["context_id"], "cancel")
        await context.cancel_and_wait()       # no audio of this context is sent after this point
        context.encoder.close()
        await self.close_context(context, cancelled=True)


def _optional(data: dict, key: str, kind: type):
    value = data.get(key)
    if value is None:
        return None
    if kind is bool:
        if not isinstance(value, bool):
            raise ApiError("invalid_value", f"{key} must be true or false", key)
        return value
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ApiError("invalid_value", f"{key} must be a {'string' if kind is str else 'number'}", key)
    return value


def stream_router(engine, library: VoiceLibrary, settings: ServingSettings, lifecycle: Lifecycle) -> APIRouter:
    """`/v1/audio/speech/stream` (WebSocket)."""
    router = APIRouter(tags=["realtime"])

    @router.websocket(PATH, name="speech_stream")
    async def speech_stream(websocket: WebSocket) -> None:
        await websocket.accept()
        connection = Connection(websocket, engine, library, settings)
        if not lifecycle.ready:
            await connection.send_error(ApiError("engine_unavailable", lifecycle.why_not_ready()))
            await websocket.close(code=1013)   # try again later
            return
        WEBSOCKETS.inc()
        try:
            await connection.serve()
        finally:
            WEBSOCKETS.dec()

    return router


__all__ = ["PATH", "Connection", "StreamContext", "stream_router"]
