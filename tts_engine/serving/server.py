"""The serving app: one FastAPI application with every route of the product but the browser UI.

`build_api` is the one place the routes are put together; `app.py` adds the WebRTC transport and the
Gradio UI to it. No Gradio or fastrtc here.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from tts_engine.serving.api import speech_router, voices_router
from tts_engine.serving.errors import ApiError, Slots, install_error_handlers
from tts_engine.serving.lifecycle import READY, Lifecycle
from tts_engine.serving.metrics import CONTENT_TYPE, engine_registry, exposition
from tts_engine.serving.realtime import SessionLookup, realtime_router
from tts_engine.serving.settings import ServingSettings
from tts_engine.serving.stream_socket import stream_router
from tts_engine.serving.voice_library import VoiceLibrary


class _NoSessions:
    def get(self, webrtc_id: str) -> None:
        return None


# New work (refused with 503 unless the lifecycle is ready); requests on running sessions go on.
NEW_WORK = {("POST", "/v1/audio/speech"), ("POST", "/v1/audio/voices"), ("POST", "/webrtc/offer")}


def engine_batch(engine) -> int:
    """Requests the engine steps together (Stage 0's max_num_seqs); 0 when unknown (a test double)."""
    stage = getattr(getattr(engine, "settings", None), "talker", None)
    return int(getattr(stage, "max_num_seqs", 0) or 0)


def build_api(engine, library: VoiceLibrary, settings: ServingSettings | None = None,
              sessions: SessionLookup | None = None, lifecycle: Lifecycle | None = None) -> FastAPI:
    """The HTTP API (speech, voices), the realtime agent routes over `sessions`, the speech WebSocket
    (`/v1/audio/speech/stream`), `/metrics` (Prometheus), `/healthz` (liveness: the engine's stage threads)
    and `/readyz` (readiness: warmed up and not shutting down)."""
    settings = settings or ServingSettings()
    lifecycle = lifecycle or Lifecycle(READY)
    app = FastAPI(title="Qwen3-TTS real-time voice", version="1.0",
                  description="Streaming text-to-speech with voice cloning: OpenAI-compatible HTTP API, "
                              "WebRTC voice-agent API and a browser UI at `/`.")
    install_error_handlers(app)
    slots = Slots(settings, engine_batch=engine_batch(engine))
    app.state.slots, app.state.settings, app.state.lifecycle = slots, settings, lifecycle

    @app.middleware("http")
    async def admission(request: Request, call_next):
        if (request.method, request.url.path) in NEW_WORK and not lifecycle.ready:
            return ApiError("engine_unavailable", lifecycle.why_not_ready()).response()
        return await call_next(request)
    app.include_router(speech_router(engine, library, settings, slots))
    app.include_router(voices_router(engine, library, settings, slots))
    app.include_router(realtime_router(engine, library, settings, sessions or _NoSessions()))
    app.include_router(stream_router(engine, library, settings, lifecycle))

    @app.get("/healthz", tags=["meta"], summary="Liveness: 503 when a stage thread of the engine stopped")
    async def health() -> JSONResponse:
        config, state = engine.config, engine.health()
        body = {"status": "ok" if state["healthy"] else "unhealthy", "model_type": config.model_type,
                "model_size": config.model_size, **state}
        return JSONResponse(body, status_code=200 if state["healthy"] else 503)

    @app.get("/readyz", tags=["meta"], summary="Readiness: 200 once warmed up, 503 while starting or stopping")
    async def ready() -> JSONResponse:
        if lifecycle.ready and engine.healthy:
            return JSONResponse({"status": "ready"})
        message = lifecycle.why_not_ready() if not lifecycle.ready else "the engine stopped working"
        return JSONResponse({"status": lifecycle.state, "message": message}, status_code=503,
                            headers={"Retry-After": "2"})

    registry = engine_registry(engine)

    @app.get("/metrics", tags=["meta"], summary="Prometheus metrics", response_class=Response,
             description="Time to first audio and real-time factor histograms, active streams, frames and audio "
                         "seconds produced, WebRTC playback underruns, each stage's queue depth, errors by code "
                         "(Prometheus text format; the series are listed in `tts_engine/serving/metrics.py`).")
    async def metrics() -> Response:
        return Response(exposition(registry), media_type=CONTENT_TYPE)

    return app
