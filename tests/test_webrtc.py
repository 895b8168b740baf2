"""A voice agent over WebRTC: an aiortc client on loopback against the live app.

Offer via fastrtc's /webrtc/offer, `say`, receive the audio track; check time to first audio, gaps,
the received duration against what the engine synthesized, and that `interrupt` stops the audio.
"""

from __future__ import annotations

import asyncio
import os
import time

import httpx
import numpy as np

from tts_engine.tools.webrtc_client import AgentSession

AUDIBLE_RMS = 200.0      # int16 units; random-weight speech is far louder, Opus silence is ~0
FRAME_S = 0.02


def _audible_since(session: AgentSession, t0: float) -> list[tuple[float, float]]:
    return [(t, rms) for t, rms, _ in session.audible_since(t0, AUDIBLE_RMS)]


async def _wait_quiet(session: AgentSession, quiet_s: float = 1.5) -> None:
    assert await session.wait_quiet(AUDIBLE_RMS, quiet_s), "audio never stopped"


async def _wait_first_audio(session: AgentSession, t0: float, limit_s: float = 30) -> float:
    delay = await session.first_audible(t0, AUDIBLE_RMS, limit_s)
    assert delay is not None, "no audio arrived"
    return delay


def test_say_streams_gapless_audio_and_interrupt_stops_it(live_app, capsys):
    async def scenario():
        async with httpx.AsyncClient(timeout=30) as client:
            session = AgentSession(live_app)
            await session.open(client)
            try:
                # 1. One utterance: measure TTFA, gaps and duration.
                t0 = time.perf_counter()
                r = await client.post(live_app + "/v1/realtime/say", json={
                    "webrtc_id": session.webrtc_id, "text": "Hello from the agent.", "voice": "sample"})
                assert r.status_code == 200, r.text
                ttfa = await _wait_first_audio(session, t0)
                await _wait_quiet(session)
                audible = _audible_since(session, t0)
                span = [t for t, _, _ in session.frames if audible[0][0] <= t <= audible[-1][0]]
                gaps = np.diff(span)
                answer = (await client.get(f"{live_app}/v1/realtime/stats/{session.webrtc_id}")).json()
                stats = answer["clauses"]
                synthesized = sum(c["audio_s"] for c in stats)
                received = len(span) * FRAME_S
                with capsys.disabled():
                    print(f"\n[webrtc] time to first audio {1000 * ttfa:.0f} ms, max gap {1000 * gaps.max():.0f} ms,"
                          f" received {received:.2f} s of {synthesized:.2f} s synthesized")
                assert synthesized > 1.0
                # Gapless: a gap the listener hears is one the server counted as an underrun (the engine ran behind
                # the pre-roll: a loaded machine's speed, which the bench measures), never one the transport adds.
                heard = gaps[gaps > 0.100]
                assert len(heard) <= answer["underruns"] and heard.sum() <= answer["underrun_s"] + 0.100 * len(heard), \
                    (f"gaps of {np.round(heard * 1000)} ms after the first frame; the server counted"
                     f" {answer['underruns']} underruns ({answer['underrun_s']} s)")
                assert abs(received - synthesized) <= 0.200

                # 2. Text in pieces, then interrupt while it plays.
                t1 = time.perf_counter()
                for piece, final in [("This is streamed", False), (" text from an LLM. And", False),
                                     (" more follows here.", True)]:
                    r = await client.post(live_app + "/v1/realtime/say", json={
                        "webrtc_id": session.webrtc_id, "text": piece, "voice": "sample", "final": final})
                    assert r.status_code == 200, r.text
                await _wait_first_audio(session, t1)
                while len(_audible_since(session, t1)) < 25:      # let half a second of it play
                    await asyncio.sleep(0.02)
                t_stop = time.perf_counter()
                r = await client.post(live_app + "/v1/realtime/interrupt", json={"webrtc_id": session.webrtc_id})
                assert r.status_code == 200 and r.json()["interrupted"]
                await _wait_quiet(session, quiet_s=1.0)
                heard_after = len(_audible_since(session, t_stop)) * FRAME_S
                with capsys.disabled():
                    print(f"[webrtc] {heard_after:.2f} s of audio arrived after interrupt")
                # Two clauses of 3.2 s were queued and only ~0.5 s had played: without the interrupt
                # more than 5 s of audio would still arrive.
                assert heard_after <= 0.5, f"{heard_after:.2f} s of audio arrived after interrupt"
            finally:
                await session.close()

    asyncio.run(scenario())


