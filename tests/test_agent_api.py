"""Voice-agent interfaces against a live server (tiny Base engine, `build_api` on uvicorn): every output format
over HTTP (file, stream) and SSE."""

from __future__ import annotations

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
from tests.live_server import serve_in_thread
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
