"""The WebRTC transport for voice agents: fastrtc's peer connections carrying `SpeechSession` audio.

`build_agent_api` is the HTTP API of `server.build_api` plus fastrtc's `POST /webrtc/offer`, no UI: `app.py`
mounts the Gradio UI over it, and every Ray Serve replica (`ray_app.py`) serves it as it is. fastrtc is
imported lazily (it pulls Gradio in); nothing here is needed to use the engine.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from tts_engine.serving.settings import ServingSettings

SAMPLE_RATE = 24000
log = logging.getLogger("tts_engine.serving.webrtc")


def rtc_configuration() -> tuple[Any, Any, str | None]:
    """(client config, server config, warning) for WebRTC.

    Hugging Face Spaces only forwards HTTPS, so media needs a TURN relay: with HF_TOKEN (or Cloudflare
    TURN keys) set we use fastrtc's Cloudflare helpers. Elsewhere peers reach each other directly.
    """
    from fastrtc import get_cloudflare_turn_credentials, get_cloudflare_turn_credentials_async

    has_turn = bool(os.environ.get("HF_TOKEN") or (os.environ.get("CLOUDFLARE_TURN_KEY_ID")
                                                    and os.environ.get("CLOUDFLARE_TURN_KEY_API_TOKEN")))
    on_spaces = os.environ.get("SYSTEM") == "spaces"
    if has_turn:
        return get_cloudflare_turn_credentials_async, get_cloudflare_turn_credentials(ttl=360_000), None
    warning = None
    if on_spaces:
        warning = ("WebRTC audio needs a TURN server on Hugging Face Spaces, and none is configured: add an "
                   "HF_TOKEN secret (or CLOUDFLARE_TURN_KEY_ID + CLOUDFLARE_TURN_KEY_API_TOKEN) in the Space "
                   "settings. Until then audio cannot reach your browser; the HTTP API still works.")
        log.error(warning)
    return {"iceServers": []}, {"iceServers": []}, warning


LATE_FRAME_S = 0.04   # a frame this late on its track's timeline starts the timeline anew (see below)


def patch_fastrtc_generator_track() -> None:
    """Two fixes to fastrtc 0.0.34's generator track (`ServerToClientAudio`, the one the UI streams on).

    End: its `recv()` stops the track and *returns None* when the stream ends (CloseStream or the generator's
    end). aiortc's RTCRtpSender then hands None to the Opus encoder's `pack()` and logs "AttributeError:
    'NoneType' object has no attribute 'pts'" with a traceback for every UI utterance. An aiortc track says
    it has ended by raising MediaStreamError, which the sender expects.

    Pacing: it paces frames by the stream's timeline since its first frame and never starts it again
    (fastrtc's handler tracks do, after 200 ms without frames). When the engine falls behind playback (a
    loaded CPU), the frames that come after the track ran dry are late on that timeline and went out at once,
    in a burst, until it had caught up; a browser's jitter buffer answers a burst by holding or dropping
    audio. A frame more than `LATE_FRAME_S` late now goes out at once and the timeline restarts at it, so
    the frames after it are paced from there.
    """
    from aiortc.mediastreams import MediaStreamError
    from fastrtc.tracks import ServerToClientAudio

    original = ServerToClientAudio.recv
    if getattr(original, "patched_here", False):
        return

    async def recv(self):
        frame = await original(self)
        if frame is None:      # the track has just been stopped by fastrtc
            raise MediaStreamError
        now = time.time()      # fastrtc's clock for `_start`
        if self._start is not None and frame.time is not None and now - (self._start + frame.time) > LATE_FRAME_S:
            self._start = now - frame.time
        return frame

    recv.patched_here = True
    ServerToClientAudio.recv = recv


def make_agent_handler_class():
    from fastrtc import AsyncStreamHandler, wait_for_item

    from tts_engine.serving.realtime import SpeechSession

    class AgentSpeaker(AsyncStreamHandler):
        """One per WebRTC connection: sends its `SpeechSession`'s audio on the connection's track."""

        def __init__(self, engine=None, preroll_s: float = 0.0):
            super().__init__(output_sample_rate=SAMPLE_RATE, input_sample_rate=48000)
            self.engine, self.preroll_s = engine, preroll_s
            self.session = SpeechSession(engine, preroll_s, on_interrupt=self._drop_queued_frames)

        def copy(self) -> "AgentSpeaker":
            return AgentSpeaker(self.engine, self.preroll_s)

        async def receive(self, frame) -> None:
            return None  # the agent's microphone track (or a silent one) is not used

        async def emit(self):
            audio = await wait_for_item(self.session.audio, 0.02)
            return None if audio is None else (SAMPLE_RATE, audio.reshape(1, -1))

        def _drop_queued_frames(self) -> None:
            try:
                self.clear_queue()     # frames fastrtc already holds for the track
            except Exception:  # noqa: BLE001 -- nothing queued yet
                pass

        def shutdown(self) -> None:
            self.session.close()

    return AgentSpeaker


def connect_within(stream, timeout_s: float) -> None:
    """fastrtc closes an answered session whose peer has not connected (ICE + DTLS) after a fixed 30 s
    (`handle_offer` starts `self.connection_timeout(pc, webrtc_id, 30)`); until then a peer that left
    mid-handshake holds one of the `max_sessions` slots. This stream's sessions get `timeout_s` instead."""
    fixed = stream.connection_timeout

    async def connection_timeout(pc, webrtc_id: str, time_limit: float) -> None:
        await fixed(pc, webrtc_id, timeout_s)
    stream.connection_timeout = connection_timeout