def test_a_peer_that_hangs_up_mid_utterance_has_its_request_aborted(live_app, capsys):
    async def scenario():
        async with httpx.AsyncClient(timeout=30) as client:
            session = AgentSession(live_app)
            await session.open(client)
            t0 = time.perf_counter()
            r = await client.post(live_app + "/v1/realtime/say", json={
                "webrtc_id": session.webrtc_id, "text": "A long sentence nobody will hear to its end. " * 3,
                "voice": "sample"})
            assert r.status_code == 200, r.text
            await _wait_first_audio(session, t0)
            busy = (await client.get(live_app + "/healthz")).json()["active_requests"]
            assert busy, "nothing was being synthesized when the peer left: the test would prove nothing"
            await session.close()                       # the peer goes away mid-utterance
            closed = time.perf_counter()
            while (await client.get(live_app + "/healthz")).json()["active_requests"]:
                assert time.perf_counter() - closed < 30, "the engine request outlived its peer"
                await asyncio.sleep(0.02)   # polling the engine's request count
            return time.perf_counter() - closed

    elapsed = asyncio.run(scenario())
    with capsys.disabled():
        print(f"\n[webrtc] peer hung up: engine request gone {1000 * elapsed:.0f} ms later")
    assert elapsed <= 1.0, f"the request outlived its peer by {elapsed:.2f} s (issue: within 1 s)"


