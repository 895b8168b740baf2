"""A voice-agent client for the app's WebRTC API (aiortc), used by the benchmark and the tests.

It opens a session the way an agent would: fastrtc's `POST /webrtc/offer` with a silent microphone
track and a data channel, then records every received 20 ms frame (arrival time, RMS, samples at
24 kHz) so callers can measure time to first audio, gaps and durations.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import numpy as np

SAMPLE_RATE = 24000


class AgentSession:
    def __init__(self, url: str, webrtc_id: str | None = None):
        from aiortc import RTCConfiguration, RTCPeerConnection

        self.url = url.rstrip("/")
        self.webrtc_id = webrtc_id or uuid.uuid4().hex
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.frames: list[tuple[float, float, int]] = []   # (perf_counter, int16 RMS, samples at 24 kHz)
        self.packet_times: list[float] = []                 # perf_counter of each audio RTP packet handled
        self._arrived = asyncio.Event()                     # set on every packet and every frame
        self.messages: list[str] = []
        self._reader: asyncio.Task | None = None
        self._connected = asyncio.Event()
        self._channel_open = asyncio.Event()

    @property
    def headers(self) -> dict[str, str]:
        """Sent with every call of this session (offer, `say`, `interrupt`, `stats`): behind Ray Serve they
        route the call to the replica holding the session (Serve's multiplexed-id header; on the offer they let
        the router place the session and remember where); a single process ignores them."""
        return {"serve_multiplexed_model_id": self.webrtc_id}

    async def offer(self, client) -> "object":
        """Create the offer and POST it; returns the HTTP response (the answer is applied if given)."""
        from aiortc import RTCSessionDescription
        from aiortc.mediastreams import AudioStreamTrack

        channel = self.pc.createDataChannel("text")
        channel.on("message", self.messages.append)
        channel.on("open", self._channel_open.set)
        self.pc.addTrack(AudioStreamTrack())
        self.pc.on("track", self._on_track)
        self.pc.on("connectionstatechange", self._on_state)
        await self.pc.setLocalDescription(await self.pc.createOffer())
        self._watch_packets()
        response = await client.post(self.url + "/webrtc/offer", headers=self.headers, json={
            "sdp": self.pc.localDescription.sdp, "type": "offer", "webrtc_id": self.webrtc_id})
        if response.status_code == 200 and response.json().get("type") == "answer":
            await self.pc.setRemoteDescription(RTCSessionDescription(sdp=response.json()["sdp"], type="answer"))
        return response

    async def open(self, client, timeout: float = 20) -> None:
        response = await self.offer(client)
        if response.status_code != 200 or response.json().get("type") != "answer":
            raise RuntimeError(f"offer refused: {response.status_code} {response.text}")
        # Connected, and the data channel open: fastrtc starts a session's handler (its emit loop) only once
        # it has the channel, so a `say` sent before then waits for the rest of the handshake.
        await asyncio.wait_for(asyncio.gather(self._connected.wait(), self._channel_open.wait()), timeout)

    def _on_state(self) -> None:
        if self.pc.connectionState == "connected":
            self._connected.set()

    def _watch_packets(self) -> None:
        """Note each audio RTP packet as aiortc's transport hands it to the receiver, instead of polling the
        receiver's stats: with many sessions in one client process, polling every few ms was itself a load
        that delayed what it measured."""
        for receiver in self.pc.getReceivers():
            handle = receiver._handle_rtp_packet

            async def noted(packet, arrival_time_ms, _handle=handle):
                self.packet_times.append(time.perf_counter())
                self._arrived.set()
                await _handle(packet, arrival_time_ms)

            receiver._handle_rtp_packet = noted

    async def _next_arrival(self, deadline: float) -> bool:
        """Wait for the next packet or frame; False once `deadline` (perf_counter) has passed."""
        self._arrived.clear()
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            return False
        try:
            await asyncio.wait_for(self._arrived.wait(), remaining)
        except asyncio.TimeoutError:
            return False
        return True

    def _on_track(self, track) -> None:
        self._reader = asyncio.ensure_future(self._read(track))

    async def _read(self, track) -> None:
        from aiortc.mediastreams import MediaStreamError

        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            pcm = frame.to_ndarray().astype(np.float32)
            self.frames.append((time.perf_counter(), float(np.sqrt(np.mean(pcm ** 2))),
                                int(frame.samples * SAMPLE_RATE / frame.sample_rate)))
            self._arrived.set()

    def audible_since(self, t0: float, threshold: float) -> list[tuple[float, float, int]]:
        return [f for f in self.frames if f[0] >= t0 and f[1] > threshold]

    async def packets_received(self) -> int:
        """Audio RTP packets received so far."""
        return len(self.packet_times)

    async def first_packet(self, t0: float, before: int, limit_s: float = 30) -> float | None:
        """Seconds from t0 until packet number `before` + 1 arrived: when audio reached this machine, before
        aiortc's receive jitter buffer holds it back (it releases the first frame only once 4 packets, 80 ms,
        are in; a browser's jitter buffer adapts instead)."""
        deadline = t0 + limit_s
        while len(self.packet_times) <= before:
            if not await self._next_arrival(deadline):
                return None
        return self.packet_times[before] - t0

    async def first_audible(self, t0: float, threshold: float, limit_s: float = 30) -> float | None:
        """Seconds from t0 to the first audible frame, or None if none arrives within limit_s."""
        deadline, seen = t0 + limit_s, 0
        while True:
            for when, rms, _ in self.frames[seen:]:
                if when >= t0 and rms > threshold:
                    return when - t0
            seen = len(self.frames)
            if not await self._next_arrival(deadline):
                return None

    async def wait_quiet(self, threshold: float, quiet_s: float = 1.0, limit_s: float = 60) -> bool:
        """Until no audible frame arrived for quiet_s; False if audio was still playing at limit_s."""
        start = time.perf_counter()
        while time.perf_counter() - start < limit_s:
            loud = [t for t, rms, _ in self.frames if rms > threshold]
            last = max(loud[-1], start) if loud else start
            if time.perf_counter() - last > quiet_s:
                return True
            await asyncio.sleep(0.05)
        return False

    async def close(self) -> None:
        await self.pc.close()
        if self._reader is not None:
            self._reader.cancel()
