"""Soak: six concurrent clients stream against the live-like app for a while (5 min by default,
TTS_SOAK_S to change), with hang-ups and slow readers among them. No 5xx, no broken connection, resident
memory at the end within 15% of after warm-up, and the app answers afterwards.

Its own `app.py --demo` process (its memory is measured)."""

from __future__ import annotations

import asyncio
import os
import random
import time

import httpx
import psutil

from tests.conftest import free_port, start_app, wait_ready

SOAK_S = float(os.environ.get("TTS_SOAK_S", 300))
WARM_S = min(30.0, SOAK_S / 5)
TEXTS = ["Hello there, how are you today?", "The weather is fine, thank you.", "Let us talk about something else.",
         "One, two, three, four.", "A longer sentence, with a comma, and then some more words to speak."]


async def _client(kind: str, url: str, until: float, stats: dict, rng: random.Random) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        while time.monotonic() < until:
            body = {"input": rng.choice(TEXTS), "voice": "sample"}
            try:
                if kind in ("reader", "hang-up", "slow"):
                    body.update(response_format="pcm", stream=True)
                    async with client.stream("POST", "/v1/audio/speech", json=body) as r:
                        stats["status"].append(r.status_code)
                        got = 0
                        async for part in r.aiter_raw():
                            got += len(part)
                            if kind == "hang-up" and got > 4000:
                                break                            # the client goes away mid-stream
                            if kind == "slow":
                                await asyncio.sleep(len(part) / 48000 * 1.5)   # reads at 2/3 real time
                elif kind == "sse":
                    body.update(stream_format="sse")
                    async with client.stream("POST", "/v1/audio/speech", json=body) as r:
                        stats["status"].append(r.status_code)
                        text = "".join([line async for line in r.aiter_lines()])
                        assert "speech.audio.done" in text, text[-300:]
                else:   # file requests and the voice list
                    r = await client.post("/v1/audio/speech", json={**body, "response_format": "mp3"})
                    stats["status"].append(r.status_code)
                    stats["status"].append((await client.get("/v1/audio/voices")).status_code)
                stats["requests"] += 1
            except (httpx.HTTPError, AssertionError) as exc:
                stats["broken"].append(f"{kind}: {type(exc).__name__}: {exc}")


def _traffic(url: str, seconds: float, seed: int) -> dict:
    stats: dict = {"status": [], "broken": [], "requests": 0}
    until = time.monotonic() + seconds
    kinds = ["reader", "sse", "hang-up", "slow", "file", "reader"]

    async def run():
        await asyncio.gather(*(_client(k, url, until, stats, random.Random(seed + i)) for i, k in enumerate(kinds)))
    asyncio.run(run())
    return stats


def test_soak_six_clients_with_hang_ups_and_slow_readers(tmp_path, capsys):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc, log = start_app(tmp_path, port, "--max-sessions", "4")
    try:
        wait_ready(proc, url, log)
        app = psutil.Process(proc.pid)
        warm = _traffic(url, WARM_S, seed=1)        # every path once: allocators and caches settle
        rss_warm = app.memory_info().rss
        soak = _traffic(url, SOAK_S, seed=2)
        rss_end = app.memory_info().rss
        after = httpx.post(url + "/v1/audio/speech", json={"input": "Still here.", "voice": "sample"}, timeout=120)
        health = httpx.get(url + "/healthz", timeout=30).json()
    finally:
        proc.terminate()
        proc.wait(timeout=120)
    growth = rss_end / rss_warm - 1
    with capsys.disabled():
        print(f"\n[soak {SOAK_S:.0f} s] {soak['requests']} requests by 6 clients; RSS after warm-up "
              f"{rss_warm / 2**20:.0f} MiB, after soak {rss_end / 2**20:.0f} MiB ({100 * growth:+.1f}%); "
              f"statuses {sorted(set(soak['status']))}")
    for stats in (warm, soak):
        assert not stats["broken"], stats["broken"][:5]
        assert all(status < 500 for status in stats["status"]), sorted(set(stats["status"]))
    assert soak["requests"] >= 6 * 2, soak["requests"]
    assert growth <= 0.15, f"resident memory grew {100 * growth:.1f}% during the soak"
    assert after.status_code == 200 and after.headers["content-type"] == "audio/wav"
    assert health["status"] == "ok" and health["active_requests"] == 0, health
