"""HTTP API: OpenAI-compatible speech and the voice library, as one FastAPI router.

    app.include_router(create_api_router(engine, library, ApiSettings()))

Routes (all JSON errors have the OpenAI shape ``{"error": {"message", "type", "param", "code"}}``):

* ``POST /v1/audio/speech``                 text -> audio (wav | pcm | flac | mp3), or a live stream of
  raw PCM (``stream: true``) or server-sent events (``stream_format: "sse"``)
* ``GET /v1/audio/voices``                  library voices (with metadata) and the preset speakers
* ``POST /v1/audio/voices``                 clone a voice from an uploaded clip (multipart)
* ``GET /v1/audio/voices/{name}``           one library voice
* ``DELETE /v1/audio/voices/{name}``        delete a library voice
* ``GET /v1/audio/voices/{name}/preview``   its stored reference clip (wav, 24 kHz)

Audio is 24 kHz mono; ``pcm`` is raw signed 16-bit little-endian. The router is self-contained: it
answers its own errors (validation included), so the host app needs no exception handlers.
This module must not import Gradio or fastrtc.
"""

import asyncio
import base64
import json
import logging
import struct
import threading
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal
from urllib.parse import quote

import numpy as np
from fastapi import APIRouter, Body, File, Form, HTTPException, Path, Request, UploadFile
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field

from tts_engine.audio import ENCODE_FORMATS, AudioError, encode_audio, float_to_int16
from tts_engine.request import RequestError, SpeechRequest
from tts_engine.streaming import StreamFailed, StreamingChunkOutput
from tts_engine.voices import (
    VoiceInfo,
    VoiceLibrary,
    VoiceLibraryError,
    validate_voice_name,
    voice_request_fields,
)

log = logging.getLogger(__name__)

SAMPLE_RATE = 24000
SAMPLES_PER_FRAME = 1920
CONTENT_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm", "flac": "audio/flac", "mp3": "audio/mpeg"}
PCM_HEADERS = {"X-Sample-Rate": str(SAMPLE_RATE), "X-Channels": "1", "X-Sample-Format": "s16le"}
# OpenAI/ISO-639-1 codes accepted as aliases of the checkpoint's language names.
LANGUAGE_ALIASES = {"en": "english", "zh": "chinese", "ja": "japanese", "ko": "korean", "de": "german",
                    "fr": "french", "ru": "russian", "pt": "portuguese", "es": "spanish", "it": "italian"}


@dataclass
class ApiSettings:
    """Limits of the HTTP API. Read on every request, so they can be changed while serving."""

    max_input_chars: int = 5000               # longer `input` -> 400 input_too_long
    max_concurrent: int = 8                   # synthesis + cloning requests at once; more -> 503
    retry_after_s: int = 2                    # Retry-After header of a 503
    max_upload_bytes: int = 20 * 1024 * 1024  # reference clip upload; larger -> 413
    max_new_tokens: int | None = None      # default frame cap per request (12.5 frames = 1 s); None: stage config
    max_request_new_tokens: int = 8192        # largest `max_new_tokens` a request may ask for


# ---------------------------------------------------------------------------------------------------
# Models (OpenAPI)
# ---------------------------------------------------------------------------------------------------


VoiceName = Annotated[str, Path(description="Voice name (case-insensitive).")]


class ErrorDetail(BaseModel):
    message: str = Field(description="What is wrong, safe to show to a user.")
    type: str = Field(description="invalid_request_error (4xx) or server_error (5xx).")
    param: str | None = Field(None, description="The request field at fault, if any.")
    code: str | None = Field(None, description="Machine-readable reason, e.g. voice_not_found, input_too_long.")


class ErrorResponse(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{"error": {
        "message": "unknown voice 'nova'; available: alice, bob", "type": "invalid_request_error",
        "param": "voice", "code": "voice_not_found"}}]})
    error: ErrorDetail


class VoiceRef(BaseModel):
    """OpenAI's object form of a custom voice."""

    id: str = Field(description="A library voice name or preset speaker.")


