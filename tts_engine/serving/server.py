"""The serving app: one FastAPI application with every route of the product but the browser UI.

`build_api` is the one place the routes are put together; `app.py` adds the WebRTC transport and the
Gradio UI to it. No Gradio or fastrtc here.
"""

from __future__ import annotations

from fastapi import FastAPI

from tts_engine.serving.api import speech_router, voices_router
from tts_engine.serving.errors import Slots, install_error_handlers
from tts_engine.serving.realtime import SessionLookup, realtime_router
from tts_engine.serving.settings import ServingSettings
from tts_engine.serving.voice_library import VoiceLibrary


class _NoSessions:
    def get(self, webrtc_id: str) -> None:
        return None


def build_api(engine, library: VoiceLibrary, settings: ServingSettings | None = None,
              sessions: SessionLookup | None = None) -> FastAPI:
    """The HTTP API (speech, voices), the realtime agent routes over `sessions` and `/healthz`."""
    settings = settings or ServingSettings()
    app = FastAPI(title="Qwen3-TTS real-time voice", version="1.0",
                  description="Streaming text-to-speech with voice cloning: OpenAI-compatible HTTP API, "
                              "WebRTC voice-agent API and a browser UI at `/`.")
    install_error_handlers(app)
    slots = Slots(settings)
    app.state.slots, app.state.settings = slots, settings
    app.include_router(speech_router(engine, library, settings, slots))
    app.include_router(voices_router(engine, library, settings, slots))
    app.include_router(realtime_router(engine, library, settings, sessions or _NoSessions()))

    @app.get("/healthz", tags=["meta"])
    async def health() -> dict:
        config = engine.config
        return {"status": "ok", "model_type": config.model_type, "model_size": config.model_size}

    return app
