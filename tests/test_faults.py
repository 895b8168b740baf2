"""Faults inside the engine: a request whose decode fails fails alone; a stage thread that dies fails
what is in flight, turns health checks unhealthy and new requests into 503 with Retry-After.

One engine for this module (the last test kills one of its stage threads on purpose)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.fidelity import engine_fixture
from tts_engine.request import EngineClosed, SpeechRequest, StreamFailed

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
GREEDY = dict(do_sample=False, subtalker_do_sample=False)

engine = engine_fixture("base", stage_config=CONFIGS / "qwen3_tts_tiny_cpu.yaml")


@pytest.fixture(scope="module")
def voice(engine, reference_clip):
    return engine.create_voice_prompt(str(reference_clip), x_vector_only=True)


def _request(voice, frames: int = 30) -> SpeechRequest:
    return SpeechRequest(text="A fault should stay with its own request.", voice=voice, max_new_tokens=frames, **GREEDY)


def test_soak_tool_counts_hangups_and_leaves_nothing_in_the_engine(engine, voice):
    """tools/soak.py (the H200 64-stream soak) on the tiny engine: streams loop, every other listener
    hangs up, windows are sampled with host memory, and nothing stays in the engine afterwards."""
    import asyncio

    from tts_engine.tools.soak import Soak, summarize

    soak = Soak(engine, streams=2, duration_s=3.0, frames=(3, 6), hangup_every=2, voice=voice)
    samples = asyncio.run(soak.run(1.0, lambda sample: None))
    summary = summarize(soak, samples, asyncio.run(soak.leftover()))
    assert summary["totals"]["requests"] >= 2 and summary["totals"]["hangups"] >= 1
    assert summary["totals"]["errors"] == 0 and summary["left_in_engine"] == {}
    assert sum(s["done"] for s in samples) == summary["totals"]["requests"]
    assert summary["memory"]["host_rss_mib"]["after_warmup"] > 0 and len(samples) >= 3


def test_a_failing_decode_fails_only_its_request(engine, voice, monkeypatch):
    pipeline = engine.pipeline
    original = pipeline._decode
    poisoned = "poisoned-request"

    def decode(batch, frames):
        if any(rid == poisoned for rid, _, _ in batch):
            raise RuntimeError("injected decoder fault")
        return original(batch, frames)

    monkeypatch.setattr(pipeline, "_decode", decode)
    results: dict[str, object] = {}

    def run(request_id: str) -> None:
        try:
            results[request_id] = sum(c.audio.shape[0] for c in engine.stream(_request(voice), request_id=request_id))
        except Exception as exc:  # noqa: BLE001 -- recorded for the assertions
            results[request_id] = exc

    threads = [threading.Thread(target=run, args=(rid,)) for rid in (poisoned, "healthy-1", "healthy-2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert isinstance(results[poisoned], StreamFailed) and "injected decoder fault" in str(results[poisoned])
    monkeypatch.undo()
    solo = engine.synthesize(_request(voice)).audio.shape[0]
    assert results["healthy-1"] == results["healthy-2"] == solo > 0, (results, solo)   # as if alone
    engine.drain()
    assert not any(engine.debug_state().values()), engine.debug_state()
    assert engine.healthy


def test_a_dead_stage_thread_fails_requests_in_flight_and_turns_the_service_unhealthy(engine, voice, tmp_path,
                                                                                      reference_clip):
    from tts_engine.serving.server import build_api
    from tts_engine.serving.voice_library import VoiceLibrary

    library = VoiceLibrary(tmp_path / "voices", engine.config)
    library.create("kept", str(reference_clip), x_vector_only=True, engine=engine)
    client = TestClient(build_api(engine, library))
    assert client.get("/healthz").status_code == 200 and client.get("/readyz").status_code == 200
    stream = engine.stream(_request(voice, frames=200))
    first = next(stream)                     # a request in flight

    def die(message):
        raise MemoryError("injected: Stage 1 thread dies")
    engine.pipeline._take = die               # the next command kills the Stage 1 thread
    engine.pipeline.abort("nothing")          # any command will do
    with pytest.raises(StreamFailed, match="engine stopped working"):
        for _ in stream:                      # the request in flight ends with an error, it does not hang
            pass
    assert first.audio.size and not engine.healthy
    health = client.get("/healthz")
    assert health.status_code == 503 and health.json()["stage1"] is False
    assert "MemoryError" in health.json()["error"]
    assert client.get("/readyz").status_code == 503
    with pytest.raises(EngineClosed, match="must be restarted"):
        engine.synthesize(_request(voice))
    r = client.post("/v1/audio/speech", json={"input": "Anyone there?", "voice": "kept"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "engine_unavailable" and r.headers["retry-after"]