class SpeechCreateRequest(BaseModel):
    """OpenAI `audio.speech.create` body, plus `language`, `stream` and `max_new_tokens`."""

    model_config = ConfigDict(extra="ignore", json_schema_extra={"examples": [
        {"model": "qwen3-tts", "input": "Hello! How can I help you today?", "voice": "alice",
         "response_format": "wav"}]})

    model: str | None = Field(None, description="Accepted for OpenAI compatibility and echoed back (X-Model "
                                 "header, SSE done event); the server always uses its loaded checkpoint.")
    input: str = Field(description="The text to speak (at most `max_input_chars`, default 5000).")
    voice: str | VoiceRef | None = Field(
        None, description="Base checkpoints: a library voice name (required; see GET /v1/audio/voices). "
                          "CustomVoice: one of the preset speakers (required). VoiceDesign: ignored "
                          "(describe the voice in `instructions`). Names match case-insensitively.")
    language: str = Field("auto", description="`auto` or a language the checkpoint supports (e.g. english, "
                          "chinese); ISO codes such as `en` are accepted.")
    instructions: str | None = Field(None, description="VoiceDesign: the voice description (required). "
                                        "CustomVoice 1.7B: style instructions. Ignored by Base checkpoints.")
    response_format: Literal["wav", "pcm", "flac", "mp3"] = Field(
        "wav", description="Container of the answer. `pcm` is raw signed 16-bit little-endian, 24 kHz mono. "
                           "Streaming supports `pcm` and `wav` only.")
    speed: float | None = Field(None, description="Only 1.0 is supported (accepted for OpenAI compatibility).")
    stream: bool = Field(False, description="Send audio while it is generated (chunked transfer). With "
                         "`response_format` pcm the body is raw PCM16; with wav, a streaming WAV header "
                         "(unknown length) followed by PCM16.")
    stream_format: Literal["audio", "sse"] = Field(
        "audio", description="`sse` streams server-sent events (implies `stream`): "
                             "`{\"type\":\"speech.audio.delta\",\"audio\":\"<base64 PCM16>\"}` per chunk, then "
                             "`{\"type\":\"speech.audio.done\",\"usage\":{...},\"metrics\":{...}}`. SSE deltas are "
                             "always raw PCM16 (24 kHz mono).")
    max_new_tokens: int | None = Field(None, ge=1, description="Cap on generated codec frames (12.5 per "
                                          "second of audio). Default: the server's setting / stage config.")
    seed: int | None = Field(None, ge=0, description="Sampling seed for reproducible output.")


class LibraryVoice(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "name": "alice", "type": "library", "mode": "icl", "created": "2025-01-01T12:00:00+00:00",
        "duration_s": 4.2, "transcript": "The quick brown fox.", "model_type": "base", "model_size": "0b6",
        "hidden_size": 1024, "compatible": True, "ref_frames": 53, "trimmed": False,
        "preview_url": "/v1/audio/voices/alice/preview"}]})

    name: str
    type: Literal["library"] = "library"
    mode: Literal["icl", "x_vector"] = Field(description="icl: speaker vector + reference codes + transcript; "
                                             "x_vector: speaker vector only.")
    created: str = Field(description="ISO 8601 time (UTC).")
    duration_s: float = Field(description="Length of the stored (possibly trimmed) reference clip.")
    transcript: str | None
    model_type: str
    model_size: str
    hidden_size: int
    compatible: bool = Field(description="False when the voice was cloned for another model; it cannot be used.")
    ref_frames: int
    trimmed: bool
    preview_url: str


class VoiceCreated(LibraryVoice):
    notice: str | None = Field(None, description="What the caller should know, e.g. that the clip was trimmed "
                                  "to 30 s, or that without a transcript only the speaker vector is kept.")


class PresetSpeaker(BaseModel):
    name: str
    type: Literal["preset"] = "preset"
    dialect: str | None = None


class ModelDescription(BaseModel):
    model_type: str
    model_size: str
    hidden_size: int
    supports_cloning: bool
    supports_instructions: bool
    languages: list[str]


