"""Scale-out on Ray Serve (tts_engine/serving/ray_app.py): two tiny CPU replicas behind Serve's proxy.

One Ray instance (started here, on 127.0.0.1 only) and one Serve deployment for the module: both replicas
serve, a WebRTC session's `say` calls stay on its replica, a voice cloned through one replica speaks on
the other, and killing one replica's actor leaves the service answering while Serve restores two.
Plus fast checks without Ray: the configs parse, the health check asks the engine, the voice library
notices a voice replaced by another process.
"""

from __future__ import annotations

import asyncio
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import yaml

from tests.conftest import REFERENCE_TEXT, ROOT, free_port
from tts_engine.tools.webrtc_client import AgentSession

pytest.importorskip("ray.serve")

REPLICA = "x-tts-replica"
AUDIBLE_RMS = 200.0
SPEECH = {"input": "Hello there.", "voice": "sample", "response_format": "pcm"}


# ---- without Ray ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["serve.yaml", "serve_tiny_cpu.yaml"])
def test_serve_configs_parse_and_build(name):
    from ray.serve.schema import ServeDeploySchema

    from tts_engine.serving.ray_app import build, engine_max_num_seqs

    data = yaml.safe_load((ROOT / "configs" / name).read_text())
    schema = ServeDeploySchema.parse_obj(data)
    assert schema.http_options.host == "127.0.0.1" and schema.http_options.port == 8000
    (app,) = schema.applications
    assert app.import_path == "tts_engine.serving.ray_app:build"
    (deployment,) = data["applications"][0]["deployments"]
    if name == "serve.yaml":
        assert deployment["ray_actor_options"]["num_gpus"] == 1 and "autoscaling_config" in deployment
    else:
        assert deployment["num_replicas"] == 2
    built = build(app.args)
    seqs = engine_max_num_seqs(app.args.get("config") or "configs/qwen3_tts_tiny_cpu.yaml")
    assert built._bound_deployment._deployment_config.max_ongoing_requests == seqs + app.args["max_sessions"]


def test_health_check_asks_the_engine():
    from tts_engine.serving.ray_app import TTSReplica

    def replica(healthy: bool):
        return SimpleNamespace(engine=SimpleNamespace(health=lambda: {"healthy": healthy, "stage0": "dead"}))

    asyncio.run(TTSReplica.check_health(replica(True)))
    with pytest.raises(RuntimeError, match="engine unhealthy"):
        asyncio.run(TTSReplica.check_health(replica(False)))


def test_voice_replaced_by_another_process_is_read_again(tmp_path):
    from tests.test_voice_library import SIGNATURE, FakeCloner, tone
    from tts_engine.serving.voice_library import VoiceLibrary, VoiceNotFoundError

    here = VoiceLibrary(tmp_path, SIGNATURE, engine=FakeCloner())
    there = VoiceLibrary(tmp_path, SIGNATURE, engine=FakeCloner())   # another replica, same folder
    here.create("bob", tone(2.0), x_vector_only=True)
    first = there.get("bob").speaker_vector.clone()
    here.delete("bob")
    with pytest.raises(VoiceNotFoundError):
        there.get("bob")
    here.create("bob", tone(3.0), x_vector_only=True)   # same name, another clip
    assert not there.get("bob").speaker_vector.equal(first)


# ---- two replicas behind Serve -------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Ray on 127.0.0.1, Serve's proxy on a free port, two tiny replicas; yields (url, voices folder)."""
    import ray
    from ray import serve

    from tts_engine.serving.ray_app import TTSDeployment

    voices = tmp_path_factory.mktemp("serve_voices")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    ray.init(num_cpus=4, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
             configure_logging=False)
    port = free_port()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        args = {"demo": True, "config": str(ROOT / "tests" / "configs" / "app_tiny.yaml"), "voices": str(voices),
                "max_sessions": 4}
        t0 = time.perf_counter()
        serve.run(TTSDeployment.options(num_replicas=2, ray_actor_options={"num_cpus": 1}, max_ongoing_requests=12,
                                        health_check_period_s=2).bind(args),
                  name="tts", route_prefix="/", blocking=False)
        url = f"http://127.0.0.1:{port}"
        _wait_replicas(2, 400)
        print(f"\n[serve] two replicas running in {time.perf_counter() - t0:.0f} s")
        yield url, voices
    finally:
        serve.shutdown()
        ray.shutdown()


