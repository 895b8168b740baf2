"""A voice agent over WebRTC: an aiortc client on loopback against the live app.

Offer via fastrtc's /webrtc/offer, `say`, receive the audio track; check time to first audio, gaps,
the received duration against what the engine synthesized, and that `interrupt` stops the audio.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx
import numpy as np
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import AudioStreamTrack, MediaStreamError

AUDIBLE_RMS = 200.0      # int16 units; random-weight speech is far louder, Opus silence is ~0
FRAME_S = 0.02


class Session:
    """One agent connection: an aiortc peer with a silent mic track and a data channel."""

    def __init__(self, url: str):
        self.url, self.webrtc_id = url, uuid.uuid4().hex
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.frames: list[tuple[float, float]] = []     # (arrival time, rms)
        self.reader: asyncio.Task | None = None
        self.connected = asyncio.Event()
        self.messages: list[str] = []

    async def open(self, client: httpx.AsyncClient) -> None:
        channel = self.pc.createDataChannel("text")
        channel.on("message", self.messages.append)
        self.pc.addTrack(AudioStreamTrack())

        @self.pc.on("track")
        def on_track(track):
            self.reader = asyncio.ensure_future(self._read(track))

        @self.pc.on("connectionstatechange")
        def on_state():
            if self.pc.connectionState == "connected":
                self.connected.set()

        await self.pc.setLocalDescription(await self.pc.createOffer())
        r = await client.post(self.url + "/webrtc/offer", json={
            "sdp": self.pc.localDescription.sdp, "type": "offer", "webrtc_id": self.webrtc_id})
        answer = r.json()
        assert r.status_code == 200 and answer.get("type") == "answer", answer
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type="answer"))
        await asyncio.wait_for(self.connected.wait(), 20)

    async def _read(self, track) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            pcm = frame.to_ndarray().astype(np.float32)
            self.frames.append((time.perf_counter(), float(np.sqrt(np.mean(pcm ** 2)))))

    def audible_since(self, t0: float) -> list[tuple[float, float]]:
        return [(t, rms) for t, rms in self.frames if t >= t0 and rms > AUDIBLE_RMS]

    async def wait_quiet(self, quiet_s: float = 1.5, limit_s: float = 60) -> None:
        """Until no audible frame arrived for `quiet_s` (frames keep coming or stop entirely)."""
        start = time.perf_counter()
        while time.perf_counter() - start < limit_s:
            audible = [t for t, rms in self.frames if rms > AUDIBLE_RMS]
            last = audible[-1] if audible else start
            if time.perf_counter() - last > quiet_s:
                return
            await asyncio.sleep(0.1)
        raise AssertionError("audio never stopped")

    async def close(self) -> None:
        await self.pc.close()
        if self.reader:
            self.reader.cancel()


async def _wait_first_audio(session: Session, t0: float, limit_s: float = 30) -> float:
    while time.perf_counter() - t0 < limit_s:
        audible = session.audible_since(t0)
        if audible:
            return audible[0][0] - t0
        await asyncio.sleep(0.005)
    raise AssertionError("no audio arrived")


def test_say_streams_gapless_audio_and_interrupt_stops_it(live_app, capsys):
    async def scenario():
        async with httpx.AsyncClient(timeout=30) as client:
            session = Session(live_app)
            await session.open(client)
            try:
                # 1. One utterance: measure TTFA, gaps and duration.
                t0 = time.perf_counter()
                r = await client.post(live_app + "/v1/realtime/say", json={
                    "webrtc_id": session.webrtc_id, "text": "Hello from the agent.", "voice": "sample"})
                assert r.status_code == 200, r.text
                ttfa = await _wait_first_audio(session, t0)
                await session.wait_quiet()
                audible = session.audible_since(t0)
                span = [t for t, _ in session.frames if audible[0][0] <= t <= audible[-1][0]]
                gaps = np.diff(span)
                stats = (await client.get(f"{live_app}/v1/realtime/stats/{session.webrtc_id}")).json()["clauses"]
                synthesized = sum(c["audio_s"] for c in stats)
                received = len(span) * FRAME_S
                with capsys.disabled():
                    print(f"\n[webrtc] time to first audio {1000 * ttfa:.0f} ms, max gap {1000 * gaps.max():.0f} ms,"
                          f" received {received:.2f} s of {synthesized:.2f} s synthesized")
                assert synthesized > 1.0
                assert gaps.max() <= 0.100, f"gap of {gaps.max() * 1000:.0f} ms after the first frame"
                assert abs(received - synthesized) <= 0.200

                # 2. Text in pieces, then interrupt while it plays.
                t1 = time.perf_counter()
                for piece, final in [("This is streamed", False), (" text from an LLM. And", False),
                                     (" more follows here.", True)]:
                    r = await client.post(live_app + "/v1/realtime/say", json={
                        "webrtc_id": session.webrtc_id, "text": piece, "voice": "sample", "final": final})
                    assert r.status_code == 200, r.text
                await _wait_first_audio(session, t1)
                await asyncio.sleep(0.5)
                t_stop = time.perf_counter()
                r = await client.post(live_app + "/v1/realtime/interrupt", json={"webrtc_id": session.webrtc_id})
                assert r.status_code == 200 and r.json()["interrupted"]
                await session.wait_quiet(quiet_s=1.0)
                after = [t for t, _ in session.audible_since(t_stop)]
                tail = (after[-1] - t_stop) if after else 0.0
                with capsys.disabled():
                    print(f"[webrtc] audio stopped {1000 * tail:.0f} ms after interrupt")
                # Two clauses of 3.2 s were queued; without the interrupt ~6 s would still play.
                assert tail <= 0.5, f"audio kept playing {tail:.2f} s after interrupt"
            finally:
                await session.close()

    asyncio.run(scenario())


def test_realtime_errors(live_app):
    with httpx.Client(timeout=30) as client:
        r = client.post(live_app + "/v1/realtime/say", json={"webrtc_id": "nope", "text": "hi", "voice": "sample"})
        assert r.status_code == 404 and "no WebRTC session" in r.json()["error"]["message"]
        r = client.post(live_app + "/v1/realtime/interrupt", json={"webrtc_id": "nope"})
        assert r.status_code == 404
        r = client.post(live_app + "/v1/realtime/say", json={"text": "hi"})
        assert 400 <= r.status_code < 500


def test_too_many_sessions_get_503_with_retry_after(live_app):
    from tests.conftest import LIVE_APP_SESSIONS

    async def scenario():
        sessions, refused = [], None
        async with httpx.AsyncClient(timeout=30) as client:
            try:
                for _ in range(LIVE_APP_SESSIONS + 1):
                    session = Session(live_app)
                    await session.pc.setLocalDescription(await session.pc.createOffer())
                    r = await client.post(live_app + "/webrtc/offer", json={
                        "sdp": session.pc.localDescription.sdp, "type": "offer", "webrtc_id": session.webrtc_id})
                    sessions.append(session)
                    if r.status_code == 503:
                        refused = r
                        break
                    assert r.status_code == 200 and r.json().get("type") == "answer", r.text
            finally:
                for session in sessions:
                    await session.pc.close()
        return refused

    refused = asyncio.run(scenario())
    assert refused is not None, "the session limit was never enforced"
    assert refused.headers.get("retry-after")
    assert "too many concurrent sessions" in refused.json()["error"]["message"]