def test_realtime_errors(live_app):
    with httpx.Client(timeout=30) as client:
        r = client.post(live_app + "/v1/realtime/say", json={"webrtc_id": "nope", "text": "hi", "voice": "sample"})
        assert r.status_code == 404 and "no WebRTC session" in r.json()["error"]["message"]
        assert r.json()["error"]["code"] == "unknown_session"
        r = client.post(live_app + "/v1/realtime/interrupt", json={"webrtc_id": "nope"})
        assert r.status_code == 404
        r = client.post(live_app + "/v1/realtime/say", json={"text": "hi"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "missing_field"


def test_realtime_bad_fields_are_the_same_mistakes_as_on_the_speech_route(live_app):
    """An unknown voice is 400 unknown_voice on /v1/realtime/say as on /v1/audio/speech (it was 404)."""
    async def scenario():
        async with httpx.AsyncClient(timeout=30) as client:
            session = AgentSession(live_app)
            await session.open(client)
            try:
                answers = {}
                for field, value in (("voice", "nobody"), ("language", "klingon")):
                    body = {"webrtc_id": session.webrtc_id, "text": "Hi.", "voice": "sample", field: value}
                    answers[field] = await client.post(live_app + "/v1/realtime/say", json=body)
                    speech = {"input": "Hi.", "voice": "sample", field: value}
                    answers["speech_" + field] = await client.post(live_app + "/v1/audio/speech", json=speech)
                return answers
            finally:
                await session.close()

    answers = asyncio.run(scenario())
    for field, code in (("voice", "unknown_voice"), ("language", "unsupported_language")):
        for route in (field, "speech_" + field):
            r = answers[route]
            assert r.status_code == 400 and r.json()["error"]["code"] == code, (route, r.text)
            assert r.json()["error"]["param"] == field


def test_too_many_sessions_get_503_with_retry_after(live_app):
    from tests.conftest import LIVE_APP_SESSIONS

    async def scenario():
        sessions, refused = [], None
        async with httpx.AsyncClient(timeout=30) as client:
            try:
                for _ in range(LIVE_APP_SESSIONS + 1):
                    session = AgentSession(live_app)
                    r = await session.offer(client)
                    sessions.append(session)
                    if r.status_code == 503:
                        refused = r
                        break
                    assert r.status_code == 200 and r.json().get("type") == "answer", r.text
            finally:
                for session in sessions:
                    await session.close()
        return refused

    refused = asyncio.run(scenario())
    assert refused is not None, "the session limit was never enforced"
    assert refused.headers.get("retry-after")
    error = refused.json()["error"]
    assert "too many concurrent sessions" in error["message"]
    assert error["code"] == "too_many_sessions" and error["type"] == "server_error"   # the one shape


def test_a_burst_of_offers_over_the_limit_gets_the_one_refusal(live_app):
    """Offers sent at once: fastrtc registers a connection only after its SDP work, so the limit must count
    offers still being answered; every refusal is our 503, never fastrtc's 200 {"status": "failed"}."""
    from tests.conftest import LIVE_APP_SESSIONS

    async def scenario():
        sessions = [AgentSession(live_app) for _ in range(LIVE_APP_SESSIONS + 3)]
        async with httpx.AsyncClient(timeout=30) as client:
            try:
                return await asyncio.gather(*(s.offer(client) for s in sessions))
            finally:
                for session in sessions:
                    await session.close()

    answers = asyncio.run(scenario())
    accepted = [r for r in answers if r.status_code == 200]
    refused = [r for r in answers if r.status_code != 200]
    assert all(r.json().get("type") == "answer" for r in accepted), [r.text for r in accepted]
    assert 0 < len(accepted) <= LIVE_APP_SESSIONS and len(refused) >= 3
    assert all(r.status_code == 503 and r.json()["error"]["code"] == "too_many_sessions" for r in refused)


def test_a_peer_that_never_connects_frees_its_session_slot(live_app):
    """Peers that take an answer and never connect (gone mid-handshake) hold every slot at first; each is
    closed once the connect timeout has passed, long before fastrtc's own 30 s, and its id is unknown from
    then on."""
    from aiortc import RTCPeerConnection
    from aiortc.mediastreams import AudioStreamTrack

    from tests.conftest import LIVE_APP_CONNECT_TIMEOUT_S, LIVE_APP_SESSIONS

    async def raw_offer(client, webrtc_id: str):
        pc = RTCPeerConnection()
        pc.createDataChannel("text")
        pc.addTrack(AudioStreamTrack())
        await pc.setLocalDescription(await pc.createOffer())
        response = await client.post(live_app + "/webrtc/offer", json={
            "sdp": pc.localDescription.sdp, "type": "offer", "webrtc_id": webrtc_id})
        return pc, response

    async def scenario():
        async with httpx.AsyncClient(timeout=30) as client:
            ghosts: list = []
            try:
                # Sessions of the tests before may still hold slots (closed after the same timeout): take every
                # slot in one go, or let what was taken expire and try again. The answers are never applied:
                # these peers never connect.
                start, attempt = time.monotonic(), 0
                while True:
                    attempt += 1
                    ids = [f"ghost{attempt}x{i}x{os.getpid()}" for i in range(LIVE_APP_SESSIONS)]
                    taken = [await raw_offer(client, webrtc_id) for webrtc_id in ids]
                    ghosts += [pc for pc, _ in taken]
                    if all(r.status_code == 200 for _, r in taken) or time.monotonic() - start > 60:
                        break
                    await asyncio.sleep(LIVE_APP_CONNECT_TIMEOUT_S + 1)
                for _, r in taken:
                    assert r.status_code == 200 and r.json().get("type") == "answer", r.text
                print(f"\n[connect timeout] slots free after {time.monotonic() - start:.1f} s")
                answered = time.monotonic()
                probe, full = await raw_offer(client, "probe" + str(os.getpid()))
                await probe.close()
                assert full.status_code == 503, "the unconnected sessions should hold every slot at first"
                deadline = answered + LIVE_APP_CONNECT_TIMEOUT_S + 8     # well before fastrtc's own 30 s
                while True:                                # a real peer gets a slot again, and connects
                    fresh = AgentSession(live_app)
                    try:
                        await fresh.open(client)
                        break
                    except RuntimeError as refused:        # 503 too_many_sessions
                        assert "503" in str(refused), refused
                    finally:
                        await fresh.close()
                    assert time.monotonic() < deadline, "unconnected sessions still hold the slots"
                    await asyncio.sleep(0.5)
                # Each ghost expires its own timeout after its answer (they were answered one after another):
                # the first may have freed the slot above while the last still waits. By the deadline, all are gone.
                pending = list(ids)
                while pending:
                    for webrtc_id in list(pending):
                        r = await client.get(f"{live_app}/v1/realtime/stats/{webrtc_id}")
                        if r.status_code == 404:
                            assert r.json()["error"]["code"] == "unknown_session", r.text
                            pending.remove(webrtc_id)
                        else:
                            assert r.status_code == 200, r.text
                    assert not pending or time.monotonic() < deadline, f"never closed: {pending}"
                    if pending:
                        await asyncio.sleep(0.5)
            finally:
                for pc in ghosts:
                    await pc.close()

    asyncio.run(scenario())
