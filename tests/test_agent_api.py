"""Voice-agent interfaces against a live server (tiny Base engine, `build_api` on uvicorn): every output format
over HTTP (file, stream) and SSE."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from pathlib import Path
from types import SimpleNamespace

import av
import httpx
import numpy as np
import pytest
import soundfile as sf

from tests.conftest import REFERENCE_TEXT
from tests.fidelity import engine_fixture
from tests.live_server import serve_in_thread, spy_aborts
from tts_engine.audio import alaw_decode, ulaw_decode
from tts_engine.serving.server import build_api
from tts_engine.serving.settings import ServingSettings
from tts_engine.serving.voice_library import VoiceLibrary

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
HOP = 1920                   # samples per codec frame at 24 kHz
FRAMES = 12                  # frame cap per request (random weights rarely stop by themselves)
SPEECH = "/v1/audio/speech"

engine = engine_fixture("base", stage_config=CONFIGS / "qwen3_tts_tiny_cpu.yaml")


@pytest.fixture(scope="module")
def server(engine, tmp_path_factory, reference_clip):
    library = VoiceLibrary(tmp_path_factory.mktemp("agent_api") / "voices", engine.config)
    library.create("alice", str(reference_clip), transcript=REFERENCE_TEXT, engine=engine)
    settings = ServingSettings(max_new_tokens=FRAMES, voice_aliases={"nova": "alice"})
    app = build_api(engine, library, settings)
    with serve_in_thread(app, "agent-api-test-server") as url:
        yield SimpleNamespace(url=url, library=library, settings=settings, engine=engine, app=app)


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=180) as c:
        yield c


def _decode(data: bytes, fmt: str, rate: int) -> tuple[np.ndarray, int]:
    """Decoded float samples and their rate, whatever the format."""
    if fmt == "pcm":
        return np.frombuffer(data, "<i2") / 32768, rate
    if fmt in ("ulaw", "alaw"):
        return (ulaw_decode if fmt == "ulaw" else alaw_decode)(data) / 32768, rate
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        out = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(stream)])
        return (out / 32768 if out.dtype == np.int16 else out), stream.codec_context.sample_rate


def _sse_events(text: str) -> list[dict]:
    return [json.loads(block[len("data: "):]) for block in text.strip().split("\n\n") if block]


# ---------------------------------------------------------------------------------------------------
# Formats over HTTP and SSE
# ---------------------------------------------------------------------------------------------------

CASES = [("pcm", 8000), ("pcm", 16000), ("pcm", 48000), ("ulaw", 8000), ("alaw", 8000), ("opus", 24000),
         ("opus", 48000), ("wav", 16000), ("flac", 44100), ("mp3", 22050), ("aac", 24000)]


@pytest.mark.parametrize("fmt, rate", CASES, ids=[f"{f}-{r}" for f, r in CASES])
def test_every_format_as_a_file(client, fmt, rate):
    r = client.post(SPEECH, json={"input": "Formats for every transport.", "voice": "alice", "response_format": fmt,
                                  "sample_rate": rate, "seed": 5})
    assert r.status_code == 200, r.text
    assert r.headers["x-sample-rate"] == str(rate)
    frames = int(r.headers["x-frames"])
    seconds = frames * HOP / 24000
    audio, decoded_rate = _decode(r.content, fmt, rate)
    assert decoded_rate == (48000 if fmt == "opus" else rate)
    if fmt in ("pcm", "ulaw", "alaw", "wav", "flac"):   # exact length: frames x 80 ms at the asked rate
        assert len(audio) == round(seconds * rate)
    else:                                              # codecs pad to their frame size
        assert abs(len(audio) / decoded_rate - seconds) < 0.1
    assert np.abs(audio).max() > 0


@pytest.mark.parametrize("fmt, rate", CASES, ids=[f"{f}-{r}" for f, r in CASES])
def test_every_format_streams(client, fmt, rate):
    pieces = []
    with client.stream("POST", SPEECH, json={"input": "Streaming in any format.", "voice": "alice",
                                             "response_format": fmt, "sample_rate": rate, "stream": True,
                                             "seed": 5}) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["x-sample-rate"] == str(rate)
        pieces = [p for p in r.iter_bytes() if p]
    audio, _ = _decode(b"".join(pieces), fmt, rate)
    assert len(audio) > 0 and np.abs(audio).max() > 0


def test_streamed_pcm_equals_the_file_of_the_same_request(client):
    """Resampling per chunk (state carried across chunks) gives the samples of resampling the whole."""
    body = {"input": "Seamless chunk boundaries.", "voice": "alice", "response_format": "pcm", "sample_rate": 16000,
            "seed": 11, "max_new_tokens": 20}
    whole = np.frombuffer(client.post(SPEECH, json=body).content, "<i2").astype(int)
    with client.stream("POST", SPEECH, json={**body, "stream": True}) as r:
        chunks = [p for p in r.iter_bytes() if p]
    streamed = np.frombuffer(b"".join(chunks), "<i2").astype(int)
    assert len(streamed) == len(whole) > 0
    assert np.abs(streamed - whole).max() <= 1


def test_sse_deltas_carry_the_asked_format(client):
    with client.stream("POST", SPEECH, json={"input": "Telephony events.", "voice": "alice", "stream_format": "sse",
                                             "response_format": "ulaw", "seed": 2}) as r:
        assert r.status_code == 200
        events = _sse_events(r.read().decode())
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    done = events[-1]
    assert done["type"] == "speech.audio.done" and done["format"] == "ulaw" and done["sample_rate"] == 8000
    data = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    assert len(data) == done["audio_samples"] == done["usage"]["output_tokens"] * HOP // 3


def test_sse_without_a_format_stays_raw_pcm16_at_24k(client):
    with client.stream("POST", SPEECH, json={"input": "Default events.", "voice": "alice", "stream_format": "sse",
                                             "seed": 2}) as r:
        events = _sse_events(r.read().decode())
    done = events[-1]
    assert done["format"] == "pcm16" and done["sample_rate"] == 24000
    data = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert len(data) == 2 * done["audio_samples"] == 2 * done["usage"]["output_tokens"] * HOP


def test_opus_file_is_ogg_opus(client):
    r = client.post(SPEECH, json={"input": "Ogg.", "voice": "alice", "response_format": "opus", "seed": 1})
    assert r.status_code == 200 and r.headers["content-type"] == "audio/ogg"
    assert r.content[:4] == b"OggS" and b"OpusHead" in r.content[:200]
    info = sf.info(io.BytesIO(r.content))
    assert info.format == "OGG" and info.subtype == "OPUS"


# ---------------------------------------------------------------------------------------------------
# The WebSocket /v1/audio/speech/stream
# ---------------------------------------------------------------------------------------------------

WS_PATH = "/v1/audio/speech/stream"
WAIT_S = 120     # a generous bound on waiting for one event (never reached unless something hangs)


class Socket:
    """A test client for the socket's JSON events (websockets' asyncio client)."""

    def __init__(self, ws):
        self.ws = ws
        self.events: list[dict] = []

    async def send(self, **message) -> None:
        await self.ws.send(json.dumps(message))

    async def next(self) -> dict:
        event = json.loads(await asyncio.wait_for(self.ws.recv(), WAIT_S))
        self.events.append(event)
        return event

    async def until(self, type_: str, context_id: str | None = None, code: str | None = None) -> dict:
        """Events up to (and including) the first of `type_` (for `context_id`, with `code`)."""
        while True:
            event = await self.next()
            if event["type"] == type_ and context_id in (None, event.get("context_id")) and \
                    code in (None, event.get("code")):
                return event

    def audio(self, context_id: str) -> bytes:
        return b"".join(base64.b64decode(e["audio"]) for e in self.events
                        if e["type"] == "audio" and e["context_id"] == context_id)


def _ws(server, scenario):
    """Run `scenario(socket)` against a fresh socket."""
    from websockets.asyncio.client import connect

    async def main():
        async with connect(server.url.replace("http://", "ws://") + WS_PATH, max_size=None) as ws:
            return await scenario(Socket(ws))

    return asyncio.run(main())


async def _with(s: Socket, coroutine):
    return (s, *await coroutine)


def test_ws_speech_starts_at_the_first_complete_clause_and_ends_with_done(server):
    async def scenario(s: Socket):
        await s.send(type="start", context_id="turn-1", voice="alice", language="english",
                     response_format="pcm", sample_rate=16000)
        await s.send(type="text", context_id="turn-1", text="Hello there, this is the first")
        await s.send(type="text", context_id="turn-1", text=" sentence. And the second")
        first = await s.until("audio", "turn-1")          # before `end`: the first clause is being spoken
        await s.send(type="text", context_id="turn-1", text=" one comes last.")
        await s.send(type="end", context_id="turn-1")
        return first, await s.until("done", "turn-1")

    s, first, done = _ws(server, lambda s: _with(s, scenario(s)))
    assert first["sample_rate"] == 16000 and first["format"] == "pcm"
    assert done["cancelled"] is False
    m = done["metrics"]
    assert m["clauses"] == 2 and [c["text"] for c in m["per_clause"]] == [
        "Hello there, this is the first sentence.", "And the second one comes last."]
    pcm = np.frombuffer(s.audio("turn-1"), "<i2")
    assert len(pcm) == round(m["audio_seconds"] * 16000) == m["frames"] * HOP * 2 // 3
    assert m["time_to_first_audio_ms"] > 0 and np.abs(pcm).max() > 0
    assert not [e for e in s.events if e["type"] == "error"]


def test_ws_several_contexts_run_at_once_each_in_its_format(server):
    async def scenario(s: Socket):
        await s.send(type="start", context_id="a", voice="alice", response_format="ulaw")
        await s.send(type="start", context_id="b", voice="nova", response_format="pcm")   # nova: an alias of alice
        await s.send(type="text", context_id="a", text="Phone audio for the first caller.")
        await s.send(type="text", context_id="b", text="Studio audio for the second one.")
        await s.send(type="end", context_id="a")
        await s.send(type="end", context_id="b")
        dones = {}
        while len(dones) < 2:
            event = await s.until("done")
            dones[event["context_id"]] = event
        return s, dones

    s, dones = _ws(server, scenario)
    assert {e["format"] for e in s.events if e["type"] == "audio" and e["context_id"] == "a"} == {"ulaw"}
    assert {e["sample_rate"] for e in s.events if e["type"] == "audio" and e["context_id"] == "b"} == {24000}
    assert len(s.audio("a")) == round(dones["a"]["metrics"]["audio_seconds"] * 8000) > 0
    assert len(s.audio("b")) == 2 * round(dones["b"]["metrics"]["audio_seconds"] * 24000) > 0
    starts = [i for i, e in enumerate(s.events) if e["type"] == "audio"]
    owners = [s.events[i]["context_id"] for i in starts]
    assert owners.index("b") < len(owners) - owners[::-1].index("a") - 1, "the two contexts' audio interleaves"


def test_ws_flush_speaks_what_is_buffered_and_the_context_goes_on(server):
    async def scenario(s: Socket):
        await s.send(type="start", context_id="c", voice="alice")
        await s.send(type="text", context_id="c", text="no punctuation at all")
        await s.send(type="flush", context_id="c")
        await s.until("audio", "c")
        await s.send(type="text", context_id="c", text="and then some more")
        await s.send(type="end", context_id="c")
        return await s.until("done", "c")

    done = _ws(server, scenario)
    assert [c["text"] for c in done["metrics"]["per_clause"]] == ["no punctuation at all", "and then some more"]


def test_ws_cancel_stops_at_once_and_the_socket_stays_open(server, aborts):
    server.settings.max_new_tokens = 200     # long enough to be cancelled mid-clause

    async def scenario(s: Socket):
        await s.send(type="start", context_id="long", voice="alice")
        await s.send(type="text", context_id="long", text="A long clause that is interrupted by the listener. And")
        await s.until("audio", "long")
        await s.send(type="cancel", context_id="long")
        done = await s.until("done", "long")
        after = len(s.events)
        server.settings.max_new_tokens = FRAMES
        await s.send(type="start", context_id="next", voice="alice")
        await s.send(type="text", context_id="next", text="Still here.")
        await s.send(type="end", context_id="next")
        await s.until("done", "next")
        return s, done, after

    try:
        s, done, after = _ws(server, scenario)
    finally:
        server.settings.max_new_tokens = FRAMES
    assert done["cancelled"] is True
    assert not [e for e in s.events[after:] if e.get("context_id") == "long"], "audio after the cancel's done"
    assert len(aborts) == 1, aborts
    assert len(s.audio("next")) > 0


@pytest.fixture
def aborts(engine, monkeypatch):
    return spy_aborts(engine, monkeypatch)


def test_ws_bad_input_gets_an_error_event_each_and_everything_else_goes_on(server, monkeypatch):
    monkeypatch.setattr(server.settings, "ws_max_contexts", 3)
    monkeypatch.setattr(server.settings, "ws_max_message_bytes", 4096)

    async def scenario(s: Socket):
        # a context that keeps speaking while the mistakes arrive
        await s.send(type="start", context_id="good", voice="alice", response_format="pcm", sample_rate=8000)
        await s.send(type="text", context_id="good", text="This context keeps talking. Through every mistake")
        errors = []

        async def mistake(raw, code: str, context_id: str | None = None):
            await (s.ws.send(raw) if isinstance(raw, (str, bytes)) else s.send(**raw))
            error = await s.until("error")
            errors.append(error)
            assert error["code"] == code and error["message"], error
            assert error.get("context_id") == context_id, error

        await mistake("{not json", "invalid_json")
        await mistake(b"\x00\x01binary", "invalid_message")
        await mistake("[1, 2]", "invalid_message")
        await mistake({"type": "speak", "context_id": "good"}, "unknown_message_type", "good")
        await mistake({"context_id": "good", "text": "no type"}, "unknown_message_type", "good")
        await mistake({"type": "text", "text": "whose?"}, "missing_field")
        await mistake({"type": "text", "context_id": "early", "text": "Too soon."}, "context_not_started", "early")
        await mistake({"type": "flush", "context_id": "nobody-knows"}, "unknown_context", "nobody-knows")
        await mistake({"type": "cancel", "context_id": "nobody-knows"}, "unknown_context", "nobody-knows")
        await mistake(json.dumps({"type": "text", "context_id": "good", "text": "x" * 5000}), "message_too_large")
        await mistake({"type": "text", "context_id": "good", "text": 42}, "invalid_value", "good")
        await mistake({"type": "start", "context_id": "v", "voice": "nobody"}, "unknown_voice", "v")
        await mistake({"type": "start", "context_id": "f", "voice": "alice", "response_format": "wma"},
                      "unsupported_response_format", "f")
        await mistake({"type": "start", "context_id": "r", "voice": "alice", "response_format": "ulaw",
                       "sample_rate": 16000}, "unsupported_sample_rate", "r")
        await mistake({"type": "start", "context_id": "r", "voice": "alice", "sample_rate": 11025},
                      "unsupported_sample_rate", "r")
        await mistake({"type": "start", "context_id": "l", "voice": "alice", "language": "klingon"},
                      "unsupported_language", "l")
        await mistake({"type": "start", "context_id": "good", "voice": "alice"}, "context_exists", "good")
        await s.send(type="start", context_id="two", voice="alice")
        await s.send(type="start", context_id="three", voice="alice")
        await mistake({"type": "start", "context_id": "four", "voice": "alice"}, "too_many_contexts", "four")
        await s.send(type="cancel", context_id="two")
        await s.send(type="cancel", context_id="three")
        await s.send(type="end", context_id="good")
        await mistake({"type": "text", "context_id": "good", "text": "After the end."}, "context_ended", "good")
        done = await s.until("done", "good")
        await mistake({"type": "end", "context_id": "good"}, "unknown_context", "good")
        # the socket still serves new contexts
        await s.send(type="start", context_id="after", voice="alice")
        await s.send(type="text", context_id="after", text="Still serving.")
        await s.send(type="end", context_id="after")
        return s, errors, done, await s.until("done", "after")

    s, errors, done, after = _ws(server, scenario)
    assert done["cancelled"] is False and done["metrics"]["clauses"] == 2
    assert len(s.audio("good")) == 2 * round(done["metrics"]["audio_seconds"] * 8000) > 0
    assert after["metrics"]["clauses"] == 1 and s.audio("after")
    assert all(e["type"] == "error" for e in errors) and len(errors) == 20


# ---------------------------------------------------------------------------------------------------
# Prometheus /metrics
# ---------------------------------------------------------------------------------------------------

def _scrape(client) -> dict[tuple, float]:
    from prometheus_client.parser import text_string_to_metric_families

    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(r.text) for sample in family.samples}


def test_metrics_count_what_every_transport_did(server, client):
    from tests.test_speaker import StandInEngine, _play

    before = _scrape(client)
    assert ("tts_stage_queue_depth", (("stage", "talker"),)) in before
    assert ("tts_stage_queue_depth", (("stage", "decoder"),)) in before

    # an HTTP file, an SSE stream, a WebSocket context, two mistakes, a WebRTC session that underruns
    r = client.post(SPEECH, json={"input": "Counted.", "voice": "alice", "response_format": "pcm"})
    http_frames, http_seconds = int(r.headers["x-frames"]), float(r.headers["x-audio-duration"])
    with client.stream("POST", SPEECH, json={"input": "Counted too.", "voice": "alice", "stream_format": "sse"}) as r:
        r.read()
    assert client.post(SPEECH, json={"input": "Who?", "voice": "nobody"}).status_code == 400

    async def scenario(s: Socket):
        await s.send(type="start", context_id="m", voice="alice")
        await s.send(type="start", context_id="x", voice="nobody")
        await s.until("error", "x")
        await s.send(type="text", context_id="m", text="One clause.")
        await s.send(type="end", context_id="m")
        return await s.until("done", "m")

    ws_done = _ws(server, scenario)
    underruns = _play(StandInEngine(chunks=4, delay_s=0.25), "Slow. Gaps.").underruns
    after = _scrape(client)

    def moved(name: str, **labels) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert moved("tts_requests_total", transport="http", outcome="completed") == 1
    assert moved("tts_requests_total", transport="sse", outcome="completed") == 1
    assert moved("tts_requests_total", transport="websocket", outcome="completed") == 1
    assert moved("tts_frames_total", transport="http") == http_frames
    assert moved("tts_audio_seconds_total", transport="http") == pytest.approx(http_seconds, abs=1e-3)
    assert moved("tts_frames_total", transport="websocket") == ws_done["metrics"]["frames"]
    for transport in ("http", "sse", "websocket"):
        assert moved("tts_time_to_first_audio_seconds_count", transport=transport) == 1
        assert moved("tts_real_time_factor_count", transport=transport) == 1
        assert after[("tts_active_streams", (("transport", transport),))] == 0
    # one per finished request (http, sse, websocket)
    for leg in ("prompt", "admit", "first_frame", "decode", "decode_wait", "decode_call"):
        assert moved("tts_first_audio_leg_seconds_count", leg=leg) == 3, leg
        assert moved("tts_first_audio_leg_seconds_sum", leg=leg) > 0, leg
    assert moved("tts_errors_total", code="unknown_voice") == 2          # HTTP body + socket event
    assert moved("tts_playback_underruns_total") == underruns >= 3
    assert moved("tts_playback_underrun_seconds_total") > 0.1


def test_metrics_show_a_stream_while_it_runs(server, client):
    server.settings.max_new_tokens = 100
    try:
        with client.stream("POST", SPEECH, json={"input": "Watch me.", "voice": "alice", "response_format": "pcm",
                                                 "stream": True}) as r:
            pieces = r.iter_bytes()    # kept: a dropped iterator closes the response (the server then aborts)
            next(pieces)
            during = _scrape(client)
    finally:
        server.settings.max_new_tokens = FRAMES
    assert during[("tts_active_streams", (("transport", "http"),))] == 1
    assert during[("tts_stage_active_requests", (("stage", "talker"),))] + \
        during[("tts_stage_active_requests", (("stage", "decoder"),))] >= 1


def test_openai_voice_names_resolve_through_the_alias_table(client):
    r = client.post(SPEECH, json={"input": "Aliased.", "voice": "NOVA", "response_format": "pcm"})
    assert r.status_code == 200 and r.headers["x-voice"] == "alice"
    r = client.post(SPEECH, json={"input": "Not aliased.", "voice": "alloy"})
    err = r.json()["error"]
    assert r.status_code == 400 and err["code"] == "unknown_voice" and "TTS_VOICE_ALIASES" in err["message"]


def test_aliases_from_the_environment():
    from tts_engine.serving.settings import aliases_from_env

    assert aliases_from_env(" Alloy = sample , nova=Alice,bad, =x") == {"alloy": "sample", "nova": "Alice"}