class FastrtcSessions:
    """The realtime routes' view of fastrtc's connections: webrtc_id -> SpeechSession."""

    def __init__(self, stream):
        self.stream = stream

    def get(self, webrtc_id: str):
        handler = self.stream.handlers.get(webrtc_id)
        return handler.session if handler is not None and webrtc_id in self.stream.pcs else None


def build_agent_api(engine, library, settings: ServingSettings, lifecycle=None):
    """`build_api` plus fastrtc's `POST /webrtc/offer` for voice agents (no UI): what app.py serves under the
    UI and what each Ray Serve replica serves (ray_app.py). Returns (app, rtc_warning)."""
    from fastrtc import Stream
    from fastrtc.stream import Body

    from tts_engine.serving.errors import ApiError
    from tts_engine.serving.server import build_api, engine_batch

    rtc_client, rtc_server, rtc_warning = rtc_configuration()
    limit = settings.session_limit(engine_batch(engine))
    stream = Stream(make_agent_handler_class()(engine, settings.preroll_s), mode="send-receive", modality="audio",
                    concurrency_limit=limit, time_limit=settings.session_time_limit_s,
                    rtc_configuration=rtc_client, server_rtc_configuration=rtc_server)
    connect_within(stream, settings.session_connect_timeout_s)
    app = build_api(engine, library, settings, sessions=FastrtcSessions(stream), lifecycle=lifecycle)
    app.state.stream = stream

    async def offer(body: Body):
        """fastrtc's offer, behind the one refusal of a session over the limit (503 too_many_sessions). Counted
        here, after the body is read: from this check to fastrtc adding the connection nothing awaits, so a
        burst of offers cannot slip past it and meet fastrtc's own check (a 200 with a body of another
        shape). Trickle ICE candidates of admitted sessions pass whatever the count."""
        if body.type == "offer" and len(stream.pcs) >= limit:
            return ApiError("too_many_sessions", f"too many concurrent sessions (limit {limit}); "
                                                 "retry shortly").response()
        return await stream.offer(body)
    offer.__annotations__["body"] = Body    # fastrtc is imported here, not at module level: give FastAPI the class

    # Only the route we use and document. `stream.mount(app)` would also add WS /websocket/offer (a mu-law
    # audio socket for the agent handler) and POST /telephone/incoming + WS /telephone/handler (Twilio),
    # unauthenticated, undocumented and untested here.
    app.post("/webrtc/offer", tags=["realtime"], summary="Open a WebRTC session (fastrtc signalling)")(offer)
    patch_fastrtc_generator_track()
    app.state.rtc = (rtc_client, rtc_server)
    return app, rtc_warning
