"""The HTTP API against a live server: a tiny Base engine, the serving app (`build_api`) on uvicorn, httpx."""

from __future__ import annotations

import base64
import io
import json
import shutil
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import pytest
import soundfile as sf

from tests.conftest import REFERENCE_TEXT
from tests.fidelity import engine_fixture
from tests.live_server import serve_in_thread, spy_aborts
from tts_engine.serving.server import build_api
from tts_engine.serving.settings import ServingSettings
from tts_engine.serving.voice_library import VoiceLibrary

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
HOP = 1920                   # samples per codec frame at 24 kHz
FRAMES = 24                  # default frame cap for this module's requests (random weights rarely stop)
SPEECH = "/v1/audio/speech"
VOICES = "/v1/audio/voices"


# ---------------------------------------------------------------------------------------------------
# Fixtures: one engine, one live server per module
# ---------------------------------------------------------------------------------------------------


engine = engine_fixture("base", stage_config=CONFIGS / "qwen3_tts_tiny_cpu.yaml")


@pytest.fixture(scope="module")
def server(engine, tmp_path_factory):
    library = VoiceLibrary(tmp_path_factory.mktemp("api") / "voices", engine.config)
    settings = ServingSettings(max_new_tokens=FRAMES)
    app = build_api(engine, library, settings)
    with serve_in_thread(app, "api-test-server") as url:
        yield SimpleNamespace(url=url, port=int(url.rsplit(":", 1)[1]), library=library, settings=settings,
                              slots=app.state.slots, engine=engine)


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=180) as c:
        yield c


@pytest.fixture(scope="module")
def alice(client, reference_clip):
    """An ICL library voice created through the API (used by most tests)."""
    r = client.post(VOICES, data={"name": "Alice", "transcript": REFERENCE_TEXT},
                    files={"file": ("alice.wav", reference_clip.read_bytes(), "audio/wav")})
    assert r.status_code == 201, r.text
    return r.json()


@pytest.fixture
def aborts(engine, monkeypatch):
    return spy_aborts(engine, monkeypatch)


def _error(r: httpx.Response, status: int, param: str | None = "-", code: str | None = "-") -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["type"] == ("server_error" if status >= 500 else "invalid_request_error")
    if param != "-":
        assert err["param"] == param, err
    if code != "-":
        assert err["code"] == code, err
    return err


def _wav_bytes(wav: np.ndarray, sr: int) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, wav, sr, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def _tone(seconds: float, sr: int = 16000, amp: float = 0.3) -> np.ndarray:
    t = np.arange(int(seconds * sr)) / sr
    return (amp * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)


def _wait_idle(server, timeout: float = 60.0) -> dict:
    """Wait until the engine holds no per-request state and every API slot is free."""
    deadline = time.monotonic() + timeout
    while True:
        server.engine.drain()
        state = server.engine.debug_state()
        if all(not ids for ids in state.values()) and server.slots.active == 0:
            return state
        assert time.monotonic() < deadline, (state, server.slots.active)
        time.sleep(0.05)   # polling engine state after a disconnect, not standing in for a result


def _sse_events(text: str) -> list[dict]:
    events = []
    for block in text.split("\n\n"):
        if block.strip():
            assert block.startswith("data: "), block
            events.append(json.loads(block[len("data: "):]))
    return events


# ---------------------------------------------------------------------------------------------------
# Speech
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "pcm"])
def test_speech_file_in_every_format(client, alice, fmt):
    r = client.post(SPEECH, json={"model": "qwen3-tts", "input": "Hello from the API.", "voice": "alice",
                                  "language": "english", "response_format": fmt, "seed": 3})
    assert r.status_code == 200, r.text
    expected_type = {"wav": "audio/wav", "flac": "audio/flac", "mp3": "audio/mpeg", "pcm": "audio/pcm"}[fmt]
    assert r.headers["content-type"] == expected_type
    assert r.headers["x-model"] == "qwen3-tts" and r.headers["x-sample-rate"] == "24000"
    frames = int(r.headers["x-frames"])
    assert 1 <= frames <= FRAMES
    if fmt == "pcm":
        pcm = np.frombuffer(r.content, dtype="<i2")
        assert len(r.content) == 2 * frames * HOP
        assert np.abs(pcm).max() > 0
        return
    if fmt == "mp3":
        import av
        with av.open(io.BytesIO(r.content)) as container:
            stream = container.streams.audio[0]
            decoded = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(stream)])
            rate = stream.rate
        assert rate == 24000
        assert abs(len(decoded) - frames * HOP) <= 2 * 1152, (len(decoded), frames * HOP)
        return
    wav, sr = sf.read(io.BytesIO(r.content), dtype="int16")
    info = sf.info(io.BytesIO(r.content))
    assert sr == 24000 and info.channels == 1 and info.subtype == "PCM_16"
    assert len(wav) == frames * HOP and len(wav) % HOP == 0
    assert np.abs(wav).max() > 0