def _running_replicas() -> int:
    from ray import serve

    app = serve.status().applications.get("tts")
    if app is None or "TTSReplica" not in app.deployments:
        return 0
    return app.deployments["TTSReplica"].replica_states.get("RUNNING", 0)


def _wait_replicas(n: int, limit_s: float) -> float:
    start = time.monotonic()
    while _running_replicas() != n:
        assert time.monotonic() - start < limit_s, f"Serve did not reach {n} running replicas in {limit_s:.0f} s"
        time.sleep(0.5)
    return time.monotonic() - start


def _replica_names() -> set[str]:
    from ray.util.state import list_actors

    return {a.name.rsplit("#", 1)[-1] for a in list_actors(filters=[("state", "=", "ALIVE")])
            if a.class_name.startswith("ServeReplica:tts:TTSReplica")}


def _speak(url: str, body: dict | None = None) -> httpx.Response:
    return httpx.post(url + "/v1/audio/speech", json=body or SPEECH, timeout=120)


def _spread(url: str, body: dict | None = None, n: int = 4) -> list[httpx.Response]:
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: _speak(url, body), range(n)))


def test_both_replicas_serve_every_api(cluster):
    url, _ = cluster
    seen: set[str] = set()
    for _ in range(5):
        for r in _spread(url):
            assert r.status_code == 200, r.text
            assert len(r.content) > 0
            seen.add(r.headers[REPLICA])
        if len(seen) == 2:
            break
    assert len(seen) == 2, f"all requests served by {seen}"
    # every response names its replica: errors, voices, health and streaming (chunked and SSE) too
    for response in (httpx.get(url + "/v1/audio/voices"), httpx.get(url + "/healthz"), httpx.get(url + "/readyz"),
                     httpx.post(url + "/v1/audio/speech", json={**SPEECH, "voice": "nobody"})):
        assert response.headers[REPLICA] in seen
    assert httpx.post(url + "/v1/audio/speech", json={**SPEECH, "voice": "nobody"}).json()["error"]["code"] == \
        "unknown_voice"
    with httpx.stream("POST", url + "/v1/audio/speech", json={**SPEECH, "stream": True}, timeout=120) as r:
        assert r.status_code == 200 and r.headers[REPLICA] in seen
        assert sum(len(c) for c in r.iter_bytes()) > 0
    with httpx.stream("POST", url + "/v1/audio/speech", json={**SPEECH, "stream": True, "stream_format": "sse"},
                      timeout=120) as r:
        assert r.status_code == 200
        assert any("speech.audio.done" in line for line in r.iter_lines())


