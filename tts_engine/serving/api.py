"""HTTP API: OpenAI-compatible speech and the voice library, as two FastAPI routers.

    app.include_router(speech_router(engine, library, settings, slots))
    app.include_router(voices_router(engine, library, settings, slots))

Routes (every error has the one shape of `serving.errors`):

* ``POST /v1/audio/speech``                 text -> audio (wav | pcm | flac | mp3), or a live stream of
  raw PCM (``stream: true``) or server-sent events (``stream_format: "sse"``)
* ``GET /v1/audio/voices``                  library voices (with metadata) and the preset speakers
* ``POST /v1/audio/voices``                 clone a voice from an uploaded clip (multipart)
* ``GET /v1/audio/voices/{name}``           one library voice
* ``DELETE /v1/audio/voices/{name}``        delete a library voice
* ``GET /v1/audio/voices/{name}/preview``   its stored reference clip (wav, 24 kHz)

Audio is 24 kHz mono; ``pcm`` is raw signed 16-bit little-endian. Each router answers its own errors
(validation included), so a host app needs no exception handlers. No Gradio or fastrtc here.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any
from urllib.parse import quote

import numpy as np
from fastapi import APIRouter, Body, File, Form, Request, UploadFile
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response, StreamingResponse

from tts_engine.audio import AudioError
from tts_engine.request import SpeechRequest, StreamingChunkOutput, resolve_language
from tts_engine.serving.errors import ApiError, Slots, route_class, translate
from tts_engine.serving.formats import AudioEncoder, OutputFormat, encode_file, output_format
from tts_engine.serving.metrics import instrument
from tts_engine.serving.schemas import (
    ERRORS,
    NOT_FOUND,
    ErrorResponse,
    LibraryVoice,
    SpeechCreateRequest,
    VoiceCreated,
    VoiceDeleted,
    VoiceList,
    VoiceName,
    VoiceRef,
)
from tts_engine.serving.settings import ServingSettings
from tts_engine.serving.voice_library import VoiceInfo, VoiceLibrary, validate_voice_name, voice_request_fields

log = logging.getLogger(__name__)

SAMPLE_RATE = 24000


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



_SSE_EXAMPLE = ('data: {"type": "speech.audio.delta", "audio": "AAABAAIA..."}\n\n'
                'data: {"type": "speech.audio.done", "usage": {"input_tokens": 9, "output_tokens": 40, '
                '"total_tokens": 49}, "audio_samples": 76800, ...}\n\n')



def speech_router(engine, library: VoiceLibrary, settings: ServingSettings, slots: Slots) -> APIRouter:
    """`POST /v1/audio/speech` for `engine` (a `TTSEngine`), voices from `library`."""
    router = APIRouter(route_class=route_class(settings.max_body_bytes), tags=["audio"])
    config = engine.config

    def speech_request(body: SpeechCreateRequest, language: str) -> tuple[SpeechRequest, str | None]:
        name = body.voice.id if isinstance(body.voice, VoiceRef) else body.voice
        common = {"text": body.input, "language": language, "seed": body.seed,
                  "max_new_tokens": body.max_new_tokens or settings.max_new_tokens,
                  "trim_leading_silence": body.trim_leading_silence}
        fields, used = voice_request_fields(config, library, name, body.instructions, settings.voice_aliases)
        return SpeechRequest(**fields, **common), used

    def count_tokens(text: str) -> int | None:
        try:
            return len(engine.tokenizer(text)["input_ids"])
        except Exception:  # noqa: BLE001 -- usage is informative only
            return None

    async def first_chunk(stream: AsyncIterator[StreamingChunkOutput]) -> StreamingChunkOutput:
        """Start the request; errors found while submitting become 4xx/5xx before any byte is sent
        (typed engine errors are translated by the route class)."""
        try:
            return await stream.__anext__()
        except StopAsyncIteration:
            raise ApiError("synthesis_failed", "synthesis produced no output") from None

    # ---- speech -----------------------------------------------------------------------------------
    @router.post(
        "/v1/audio/speech", summary="Create speech (OpenAI-compatible)", response_class=Response,
        description=(
            "Synthesize `input` in `voice`. Without streaming the answer is a complete file in `response_format` "
            "(wav, pcm = raw s16le, flac, mp3, opus = Ogg Opus, aac = ADTS, ulaw / alaw = raw G.711) at "
            "`sample_rate` (default 24000; ulaw/alaw 8000), mono; headers X-Sample-Rate, X-Audio-Duration, X-Frames, "
            "X-Request-Id. With `stream: true` the same format is sent as it is generated (wav and flac with "
            "headers of unknown length). With `stream_format: \"sse\"` the answer is `text/event-stream` (see the "
            "example): base64 pieces of that byte stream (raw PCM16 when `response_format` is not given). Closing "
            "the connection stops the generation. Errors: 400 (bad field, named in `error.param`), 503 when "
            "`max_concurrent` requests are running (with Retry-After)."),
        responses={200: {"description": "Audio, or an SSE stream.", "content": {
            "audio/wav": {"schema": {"type": "string", "format": "binary"}},
            "audio/pcm": {"schema": {"type": "string", "format": "binary"}},
            "audio/flac": {"schema": {"type": "string", "format": "binary"}},
            "audio/mpeg": {"schema": {"type": "string", "format": "binary"}},
            "audio/ogg": {"schema": {"type": "string", "format": "binary"}},
            "audio/aac": {"schema": {"type": "string", "format": "binary"}},
            "audio/basic": {"schema": {"type": "string", "format": "binary"}},
            "audio/x-alaw-basic": {"schema": {"type": "string", "format": "binary"}},
            "text/event-stream": {"schema": {"type": "string"}, "example": _SSE_EXAMPLE}}}, **ERRORS})
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
            raise ApiError("empty_input", "input is empty", "input")
        if len(text) > settings.max_input_chars:
            raise ApiError("input_too_long", f"input is too long ({len(text)} characters; at most "
                                             f"{settings.max_input_chars})", "input")
        if body.speed is not None and body.speed != 1.0:
            raise ApiError("unsupported_speed", f"speed {body.speed:g} is not supported: only 1.0 (the model speaks "
                                                "at its own pace; no time-stretching is applied)", "speed")
        sse = body.stream_format == "sse"
        streaming = body.stream or sse
        # SSE deltas are raw PCM16 unless a format is asked for by name (OpenAI's SSE clients expect pcm)
        name = body.response_format if not sse or "response_format" in body.model_fields_set else "pcm"
        fmt = output_format(name, body.sample_rate)
        if body.max_new_tokens is not None and body.max_new_tokens > settings.max_request_new_tokens:
            raise ApiError("invalid_value", f"max_new_tokens is at most {settings.max_request_new_tokens}",
                           "max_new_tokens")
        language = resolve_language(body.language, config.supported_languages)
        req, voice_name = speech_request(body, language)

        slots.acquire()
        request_id = f"speech-{uuid.uuid4().hex}"
        stream = instrument(engine.generate(req, request_id=request_id, max_buffered_s=settings.max_buffered_s),
                            "sse" if sse else "http")
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
        headers = {"X-Request-Id": request_id, **fmt.headers}
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
                    data = await run_in_threadpool(encode_file, audio, fmt)
                except AudioError as exc:
                    raise ApiError("encoding_failed", f"cannot encode {fmt.name}: {exc}") from None
            finally:
                await cleanup()
            extension = {"opus": "ogg", "ulaw": "ulaw", "alaw": "alaw"}.get(fmt.name, fmt.name)
            headers.update({"X-Audio-Duration": f"{len(audio) / SAMPLE_RATE:.3f}", "X-Frames": str(frames),
                            "Content-Disposition": f'inline; filename="speech.{extension}"'})
            return Response(data, media_type=fmt.content_type, headers=headers)

        headers["Cache-Control"] = "no-store"
        if sse:
            content = sse_events(stream, first, body, fmt, request_id, voice_name)
            headers["X-Accel-Buffering"] = "no"
            return _EngineStreamResponse(content, cleanup, media_type="text/event-stream", headers=headers)
        content = audio_stream(stream, first, fmt)
        return _EngineStreamResponse(content, cleanup, media_type=fmt.content_type, headers=headers)

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
                work.result()
                return chunks
            log.info("client disconnected; aborting %s", chunks[0].request_id)
            return None
        finally:
            for task in (work, watch):
                task.cancel()
            await asyncio.gather(work, watch, return_exceptions=True)

    async def audio_stream(stream, first: StreamingChunkOutput, fmt: OutputFormat) -> AsyncIterator[bytes]:
        encoder = AudioEncoder(fmt)
        try:
            async for chunk in _chunks(stream, first):
                data = encoder.push(chunk.audio)
                if data:
                    yield data
            # Any failure (a stage fault, ConsumerTooSlow) propagates: the connection is closed without the end
            # of the stream, so the client sees an incomplete response instead of a silently truncated one.
            yield encoder.finish()
        finally:
            encoder.close()

    async def sse_events(stream, first: StreamingChunkOutput, body: SpeechCreateRequest, fmt: OutputFormat,
                         request_id: str, voice_name: str | None) -> AsyncIterator[str]:
        chunk, count, frames = first, 0, 0
        encoder = AudioEncoder(fmt)
        try:
            async for chunk in _chunks(stream, first):
                frames += 0 if chunk.codec_codes is None else len(chunk.codec_codes)
                data = encoder.push(chunk.audio) + (encoder.finish() if chunk.is_finished else b"")
                if data:
                    count += 1
                    yield _sse({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode("ascii")})
        except Exception as exc:  # noqa: BLE001 -- reported in-band, the status line is already sent
            log.error("speech stream %s failed: %s", request_id, exc)
            yield _sse({"type": "error", **translate(exc).in_band()})
            return
        finally:
            encoder.close()
        samples = encoder.samples_out
        tokens = count_tokens(body.input)
        m = chunk.metrics
        yield _sse({
            "type": "speech.audio.done",
            "usage": {"input_tokens": tokens, "output_tokens": frames,
                      "total_tokens": None if tokens is None else tokens + frames},
            "request_id": request_id, "model": body.model, "voice": voice_name,
            "format": "pcm16" if fmt.name == "pcm" else fmt.name, "sample_rate": fmt.sample_rate,
            "audio_samples": samples, "audio_duration_s": round(samples / fmt.sample_rate, 3),
            "chunks": count,
            "metrics": None if m is None else {
                "first_frame_s": m.first_frame_s, "first_chunk_s": m.first_chunk_s, "finished_s": m.finished_s,
                "frames": m.frames, "real_time_factor": m.real_time_factor},
        })

    return router


def voices_router(engine, library: VoiceLibrary, settings: ServingSettings, slots: Slots) -> APIRouter:
    """`/v1/audio/voices`: the voice library (and the checkpoint's preset speakers)."""
    router = APIRouter(route_class=route_class(settings.max_body_bytes), tags=["voices"])
    config = engine.config

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
            "voices": [_describe(v, request) for v in voices],
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
            413: {"model": ErrorResponse, "description": "The upload is larger than 20 MB."}, **ERRORS})
    async def create_voice(
        request: Request,
        file: Annotated[UploadFile, File(description="Reference clip: one speaker, little background noise.")],
        name: Annotated[str, Form(description="Name of the new voice.")],
        transcript: Annotated[str | None, Form(description="What is said in the clip (enables ICL mode).")] = None,
        x_vector_only: Annotated[bool, Form(description="Keep only the speaker vector even with a transcript.")] = False,
    ) -> JSONResponse:
        name = validate_voice_name(name)
        if config.model_type != "base":
            raise ApiError("cloning_unsupported",
                           f"voice cloning needs a Base checkpoint; the loaded model is {config.model_type}")
        limit = settings.max_upload_bytes
        too_large = ApiError("file_too_large",
                             f"reference audio file is too large (at most {limit / (1024 * 1024):g} MB)", "file")
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
        return JSONResponse(_describe(info, request, notice=True), status_code=201, headers={"Location": location})

    @router.get("/v1/audio/voices/{name}", summary="Get a voice", response_model=LibraryVoice,
                responses=NOT_FOUND)
    async def get_voice(request: Request, name: VoiceName) -> dict[str, Any]:
        return _describe(await run_in_threadpool(library.info, name), request)

    @router.delete("/v1/audio/voices/{name}", summary="Delete a voice", response_model=VoiceDeleted,
                   description="Remove a library voice (its folder disappears atomically). Requests already "
                               "speaking with it finish normally.",
                   responses=NOT_FOUND)
    async def delete_voice(name: VoiceName) -> dict[str, Any]:
        info = await run_in_threadpool(library.delete, name)
        return {"object": "voice.deleted", "name": info.name if info else name, "deleted": True}

    @router.get("/v1/audio/voices/{name}/preview", summary="Listen to a voice's reference clip",
                response_class=Response, name="voice_preview",
                description="The stored reference clip (trimmed, 24 kHz mono, 16-bit wav).",
                responses={200: {"content": {"audio/wav": {"schema": {"type": "string", "format": "binary"}}}},
                           **NOT_FOUND})
    async def preview_voice(name: VoiceName) -> Response:
        def read() -> bytes:
            return library.preview_path(name).read_bytes()
        data = await run_in_threadpool(read)
        return Response(data, media_type="audio/wav", headers={"Cache-Control": "no-cache"})

    return router




def _describe(info: VoiceInfo, request: Request, notice: bool = False) -> dict[str, Any]:
    data = info.to_dict()
    data.pop("notice")
    data["type"] = "library"
    data["preview_url"] = f"{request.scope.get('root_path', '')}/v1/audio/voices/{quote(info.name, safe='')}/preview"
    if notice:
        data["notice"] = info.notice
    return data


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


async def _chunks(stream, first: StreamingChunkOutput) -> AsyncIterator[StreamingChunkOutput]:
    """`first`, then the rest of the engine stream up to its finished chunk."""
    chunk = first
    yield chunk
    while not chunk.is_finished:
        try:
            chunk = await stream.__anext__()
        except StopAsyncIteration:
            return
        yield chunk


async def _disconnected(request: Request) -> None:
    """Return when the client disconnects (the request body has been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return