class VoiceList(BaseModel):
    object: Literal["list"] = "list"
    model: ModelDescription
    voices: list[LibraryVoice]
    speakers: list[PresetSpeaker]


class VoiceDeleted(BaseModel):
    object: Literal["voice.deleted"] = "voice.deleted"
    name: str
    deleted: bool = True


# ---------------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------------


class ApiError(HTTPException):
    """An error answered as ``{"error": {...}}`` (subclasses HTTPException so FastAPI re-raises it
    from body parsing)."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(status_code=status, detail=message, headers=headers)
        self.message, self.param, self.code = message, param, code

    def response(self) -> JSONResponse:
        kind = "server_error" if self.status_code >= 500 else "invalid_request_error"
        body = {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status_code, headers=self.headers)


_LIBRARY_STATUS = {"voice_exists": 409, "voice_not_found": 404, "file_too_large": 413, "voice_damaged": 500}


def _library_error(exc: VoiceLibraryError, not_found_status: int = 404) -> ApiError:
    status = _LIBRARY_STATUS.get(exc.code, 400)
    if exc.code == "voice_not_found":
        status = not_found_status
    return ApiError(status, str(exc), param=exc.param, code=exc.code)


def _validation_error(exc: RequestValidationError) -> ApiError:
    """Pydantic/FastAPI validation errors, answered 400 in the OpenAI shape (like OpenAI and vLLM)."""
    errors = list(exc.errors()) or [{"loc": (), "msg": "invalid request", "type": "invalid"}]
    parts, first_param, first_code = [], None, None
    for err in errors:
        loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path", "header", "cookie")]
        param = ".".join(loc) or None
        kind = err.get("type", "invalid")
        if kind == "json_invalid":
            message, param, code = f"request body is not valid JSON ({err.get('ctx', {}).get('error', '')})", None, \
                "invalid_json"
        elif kind == "missing" and param is None:
            message, code = "request body is missing", "missing_body"
        elif kind == "missing":
            message, code = f"{param} is required", "missing_field"
        elif kind in ("literal_error", "enum"):
            message = f"unsupported {param} {err.get('input')!r}: {err.get('msg', '')}"
            code = f"unsupported_{param}" if param in ("response_format", "stream_format") else "invalid_value"
        else:
            message, code = f"{param or 'request'}: {err.get('msg', 'invalid value')}", "invalid_value"
        parts.append(message)
        if first_code is None:
            first_param, first_code = param, code
    return ApiError(400, "; ".join(parts), param=first_param, code=first_code)


def _route_class(settings: ApiSettings) -> type[APIRoute]:
    """Every route answers its own errors and refuses oversized bodies before reading them."""

    class ApiRoute(APIRoute):
        def get_route_handler(self):
            handler = super().get_route_handler()

            async def route(request: Request) -> Response:
                try:
                    request = await _limit_body(request, settings.max_upload_bytes + 1024 * 1024)
                    return await handler(request)
                except ApiError as exc:
                    return exc.response()
                except RequestValidationError as exc:
                    return _validation_error(exc).response()
                except VoiceLibraryError as exc:
                    return _library_error(exc).response()
                except RequestError as exc:
                    return ApiError(400, str(exc)).response()
                except HTTPException as exc:   # e.g. FastAPI's "error parsing the body" (400)
                    return ApiError(exc.status_code, str(exc.detail), headers=exc.headers).response()
                except Exception as exc:
                    log.exception("%s %s failed", request.method, request.url.path)
                    return ApiError(500, f"internal error: {type(exc).__name__}: {exc}",
                                    code="internal_error").response()

            return route

    return ApiRoute


async def _limit_body(request: Request, limit: int) -> Request:
    """413 for a body over `limit` bytes: at once from Content-Length, else while it is read. Bodies
    up to 4x the limit are read to the end first, so the client gets the 413 instead of a reset."""
    too_large = ApiError(413, f"request body is larger than {limit // (1024 * 1024)} MB", code="file_too_large")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        if int(declared) <= 4 * limit:
            await _drain(request.receive)
        raise too_large
    received = 0
    receive = request.receive

    async def limited_receive():
        nonlocal received
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > limit:
                if message.get("more_body", False):
                    await _drain(receive, 3 * limit)
                raise too_large
        return message

    return Request(request.scope, limited_receive, getattr(request, "_send", None) or _no_send)


async def _no_send(message) -> None:  # pragma: no cover - Request() needs a send callable
    raise RuntimeError("send is not available here")


async def _drain(receive, budget: int | None = None) -> None:
    read = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return
        read += len(message.get("body", b""))
        if not message.get("more_body", False) or (budget is not None and read > budget):
            return


class _Slots:
    """Counts running synthesis/cloning requests against `settings.max_concurrent`."""

    def __init__(self, settings: ApiSettings):
        self.settings = settings
        self.active = 0
        self._lock = threading.Lock()

    def acquire(self) -> None:
        with self._lock:
            if self.active >= max(1, int(self.settings.max_concurrent)):
                raise ApiError(503, f"the server is busy ({self.active} requests running, limit "
                                    f"{self.settings.max_concurrent}); retry shortly", code="server_busy",
                               headers={"Retry-After": str(int(self.settings.retry_after_s))})
            self.active += 1

    def release(self) -> None:
        with self._lock:
            self.active = max(0, self.active - 1)


class _EngineStreamResponse(StreamingResponse):
    """A streaming response that always runs `cleanup` (abort the engine request, free the slot),
    whether the stream ended, failed, or the client went away - even if it never started."""

    def __init__(self, content, cleanup, **kwargs):
        super().__init__(content, **kwargs)
        self._cleanup = cleanup

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                close = getattr(self.body_iterator, "aclose", None)
                if close is not None:
                    await close()
            finally:
                await self._cleanup()


# ---------------------------------------------------------------------------------------------------
# The router
# ---------------------------------------------------------------------------------------------------

_ERRORS = {
    400: {"model": ErrorResponse, "description": "Invalid request (the body names the field and the problem)."},
    503: {"model": ErrorResponse, "description": "Too many requests running; retry after `Retry-After` seconds."},
    "4XX": {"model": ErrorResponse, "description": "Other client errors, same error shape."},
}
_NOT_FOUND = {404: {"model": ErrorResponse, "description": "No such voice."},
              "4XX": {"model": ErrorResponse, "description": "Other client errors, same error shape."}}
_SSE_EXAMPLE = ('data: {"type": "speech.audio.delta", "audio": "AAABAAIA..."}\n\n'
                'data: {"type": "speech.audio.done", "usage": {"input_tokens": 9, "output_tokens": 40, '
                '"total_tokens": 49}, "audio_samples": 76800, ...}\n\n')


def create_api_router(engine, library: VoiceLibrary, settings: ApiSettings | None = None) -> APIRouter:
    """The API routes for `engine` (a `TTSEngine`) and its voice `library`."""
    settings = settings or ApiSettings()
    router = APIRouter(route_class=_route_class(settings), tags=["audio"])
    slots = _Slots(settings)
    router.slots = slots  # type: ignore[attr-defined]  # for diagnostics/tests
    config = engine.config

    # ---- helpers ----------------------------------------------------------------------------------
    def language_of(body: SpeechCreateRequest) -> str:
        raw = (body.language or "auto").strip().lower()
        language = LANGUAGE_ALIASES.get(raw, raw)
        if language not in config.supported_languages:
            raise ApiError(400, f"unsupported language {body.language!r}; supported: "
                                f"{', '.join(config.supported_languages)}", param="language",
                           code="unsupported_language")
        return language

    def speech_request(body: SpeechCreateRequest, language: str) -> tuple[SpeechRequest, str | None]:
        name = body.voice.id if isinstance(body.voice, VoiceRef) else body.voice
        common = {"text": body.input, "language": language, "seed": body.seed,
                  "max_new_tokens": body.max_new_tokens or settings.max_new_tokens}
        try:
            fields, used = voice_request_fields(config, library, name, body.instructions)
        except VoiceLibraryError as exc:
            raise _library_error(exc, not_found_status=400) from None
        return SpeechRequest(**fields, **common), used

    def describe(info: VoiceInfo, request: Request, notice: bool = False) -> dict[str, Any]:
        data = info.to_dict()
        data.pop("notice")
        data["type"] = "library"
        data["preview_url"] = f"{request.scope.get('root_path', '')}/v1/audio/voices/{quote(info.name, safe='')}/preview"
        if notice:
            data["notice"] = info.notice
        return data

    def count_tokens(text: str) -> int | None:
        try:
            return len(engine.tokenizer(text)["input_ids"])
        except Exception:  # noqa: BLE001 -- usage is informative only
            return None

    async def first_chunk(stream: AsyncIterator[StreamingChunkOutput]) -> StreamingChunkOutput:
        """Start the request; errors found while submitting become 4xx/5xx before any byte is sent."""
        try:
            return await stream.__anext__()
        except RequestError as exc:
            raise ApiError(400, str(exc), code="invalid_request") from None
        except StreamFailed as exc:
            if "max_model_len" in str(exc):
                raise ApiError(400, f"input is too long for the model's context: {exc}", param="input",
                               code="input_too_long") from None
            log.error("speech request failed: %s", exc)
            raise ApiError(500, f"synthesis failed: {exc}", code="synthesis_failed") from None
        except StopAsyncIteration:
            raise ApiError(500, "synthesis produced no output", code="synthesis_failed") from None
        except RuntimeError as exc:
            raise ApiError(503, f"the engine is not available: {exc}", code="engine_unavailable",
                           headers={"Retry-After": str(int(settings.retry_after_s))}) from None

    # ---- speech -----------------------------------------------------------------------------------
    @router.post(
        "/v1/audio/speech", summary="Create speech (OpenAI-compatible)", response_class=Response,
        description=(
            "Synthesize `input` in `voice`. Without streaming the answer is a complete file in `response_format` "
            "(`Content-Type` audio/wav, audio/flac, audio/mpeg or audio/pcm; 24 kHz mono; headers X-Audio-Duration, "
            "X-Frames, X-Request-Id). With `stream: true` the audio is sent as it is generated: raw PCM16 LE "
            "(`pcm`) or a WAV header of unknown length followed by PCM16 (`wav`); flac/mp3 cannot stream. With "
            "`stream_format: \"sse\"` the answer is `text/event-stream` (see the example). Closing the connection "
            "stops the generation. Errors: 400 (bad field, named in `error.param`), 503 when "
            "`max_concurrent` requests are running (with Retry-After)."),
        responses={200: {"description": "Audio, or an SSE stream.", "content": {
            "audio/wav": {"schema": {"type": "string", "format": "binary"}},
            "audio/pcm": {"schema": {"type": "string", "format": "binary"}},
            "audio/flac": {"schema": {"type": "string", "format": "binary"}},
            "audio/mpeg": {"schema": {"type": "string", "format": "binary"}},
            "text/event-stream": {"schema": {"type": "string"}, "example": _SSE_EXAMPLE}}}, **_ERRORS})
    async def create_speech(
        request: Request,
        body: Annotated[SpeechCreateRequest, Body(openapi_examples={
            "file": {"summary": "A wav file", "value": {"input": "Hello there!", "voice": "alice"}},
            "stream": {"summary": "Live raw PCM", "value": {"input": "Hello there!", "voice": "alice",
                                                             "response_format": "pcm", "stream": True}},
            "sse": {"summary": "Server-sent events", "value": {"input": "Hello there!", "voice": "alice",
                                                               "stream_format": "sse"}},
        })],
    ) -> Response:
        text = body.input
        if not text.strip():
            raise ApiError(400, "input is empty", param="input", code="empty_input")
        if len(text) > settings.max_input_chars:
            raise ApiError(400, f"input is too long ({len(text)} characters; at most {settings.max_input_chars})",
                           param="input", code="input_too_long")
        if body.speed is not None and body.speed != 1.0:
            raise ApiError(400, f"speed {body.speed:g} is not supported (only 1.0)", param="speed",
                           code="unsupported_speed")
        fmt = body.response_format
        sse = body.stream_format == "sse"
        streaming = body.stream or sse
        if streaming and fmt not in ("pcm", "wav"):
            raise ApiError(400, f"response_format {fmt!r} cannot be streamed; use pcm or wav (or stream: false)",
                           param="response_format", code="unsupported_response_format")
        if body.max_new_tokens is not None and body.max_new_tokens > settings.max_request_new_tokens:
            raise ApiError(400, f"max_new_tokens is at most {settings.max_request_new_tokens}",
                           param="max_new_tokens", code="invalid_value")
        language = language_of(body)
        req, voice_name = speech_request(body, language)

        slots.acquire()
        request_id = f"speech-{uuid.uuid4().hex}"
        stream = engine.generate(req, request_id=request_id)
        released = False

        async def cleanup() -> None:
            nonlocal released
            try:
                await stream.aclose()   # aborts the engine request if it is still running
            finally:
                if not released:
                    released = True
                    slots.release()

        try:
            first = await first_chunk(stream)
        except BaseException:
            await cleanup()
            raise
        headers = {"X-Request-Id": request_id, **PCM_HEADERS}
        if body.model:
            headers["X-Model"] = body.model
        if voice_name:
            headers["X-Voice"] = quote(voice_name, safe="")

        if not streaming:
            try:
                chunks = await collect(request, stream, first)
                if chunks is None:
                    return Response(status_code=499)   # the client went away; the request was aborted
                audio = np.concatenate([c.audio for c in chunks]) if chunks else np.zeros(0, np.float32)
                frames = sum(0 if c.codec_codes is None else len(c.codec_codes) for c in chunks)
                try:
                    data = await run_in_threadpool(encode_audio, audio, SAMPLE_RATE, fmt)
                except AudioError as exc:
                    raise ApiError(500, f"cannot encode {fmt}: {exc}", code="encoding_failed") from None
            finally:
                await cleanup()
            headers.update({"X-Audio-Duration": f"{len(audio) / SAMPLE_RATE:.3f}", "X-Frames": str(frames),
                            "Content-Disposition": f'inline; filename="speech.{fmt}"'})
            return Response(data, media_type=CONTENT_TYPES[fmt], headers=headers)

        headers["Cache-Control"] = "no-store"
        if sse:
            content = sse_events(stream, first, body, request_id, voice_name)
            headers["X-Accel-Buffering"] = "no"
            return _EngineStreamResponse(content, cleanup, media_type="text/event-stream", headers=headers)
        content = pcm_stream(stream, first, wav_header=fmt == "wav")
        return _EngineStreamResponse(content, cleanup, media_type=CONTENT_TYPES[fmt], headers=headers)

    async def collect(request: Request, stream, first: StreamingChunkOutput) -> list[StreamingChunkOutput] | None:
        """All chunks of a non-streaming request, or None when the client disconnected first."""
        chunks = [first]

        async def rest() -> None:
            chunk = first
            while not chunk.is_finished:
                try:
                    chunk = await stream.__anext__()
                except StopAsyncIteration:
                    return
                chunks.append(chunk)

        work = asyncio.ensure_future(rest())
        watch = asyncio.ensure_future(_disconnected(request))
        try:
            done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
            if work in done:
                try:
                    work.result()
                except StreamFailed as exc:
                    raise ApiError(500, f"synthesis failed: {exc}", code="synthesis_failed") from None
                return chunks
            log.info("client disconnected; aborting %s", chunks[0].request_id)
            return None
        finally:
            for task in (work, watch):
                task.cancel()
            await asyncio.gather(work, watch, return_exceptions=True)

    async def pcm_stream(stream, first: StreamingChunkOutput, wav_header: bool) -> AsyncIterator[bytes]:
        if wav_header:
            yield _streaming_wav_header()
        chunk = first
        while True:
            if chunk.audio.size:
                yield _pcm16(chunk.audio)
            if chunk.is_finished:
                return
            try:
                chunk = await stream.__anext__()
            except StopAsyncIteration:
                return
            # Any other failure propagates: the connection is closed without the final chunk, so the
            # client sees an incomplete response instead of a silently truncated one.

    async def sse_events(stream, first: StreamingChunkOutput, body: SpeechCreateRequest, request_id: str,
                         voice_name: str | None) -> AsyncIterator[str]:
        chunk, samples, count, frames = first, 0, 0, 0
        try:
            while True:
                if chunk.audio.size:
                    samples += chunk.audio.shape[0]
                    count += 1
                    audio = base64.b64encode(_pcm16(chunk.audio)).decode("ascii")
                    yield _sse({"type": "speech.audio.delta", "audio": audio})
                frames += 0 if chunk.codec_codes is None else len(chunk.codec_codes)
                if chunk.is_finished:
                    break
                chunk = await stream.__anext__()
        except StopAsyncIteration:
            pass
        except Exception as exc:  # noqa: BLE001 -- reported in-band, the status line is already sent
            log.error("speech stream %s failed: %s", request_id, exc)
            yield _sse({"type": "error", "error": {"message": f"synthesis failed: {exc}", "type": "server_error",
                                                   "param": None, "code": "synthesis_failed"}})
            return
        tokens = count_tokens(body.input)
        m = chunk.metrics
        yield _sse({
            "type": "speech.audio.done",
            "usage": {"input_tokens": tokens, "output_tokens": frames,
                      "total_tokens": None if tokens is None else tokens + frames},
            "request_id": request_id, "model": body.model, "voice": voice_name, "format": "pcm16",
            "sample_rate": SAMPLE_RATE, "audio_samples": samples, "audio_duration_s": round(samples / SAMPLE_RATE, 3),
            "chunks": count,
            "metrics": None if m is None else {
                "first_frame_s": m.first_frame_s, "first_chunk_s": m.first_chunk_s, "finished_s": m.finished_s,
                "frames": m.frames, "real_time_factor": m.real_time_factor},
        })

    # ---- voices -----------------------------------------------------------------------------------
    @router.get("/v1/audio/voices", summary="List voices", response_model=VoiceList,
                description="Library voices with their metadata (voices cloned for another model are listed with "
                            "`compatible: false`) and the checkpoint's preset speakers (CustomVoice).")
    async def list_voices(request: Request) -> dict[str, Any]:
        voices = await run_in_threadpool(library.list)
        return {
            "object": "list",
            "model": {"model_type": config.model_type, "model_size": config.model_size,
                      "hidden_size": library.signature.hidden_size, "supports_cloning": config.model_type == "base",
                      "supports_instructions": config.supports_instruct, "languages": config.supported_languages},
            "voices": [describe(v, request) for v in voices],
            "speakers": [{"name": s, "type": "preset", "dialect": config.talker.speaker_dialect.get(s)}
                         for s in config.supported_speakers],
        }

    @router.post(
        "/v1/audio/voices", summary="Create a voice (clone from a clip)", status_code=201,
        response_model=VoiceCreated,
        description=(
            "Upload a reference clip (wav, flac, mp3, ogg, m4a, ...; 1 to 30 s of speech, at most 20 MB) and an "
            "optional transcript. With a transcript the voice is saved in ICL mode (speaker vector + reference "
            "codes), which clones more closely; without one (or with `x_vector_only`) only the speaker vector "
            "is kept. Clips longer than 30 s are cut (see `notice`). Names: 1-64 letters, digits, spaces and "
            "- _ . ' ( ), unique ignoring case. Base checkpoints only."),
        responses={201: {"description": "The saved voice.", "headers": {"Location": {
            "description": "URL of the voice", "schema": {"type": "string"}}}},
            409: {"model": ErrorResponse, "description": "A voice with this name exists."},
            413: {"model": ErrorResponse, "description": "The upload is larger than 20 MB."}, **_ERRORS})
    async def create_voice(
        request: Request,
        file: Annotated[UploadFile, File(description="Reference clip: one speaker, little background noise.")],
        name: Annotated[str, Form(description="Name of the new voice.")],
        transcript: Annotated[str | None, Form(description="What is said in the clip (enables ICL mode).")] = None,
        x_vector_only: Annotated[bool, Form(description="Keep only the speaker vector even with a transcript.")] = False,
    ) -> JSONResponse:
        name = validate_voice_name(name)
        if config.model_type != "base":
            raise ApiError(400, f"voice cloning needs a Base checkpoint; the loaded model is {config.model_type}",
                           code="cloning_unsupported")
        limit = settings.max_upload_bytes
        too_large = ApiError(413, f"reference audio file is too large (at most {limit / (1024 * 1024):g} MB)",
                             param="file", code="file_too_large")
        if file.size is not None and file.size > limit:
            raise too_large
        data = await file.read(limit + 1)
        if len(data) > limit:
            raise too_large
        slots.acquire()
        try:
            info = await run_in_threadpool(library.create, name, data, transcript, x_vector_only, engine)
        finally:
            slots.release()
        log.info("created voice %r (%s, %.1f s)", info.name, info.mode, info.duration_s)
        location = f"{request.scope.get('root_path', '')}/v1/audio/voices/{quote(info.name, safe='')}"
        return JSONResponse(describe(info, request, notice=True), status_code=201, headers={"Location": location})

    @router.get("/v1/audio/voices/{name}", summary="Get a voice", response_model=LibraryVoice,
                responses=_NOT_FOUND)
    async def get_voice(request: Request, name: VoiceName) -> dict[str, Any]:
        return describe(await run_in_threadpool(library.info, name), request)

    @router.delete("/v1/audio/voices/{name}", summary="Delete a voice", response_model=VoiceDeleted,
                   description="Remove a library voice (its folder disappears atomically). Requests already "
                               "speaking with it finish normally.",
                   responses=_NOT_FOUND)
    async def delete_voice(name: VoiceName) -> dict[str, Any]:
        info = await run_in_threadpool(library.delete, name)
        return {"object": "voice.deleted", "name": info.name if info else name, "deleted": True}

    @router.get("/v1/audio/voices/{name}/preview", summary="Listen to a voice's reference clip",
                response_class=Response, name="voice_preview",
                description="The stored reference clip (trimmed, 24 kHz mono, 16-bit wav).",
                responses={200: {"content": {"audio/wav": {"schema": {"type": "string", "format": "binary"}}}},
                           **_NOT_FOUND})
    async def preview_voice(name: VoiceName) -> Response:
        def read() -> bytes:
            return library.preview_path(name).read_bytes()
        data = await run_in_threadpool(read)
        return Response(data, media_type="audio/wav", headers={"Cache-Control": "no-cache"})

    return router


# ---------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------


def _pcm16(audio: np.ndarray) -> bytes:
    return float_to_int16(audio).astype("<i2", copy=False).tobytes()


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


def _streaming_wav_header(sample_rate: int = SAMPLE_RATE) -> bytes:
    """RIFF/WAVE header for 16-bit mono PCM of unknown length (sizes 0xFFFFFFFF, as streaming servers do)."""
    unknown = 0xFFFFFFFF
    return (b"RIFF" + struct.pack("<I", unknown) + b"WAVE" + b"fmt " +
            struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16) +
            b"data" + struct.pack("<I", unknown))


async def _disconnected(request: Request) -> None:
    """Return when the client disconnects (the request body has been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


__all__ = [
    "CONTENT_TYPES",
    "ENCODE_FORMATS",
    "ApiError",
    "ApiSettings",
    "ErrorResponse",
    "LibraryVoice",
    "PresetSpeaker",
    "SpeechCreateRequest",
    "VoiceCreated",
    "VoiceDeleted",
    "VoiceList",
    "create_api_router",
]