def test_a_webrtc_session_stays_on_its_replica(cluster):
    url, _ = cluster

    async def scenario():
        async with httpx.AsyncClient(timeout=60) as client:
            session = AgentSession(url)
            offer = await session.offer(client)
            assert offer.status_code == 200 and offer.json().get("type") == "answer", offer.text
            home = offer.headers[REPLICA]
            await asyncio.wait_for(session._connected.wait(), 20)
            try:
                t0 = time.perf_counter()
                replicas = []
                for i in range(20):
                    r = await client.post(url + "/v1/realtime/say", headers=session.headers, json={
                        "webrtc_id": session.webrtc_id, "text": f"Part {i}, ", "voice": "sample", "final": i == 19})
                    assert r.status_code == 200, r.text
                    replicas.append(r.headers[REPLICA])
                assert replicas == [home] * 20, f"say calls left the session's replica {home}: {replicas}"
                assert await session.first_audible(t0, AUDIBLE_RMS, 60) is not None, "no audio arrived"
                stats = await client.get(f"{url}/v1/realtime/stats/{session.webrtc_id}", headers=session.headers)
                assert stats.status_code == 200 and stats.headers[REPLICA] == home
                r = await client.post(url + "/v1/realtime/interrupt", headers=session.headers,
                                      json={"webrtc_id": session.webrtc_id})
                assert r.status_code == 200 and r.headers[REPLICA] == home
                # a session nobody holds: a clear 404 (after the router's short wait for an announcement)
                r = await client.post(url + "/v1/realtime/say", headers={"serve_multiplexed_model_id": "nobody"},
                                      json={"webrtc_id": "nobody", "text": "Hi."})
                assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_session"
            finally:
                await session.close()

    asyncio.run(scenario())


def test_a_voice_cloned_on_one_replica_speaks_on_the_other(cluster, reference_clip):
    url, voices = cluster
    with open(reference_clip, "rb") as clip:
        r = httpx.post(url + "/v1/audio/voices", files={"file": ("ref.wav", clip, "audio/wav")},
                       data={"name": "carol", "transcript": REFERENCE_TEXT}, timeout=120)
    assert r.status_code in (200, 201), r.text
    cloned_on = r.headers[REPLICA]
    assert (Path(voices) / "carol").is_dir()
    body = {**SPEECH, "voice": "carol"}
    for _ in range(6):
        other = [s for s in _spread(url, body) if s.headers[REPLICA] != cloned_on]
        if other:
            break
    assert other, "no request reached the other replica"
    assert all(s.status_code == 200 and s.content for s in other), other[0].text
    # deleted through one replica: gone everywhere on the next request
    assert httpx.delete(url + "/v1/audio/voices/carol").status_code == 200
    for s in _spread(url, body):
        assert s.status_code == 404 and s.json()["error"]["code"] == "unknown_voice", s.text


def test_killing_a_replica_leaves_the_service_answering(cluster):
    import ray
    from ray.util.state import list_actors

    url, _ = cluster
    # a stream in flight on the replica about to die
    client = httpx.Client(timeout=120)
    stream = client.stream("POST", url + "/v1/audio/speech", json={**SPEECH, "input": "A long answer. " * 20,
                                                                    "stream": True})
    response = stream.__enter__()
    victim = response.headers[REPLICA]
    actors = [a for a in list_actors(filters=[("state", "=", "ALIVE")])
              if a.class_name.startswith("ServeReplica:tts:TTSReplica")]
    (actor,) = [a for a in actors if a.name.endswith(victim)]
    ray.kill(ray.get_actor(actor.name, namespace="serve"), no_restart=True)
    killed = time.monotonic()
    with pytest.raises(httpx.HTTPError):   # the stream in flight ends with an error, not a clean end
        for _ in response.iter_bytes():
            pass
    stream.__exit__(None, None, None)
    client.close()
    # the service keeps answering: at most a brief blip while the routers learn of the death
    failures, served = 0, []
    while len(served) < 6:
        assert time.monotonic() - killed < 60, f"service not answering after the kill ({failures} failures)"
        r = _speak(url)
        if r.status_code == 200:
            served.append(r.headers[REPLICA])
        else:
            failures += 1
    assert victim not in served
    start = time.monotonic()
    while not (_running_replicas() == 2 and victim not in _replica_names()):
        assert time.monotonic() - start < 400, "Serve did not restore two replicas in 400 s"
        time.sleep(0.5)
    restored = time.monotonic() - killed
    seen = {s.headers[REPLICA] for _ in range(3) for s in _spread(url)}
    print(f"\n[serve] after the kill: {failures} failed requests, two replicas again after {restored:.0f} s, "
          f"replicas serving {sorted(seen)}")