def test_stream_pcm_arrives_in_chunks_before_the_request_ends(server, client, alice):
    engine = server.engine
    pieces = []   # (bytes, request still running in the engine when it arrived)
    with client.stream("POST", SPEECH, json={"input": "Streaming over HTTP, chunk by chunk.", "voice": "Alice",
                                             "response_format": "pcm", "stream": True, "max_new_tokens": 76,
                                             "seed": 5}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"] == "audio/pcm" and r.headers["x-sample-format"] == "s16le"
        rid = r.headers["x-request-id"]
        for data in r.iter_raw():
            pieces.append((data, rid in engine.debug_state()["routes"], server.slots.active))
    body = b"".join(d for d, _, _ in pieces)
    assert len(pieces) >= 2, "the body must arrive in several pieces"
    assert pieces[0][1], "the first audio must arrive while the engine is still generating"
    assert pieces[0][2] == 1, "a running stream holds a concurrency slot"
    assert len(body) % (2 * HOP) == 0 and len(body) >= 2 * HOP * 2
    assert len(body) <= 2 * HOP * 76
    _wait_idle(server)


def test_stream_wav_sends_a_streaming_header_then_pcm(client, alice):
    with client.stream("POST", SPEECH, json={"input": "A streamed wav.", "voice": "alice", "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"] == "audio/wav"
        body = r.read()
    assert body[:4] == b"RIFF" and body[8:16] == b"WAVEfmt " and body[36:40] == b"data"
    channels, rate = np.frombuffer(body[22:24], "<u2")[0], np.frombuffer(body[24:28], "<u4")[0]
    assert (channels, rate) == (1, 24000)
    assert len(body[44:]) % (2 * HOP) == 0 and len(body) > 44


def test_sse_deltas_decode_and_concatenate(client, alice):
    with client.stream("POST", SPEECH, json={"model": "m1", "input": "Events, one after another.", "voice": "alice",
                                             "stream_format": "sse", "max_new_tokens": 40, "seed": 7}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        text = r.read().decode()
    events = _sse_events(text)
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) >= 2 and events[-1]["type"] == "speech.audio.done"
    assert all(e["type"] == "speech.audio.delta" for e in events[:-1])
    pcm = np.frombuffer(b"".join(base64.b64decode(e["audio"]) for e in deltas), "<i2")
    done = events[-1]
    assert done["audio_samples"] == len(pcm) == done["usage"]["output_tokens"] * HOP
    assert 1 <= done["usage"]["output_tokens"] <= 40 and done["usage"]["input_tokens"] > 0
    assert done["usage"]["total_tokens"] == done["usage"]["input_tokens"] + done["usage"]["output_tokens"]
    assert done["model"] == "m1" and done["sample_rate"] == 24000 and done["chunks"] == len(deltas)
    m = done["metrics"]
    assert 0 < m["first_chunk_s"] <= m["finished_s"] and m["frames"] == done["usage"]["output_tokens"]


@pytest.mark.parametrize("stream", [{"response_format": "pcm", "stream": True}, {"stream_format": "sse"}],
                         ids=["pcm", "sse"])
def test_closing_a_stream_aborts_the_engine_request(server, alice, aborts, stream, capsys):
    body = {"input": "This one is cut short by the client. " * 3, "voice": "alice", "max_new_tokens": 250, **stream}
    with httpx.Client(base_url=server.url, timeout=180) as own:    # its own connection, closed below
        with own.stream("POST", SPEECH, json=body) as r:
            assert r.status_code == 200
            rid = r.headers["x-request-id"]
            next(r.iter_raw())
        own.close()
        closed = time.monotonic()
    # The connection is gone mid-body; the server must abort the request in both stages (issue: within 1 s).
    deadline = closed + 60
    while rid not in aborts or rid in set().union(*server.engine.debug_state().values()):
        assert time.monotonic() < deadline, "the engine request was not aborted"
        time.sleep(0.01)   # waiting for the server to notice the disconnect
    server.engine.drain()
    elapsed = time.monotonic() - closed
    with capsys.disabled():
        print(f"\n[disconnect {r.headers['content-type'].split(';')[0]}] aborted in both stages {elapsed * 1000:.0f} ms "
              "after the client closed")
    assert elapsed <= 1.0, f"abort took {elapsed:.2f} s"
    _wait_idle(server)


def test_disconnect_during_a_file_request_aborts_it(server, alice, aborts):
    payload = json.dumps({"input": "Nobody will wait for this file.", "voice": "alice",
                          "max_new_tokens": 250}).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
        deadline = time.monotonic() + 60
        while not server.engine.debug_state()["routes"]:
            assert time.monotonic() < deadline, "the request never started"
            time.sleep(0.02)   # waiting for the request to reach the engine
    deadline = time.monotonic() + 60
    while not aborts:
        assert time.monotonic() < deadline, "the engine request was not aborted after the client left"
        time.sleep(0.05)
    assert aborts[0].startswith("speech-")
    _wait_idle(server)


def test_too_many_concurrent_requests_get_503_with_retry_after(server, client, alice, reference_clip, monkeypatch):
    # Hold the only slot with a voice upload whose speaker embedding waits for us (deterministic).
    cloner = server.engine.cloner
    entered, release = threading.Event(), threading.Event()
    embed = cloner.embed

    def slow_embed(wav):
        entered.set()
        release.wait(60)
        return embed(wav)

    monkeypatch.setattr(cloner, "embed", slow_embed)
    server.settings.max_concurrent = 1
    held = {}

    def hold():
        held["response"] = httpx.post(f"{server.url}{VOICES}", data={"name": "Holder", "x_vector_only": "true"},
                                      files={"file": ("h.wav", reference_clip.read_bytes())}, timeout=120)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert entered.wait(60), "the upload never reached the cloner"
        assert server.slots.active == 1
        busy = client.post(SPEECH, json={"input": "Me too.", "voice": "alice"})
        err = _error(busy, 503, code="server_busy")
        assert "busy" in err["message"] and int(busy.headers["retry-after"]) >= 1
        _error(client.post(SPEECH, json={"input": "Me too.", "voice": "alice", "stream_format": "sse"}), 503,
               code="server_busy")
        _error(_upload(client, name="Busy"), 503, code="server_busy")
    finally:
        release.set()
        holder.join(timeout=120)
        server.settings.max_concurrent = ServingSettings().max_concurrent
    assert held["response"].status_code == 201, held["response"].text
    assert "Busy" not in server.library and client.delete(f"{VOICES}/Holder").status_code == 200
    _wait_idle(server)   # every slot is free again
    assert client.post(SPEECH, json={"input": "After the rush.", "voice": "alice", "max_new_tokens": 5}).status_code == 200


# ---------------------------------------------------------------------------------------------------
# Voices
# ---------------------------------------------------------------------------------------------------


def test_voice_create_list_use_delete_round_trip(server, client, alice, reference_clip):
    clip_s = sf.info(str(reference_clip)).duration
    assert alice["mode"] == "icl" and alice["transcript"] == REFERENCE_TEXT and alice["ref_frames"] > 0
    r = client.post(VOICES, data={"name": "Bob Smith", "x_vector_only": "true", "transcript": "ignored"},
                    files={"file": ("bob.wav", reference_clip.read_bytes(), "audio/wav")})
    assert r.status_code == 201, r.text
    bob = r.json()
    assert r.headers["location"] == "/v1/audio/voices/Bob%20Smith"
    assert bob["name"] == "Bob Smith" and bob["mode"] == "x_vector" and bob["transcript"] is None
    assert bob["compatible"] and bob["model_type"] == "base" and bob["hidden_size"] == server.library.signature.hidden_size
    assert abs(bob["duration_s"] - clip_s) < 0.01 and bob["notice"] is None and not bob["trimmed"]

    listing = client.get(VOICES).json()
    names = {v["name"]: v for v in listing["voices"]}
    assert {"Alice", "Bob Smith"} <= set(names) and listing["speakers"] == []
    assert listing["model"]["model_type"] == "base" and listing["model"]["supports_cloning"]
    assert names["Bob Smith"]["preview_url"] == "/v1/audio/voices/Bob%20Smith/preview"
    assert client.get(f"{VOICES}/bob smith").json()["name"] == "Bob Smith"

    preview = client.get(names["Bob Smith"]["preview_url"])
    assert preview.status_code == 200 and preview.headers["content-type"] == "audio/wav"
    wav, sr = sf.read(io.BytesIO(preview.content))
    assert sr == 24000 and abs(len(wav) / sr - bob["duration_s"]) < 1e-3

    spoken = client.post(SPEECH, json={"input": "Now in Bob's voice.", "voice": {"id": "BOB SMITH"},
                                       "response_format": "pcm", "max_new_tokens": 8})
    assert spoken.status_code == 200 and spoken.headers["x-voice"] == "BOB%20SMITH"

    deleted = client.delete(f"{VOICES}/Bob Smith")
    assert deleted.status_code == 200 and deleted.json() == {"object": "voice.deleted", "name": "Bob Smith",
                                                            "deleted": True}
    assert "Bob Smith" not in {v["name"] for v in client.get(VOICES).json()["voices"]}
    _error(client.post(SPEECH, json={"input": "Gone?", "voice": "Bob Smith"}), 400, "voice", "unknown_voice")
    _error(client.delete(f"{VOICES}/Bob Smith"), 404, code="voice_not_found")
    _error(client.get(f"{VOICES}/Bob Smith/preview"), 404, code="voice_not_found")
    _error(client.get(f"{VOICES}/Bob Smith"), 404, code="voice_not_found")


def test_long_clip_is_trimmed_with_a_notice(client, alice, reference_clip):
    wav, sr = sf.read(str(reference_clip), dtype="float32")
    long = np.tile(wav, int(np.ceil(31.0 * sr / len(wav))))
    r = client.post(VOICES, data={"name": "Long one", "x_vector_only": "true"},
                    files={"file": ("long.wav", _wav_bytes(long, sr), "audio/wav")})
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["trimmed"] and body["duration_s"] == 30.0
    assert "30 s" in body["notice"] and f"{len(long) / sr:.1f} s" in body["notice"]
    assert client.delete(f"{VOICES}/Long one").status_code == 200


def test_without_transcript_the_voice_is_x_vector_with_a_notice(client, alice):
    r = client.post(VOICES, data={"name": "Plain"}, files={"file": ("p.wav", _wav_bytes(_tone(2.0), 16000))})
    assert r.status_code == 201, r.text
    assert r.json()["mode"] == "x_vector" and "transcript" in r.json()["notice"]
    assert client.delete(f"{VOICES}/plain").status_code == 200


def test_voice_for_another_model_is_listed_incompatible_and_refused(server, client, alice):
    root = server.library.root
    shutil.copytree(root / "Alice", root / "Alien")
    meta = json.loads((root / "Alien" / "meta.json").read_text())
    meta.update(model_size="1b7", hidden_size=meta["hidden_size"] * 2)
    (root / "Alien" / "meta.json").write_text(json.dumps(meta))
    try:
        listed = {v["name"]: v for v in client.get(VOICES).json()["voices"]}
        assert listed["Alien"]["compatible"] is False and listed["Alice"]["compatible"] is True
        err = _error(client.post(SPEECH, json={"input": "Hi.", "voice": "alien"}), 400, "voice", "incompatible_voice")
        assert "1b7" in err["message"]
    finally:
        assert client.delete(f"{VOICES}/Alien").status_code == 200


# ---------------------------------------------------------------------------------------------------
# Bad input, one by one
# ---------------------------------------------------------------------------------------------------

GOOD = {"input": "Hello.", "voice": "alice"}


@pytest.mark.parametrize("change, param, code", [
    ({"input": ""}, "input", "empty_input"),
    ({"input": " \n\t "}, "input", "empty_input"),
    ({"input": "a" * 5001}, "input", "input_too_long"),
    ({"voice": "nobody"}, "voice", "unknown_voice"),
    ({"voice": None}, "voice", "voice_required"),
    ({"language": "klingon"}, "language", "unsupported_language"),
    ({"response_format": "wma"}, "response_format", "unsupported_response_format"),
    ({"response_format": "ulaw", "sample_rate": 24000}, "sample_rate", "unsupported_sample_rate"),
    ({"response_format": "pcm", "sample_rate": 11025, "stream": True}, "sample_rate", "unsupported_sample_rate"),
    ({"response_format": "opus", "sample_rate": 44100}, "sample_rate", "unsupported_sample_rate"),
    ({"stream_format": "websocket"}, "stream_format", "unsupported_stream_format"),
    ({"speed": 1.5}, "speed", "unsupported_speed"),
    ({"input": 42}, "input", "invalid_value"),
    ({"max_new_tokens": 0}, "max_new_tokens", "invalid_value"),
    ({"max_new_tokens": 10**6}, "max_new_tokens", "invalid_value"),
    ({"stream": "sometimes"}, "stream", "invalid_value"),
    ({"stream": "yes"}, "stream", "invalid_value"),    # strict booleans: OpenAI's SDK sends JSON true/false
    ({"stream": 1}, "stream", "invalid_value"),
], ids=lambda v: json.dumps(v)[:40] if isinstance(v, dict) else None)
def test_bad_speech_requests_get_400_naming_the_field(client, alice, change, param, code):
    _error(client.post(SPEECH, json={**GOOD, **change}), 400, param, code)


def test_malformed_speech_bodies(client, alice):
    _error(client.post(SPEECH, json={"voice": "alice"}), 400, "input", "missing_field")
    _error(client.post(SPEECH, content=b"{not json", headers={"content-type": "application/json"}), 400,
           code="invalid_json")
    _error(client.post(SPEECH), 400, code="missing_body")


def test_language_codes_and_names_are_accepted(client, alice):
    for language in ("en", "English", "auto"):
        r = client.post(SPEECH, json={**GOOD, "language": language, "max_new_tokens": 2, "response_format": "pcm"})
        assert r.status_code == 200, (language, r.text)


def _upload(client, name="New voice", content=None, filename="clip.wav", **data):
    files = {"file": (filename, content if content is not None else _wav_bytes(_tone(2.0), 16000))}
    return client.post(VOICES, data={"name": name, **data}, files=files)


@pytest.mark.parametrize("content, code", [
    (b"this is a text file, not audio" * 10, "invalid_audio"),
    (b"RIFF\x24\x08\x00\x00WAVEfmt " + bytes(range(256)) * 8, "invalid_audio"),
    (b"", "invalid_audio"),
    ("silent", "audio_silent"),
    ("short", "audio_too_short"),
], ids=["not-audio", "corrupt", "empty", "silent", "short"])
def test_bad_reference_audio_is_rejected(server, client, alice, content, code):
    if content == "silent":
        content = _wav_bytes(np.zeros(32000, np.float32), 16000)
    elif content == "short":
        content = _wav_bytes(_tone(0.5), 16000)
    before = [v.name for v in server.library.list()]
    _error(_upload(client, content=content), 400, "file", code)
    assert [v.name for v in server.library.list()] == before
    assert not [p for p in server.library.root.iterdir() if p.name.startswith(".tmp")]


def test_upload_over_20_mb_gets_413(server, client, alice):
    content = b"RIFF" + bytes(20 * 1024 * 1024 + 100)
    _error(_upload(client, content=content), 413, code="file_too_large")
    assert "New voice" not in server.library


@pytest.mark.parametrize("name", ["", "   ", "../evil", "a/b", "back\\slash", ".hidden", "con", "LPT1",
                                  "nul.txt", "default", "Voices", "x" * 65, "what?", "tab\tname"])
def test_bad_voice_names_get_400(server, client, alice, name):
    err = _error(_upload(client, name=name), 400, "name")
    assert err["code"] in ("invalid_voice_name", "missing_field")
    assert not (server.library.root.parent / "evil").exists()


def test_duplicate_voice_name_gets_409(client, alice):
    _error(_upload(client, name="ALICE"), 409, "name", "voice_exists")


def test_bad_upload_forms(client, alice):
    _error(client.post(VOICES, data={"name": "No file"}), 400, "file", "missing_field")
    _error(_upload(client, x_vector_only="maybe"), 400, "x_vector_only", "invalid_value")
    _error(_upload(client, transcript="t" * 2001), 400, "transcript", "transcript_too_long")


def test_openapi_documents_the_routes(client):
    spec = client.get("/openapi.json").json()
    paths = spec["paths"]
    assert {SPEECH, VOICES, VOICES + "/{name}", VOICES + "/{name}/preview"} <= set(paths)
    speech = paths[SPEECH]["post"]
    assert speech["summary"] and "stream" in speech["description"]
    assert {"audio/wav", "audio/pcm", "audio/flac", "audio/mpeg", "text/event-stream"} <= set(
        speech["responses"]["200"]["content"])
    assert {"400", "503"} <= set(speech["responses"]) and "422" not in speech["responses"]
    assert speech["requestBody"]["content"]["application/json"]["examples"]
    schema = spec["components"]["schemas"]["SpeechCreateRequest"]
    assert schema["properties"]["response_format"]["enum"] == ["wav", "pcm", "flac", "mp3", "opus", "aac", "ulaw", "alaw"]
    assert "sample_rate" in schema["properties"]
    create = paths[VOICES]["post"]
    assert {"201", "409", "413"} <= set(create["responses"])
    assert "multipart/form-data" in create["requestBody"]["content"]


def test_a_slow_reader_is_bounded_and_told_why_while_others_stream_on(server, client, alice, aborts):
    """A client that stops reading: what waits for it is bounded (max_buffered_s); past the bound its request
    ends with an error event that says why, and a concurrent stream is served in full meanwhile."""
    server.settings.max_buffered_s = 1.0
    payload = json.dumps({"input": "Nobody reads this quickly. " * 4, "voice": "alice", "max_new_tokens": 250,
                          "stream_format": "sse"}).encode()
    try:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)   # a reader that takes almost nothing
            sock.connect(("127.0.0.1", server.port))
            sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                         b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
            other = client.post(SPEECH, json={"input": "I read at once.", "voice": "alice", "response_format": "pcm",
                                              "stream": True, "max_new_tokens": 40})
            assert other.status_code == 200 and len(other.content) > 0 and len(other.content) % 3840 == 0
            deadline = time.monotonic() + 120
            while not aborts:
                assert time.monotonic() < deadline, "the slow reader's request was never stopped"
                time.sleep(0.05)   # waiting for the buffer bound to be crossed
            sock.settimeout(30)
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
    finally:
        server.settings.max_buffered_s = ServingSettings().max_buffered_s
    assert b'"code":"client_too_slow"' in data and b"slower than real time" in data, data[-400:]
    assert b"speech.audio.done" not in data
    _wait_idle(server)


def test_leading_silence_is_trimmed_by_default_and_the_field_turns_it_off(server, client, alice, monkeypatch):
    seen = []
    generate = server.engine.generate

    def spy(request, *args, **kwargs):
        seen.append(request.trim_leading_silence)
        return generate(request, *args, **kwargs)

    monkeypatch.setattr(server.engine, "generate", spy)
    body = {"input": "Trim me.", "voice": "alice", "seed": 7, "response_format": "pcm", "max_new_tokens": 6}
    on = client.post(SPEECH, json=body)
    off = client.post(SPEECH, json={**body, "trim_leading_silence": False})
    assert on.status_code == off.status_code == 200 and seen == [True, False]
    assert off.content.endswith(on.content) and len(on.content) <= len(off.content)   # only the start differs
