"""Soak the engine in process: N concurrent streams for a long time, memory and underruns sampled.

    python -m tts_engine.tools.soak --demo 1.7b --streams 64 --duration 600 --json soak.json   # H200
    python -m tts_engine.tools.soak --demo tiny --streams 4 --duration 30                       # CPU

Each of `--streams` clients loops: a request of a random length (`--frames-min`..`--frames-max` codec
frames, random text and seed); one in `--hangup-every` stops listening after a few chunks (the engine must
free it); every listened stream is played by the bench's real-time player with no pre-buffer, so its
underruns are counted. Every `--sample-s` seconds a sample records requests done, errors, underruns and
first-chunk p95 of that window, GPU memory (allocated and reserved by torch, used on the device as NVML
sees it) and host resident memory. At the end the engine must hold nothing for any request.

Why in process: the soak is about the engine's own state over time (leaks in per-request tables,
allocator growth, stuck streams); the HTTP layer has its own soak test (tests/test_soak.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tts_engine.tools.bench import (
    SAMPLE_RATE,
    TEXTS,
    default_stage_config,
    environment,
    player_underruns,
    resolve_checkpoint,
)

log = logging.getLogger("tts_engine.tools.soak")


@dataclass
class Window:
    """What happened since the previous sample."""
    t_s: float
    done: int = 0
    hangups: int = 0
    errors: int = 0
    underrun_streams: int = 0
    first_chunk_s: list[float] = field(default_factory=list)
    audio_s: float = 0.0


def host_rss_mib() -> float:
    """Resident memory of this process (Linux /proc; the soak's host-memory figure)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def gpu_memory_mib(devices: list) -> dict[str, float]:
    """torch's allocated/reserved and the device's used memory (NVML), per GPU the engine uses."""
    import torch

    out: dict[str, float] = {}
    for device in devices:
        if device.type != "cuda":
            continue
        index = device.index if device.index is not None else torch.cuda.current_device()
        out[f"cuda{index}_allocated"] = torch.cuda.memory_allocated(index) / 2**20
        out[f"cuda{index}_reserved"] = torch.cuda.memory_reserved(index) / 2**20
        try:
            free, total = torch.cuda.mem_get_info(index)
            out[f"cuda{index}_used"] = (total - free) / 2**20
        except RuntimeError:
            pass
    return out


class Soak:
    def __init__(self, engine, *, streams: int, duration_s: float, frames: tuple[int, int], hangup_every: int,
                 speaker: str | None = None, voice=None, seed: int = 7):
        self.engine = engine
        self.streams = streams
        self.duration_s = duration_s
        self.frames = frames
        self.hangup_every = hangup_every
        self.speaker = speaker
        self.voice = voice
        self.rng = random.Random(seed)
        self.window = Window(t_s=0.0)
        self.totals = {"requests": 0, "hangups": 0, "errors": 0, "underrun_streams": 0, "listened": 0,
                       "audio_s": 0.0}
        self.error_kinds: dict[str, int] = {}
        self._count = 0

    def _request(self):
        from tts_engine import SpeechRequest

        self._count += 1
        n = self.rng.randint(*self.frames)
        kw: dict[str, Any] = dict(text=self.rng.choice(TEXTS), language="english", max_new_tokens=n + 1,
                                  min_new_tokens=n + 1, seed=self.rng.randrange(1 << 30))
        if self.voice is not None:
            kw["voice"] = self.voice
        elif self.speaker:
            kw["speaker"] = self.speaker
        return SpeechRequest(**kw), self._count % self.hangup_every == 0

    async def _one(self) -> None:
        request, hang_up = self._request()
        start = time.perf_counter()
        chunks: list[tuple[float, int]] = []
        listened = 0
        stream = self.engine.generate(request)
        try:
            async for chunk in stream:
                if chunk.audio.size:
                    chunks.append((time.perf_counter() - start, int(chunk.audio.size)))
                    listened += 1
                    if hang_up and listened >= 2:
                        break            # the listener went away: closing the generator aborts the request
        except Exception as exc:  # counted, the soak goes on
            name = type(exc).__name__
            self.error_kinds[name] = self.error_kinds.get(name, 0) + 1
            self.window.errors += 1
            self.totals["errors"] += 1
            return
        finally:
            await stream.aclose()
        w = self.window
        w.done += 1
        self.totals["requests"] += 1
        if chunks:
            w.first_chunk_s.append(chunks[0][0])
        if hang_up:
            w.hangups += 1
            self.totals["hangups"] += 1
            return
        self.totals["listened"] += 1
        underruns, _ = player_underruns(chunks)
        audio = sum(n for _, n in chunks) / SAMPLE_RATE
        w.audio_s += audio
        self.totals["audio_s"] += audio
        if underruns:
            w.underrun_streams += 1
            self.totals["underrun_streams"] += 1

    async def _client(self, stop_at: float) -> None:
        while time.perf_counter() < stop_at:
            await self._one()

    async def run(self, sample_s: float, on_sample) -> list[dict]:
        devices = sorted({self.engine.device, self.engine.decoder_device}, key=str)
        t0 = time.perf_counter()
        samples = [self._sample(t0, devices)]                  # after warm-up, before any load
        on_sample(samples[-1])
        stop_at = t0 + self.duration_s
        clients = [asyncio.ensure_future(self._client(stop_at)) for _ in range(self.streams)]
        while not all(c.done() for c in clients):
            await asyncio.wait(clients, timeout=sample_s)
            samples.append(self._sample(t0, devices))
            on_sample(samples[-1])
        for c in clients:
            c.result()                                           # a client that raised fails the soak loudly
        return samples

    async def leftover(self, wait_s: float = 2.0) -> dict[str, list[str]]:
        """What the engine still holds per part once the last hang-ups' aborts have had `wait_s` to land."""
        deadline = time.perf_counter() + wait_s
        while True:
            held = {k: sorted(v) for k, v in self.engine.debug_state().items() if v}
            if not held or time.perf_counter() > deadline:
                return held
            await asyncio.sleep(0.05)

    def _sample(self, t0: float, devices: list) -> dict:
        w, now = self.window, time.perf_counter() - t0
        firsts = sorted(w.first_chunk_s)
        row = {"t_s": round(now, 1), "done": w.done, "hangups": w.hangups, "errors": w.errors,
               "underrun_streams": w.underrun_streams, "audio_s_per_s": round(w.audio_s / max(now - w.t_s, 1e-9), 2),
               "first_chunk_p95_ms": round(1000 * firsts[int(0.95 * (len(firsts) - 1))], 1) if firsts else None,
               "in_flight": self.engine.active_request_count, "host_rss_mib": round(host_rss_mib(), 1),
               **{k: round(v, 1) for k, v in gpu_memory_mib(devices).items()}}
        self.window = Window(t_s=now)
        return row


def drift(samples: list[dict], key: str) -> dict[str, float] | None:
    """First sample (after warm-up) vs the last and the largest seen, for one memory series."""
    values = [s[key] for s in samples if key in s]
    if not values:
        return None
    first, last, peak = values[0], values[-1], max(values)
    return {"after_warmup": first, "end": last, "peak": peak,
            "end_vs_warmup_pct": round(100 * (last - first) / first, 2) if first else None,
            # the second half's spread: flat memory means no growth once the load is steady
            "second_half_range": round(max(values[len(values) // 2:]) - min(values[len(values) // 2:]), 1)}


def summarize(soak: Soak, samples: list[dict], leftover: dict) -> dict:
    keys = [k for k in samples[0] if k.endswith(("_allocated", "_reserved", "_used"))] + ["host_rss_mib"]
    p95s = [s["first_chunk_p95_ms"] for s in samples[1:] if s.get("first_chunk_p95_ms") is not None]
    return {"totals": {**soak.totals, "audio_s": round(soak.totals["audio_s"], 1)},
            "error_kinds": soak.error_kinds,
            "memory": {k: drift(samples, k) for k in keys},
            "first_chunk_p95_ms_by_window": {"median": statistics.median(p95s) if p95s else None,
                                             "max": max(p95s) if p95s else None},
            "left_in_engine": leftover}


async def soak_engine(args, report) -> dict:
    import torch

    from tts_engine import TTSEngine

    folder = resolve_checkpoint(args)
    on_gpu = torch.cuda.is_available() and (args.device or "cuda").startswith("cuda")
    overrides: dict[str, Any] = {"max_num_seqs": max(args.streams, 1), "max_model_len": args.max_model_len}
    if args.device:
        overrides["device"] = args.device
    if on_gpu:
        overrides["gpu_memory_utilization"] = args.gpu_memory_utilization
    t = time.perf_counter()
    engine = TTSEngine.from_pretrained(folder, stage_config=default_stage_config(args, on_gpu),
                                       **overrides)
    startup_s = time.perf_counter() - t
    warm_s = engine.warmup()
    log.info("engine started in %.1f s, warm-up %.1f s", startup_s, warm_s)
    speakers = json.loads((folder / "config.json").read_text())["talker_config"].get("spk_id") or {}
    voice = None
    if engine.config.model_type == "base":
        from tts_engine.tools.bench import REPO
        voice = engine.create_voice_prompt(str(REPO / "assets" / "reference_en.wav"), x_vector_only=True)
    soak = Soak(engine, streams=args.streams, duration_s=args.duration, frames=(args.frames_min, args.frames_max),
                hangup_every=args.hangup_every, speaker=sorted(speakers)[0] if speakers else None, voice=voice)
    try:
        samples = await soak.run(args.sample_s, report)
        leftover = await soak.leftover()
        result = {"startup_s": round(startup_s, 1), "warmup_s": round(warm_s, 1), "samples": samples,
                  "summary": summarize(soak, samples, leftover)}
    finally:
        engine.close()
    return result


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="checkpoint folder or Hub id")
    ap.add_argument("--demo", choices=("tiny", "0.6b", "1.7b"), help="a random checkpoint of these shapes")
    ap.add_argument("--demo-type", default="custom_voice", choices=("base", "custom_voice", "voice_design"))
    ap.add_argument("--demo-dir")
    ap.add_argument("--rebuild", action="store_true")
    ap.add_argument("--stage-config")
    ap.add_argument("--device")
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    ap.add_argument("--frames-min", type=int, default=25)
    ap.add_argument("--frames-max", type=int, default=150)
    ap.add_argument("--hangup-every", type=int, default=10, help="every n-th request's listener leaves early")
    ap.add_argument("--sample-s", type=float, default=10.0)
    ap.add_argument("--json", help="write samples and summary here (rewritten at every sample)")
    ap.add_argument("--label", default="")
    args = ap.parse_args(argv)
    if not args.model and not args.demo:
        ap.error("give --model or --demo")
    return args


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parse_args(argv)
    import torch

    doc: dict[str, Any] = {"label": args.label, "environment": environment("cuda" if torch.cuda.is_available()
                                                                            else "cpu"), "samples": []}

    def report(sample: dict) -> None:
        doc["samples"].append(sample)
        print(json.dumps(sample), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(doc, indent=1))

    result = asyncio.run(soak_engine(args, report))
    doc.update(result)
    print(json.dumps(result["summary"], indent=1), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1))
    summary = result["summary"]
    return 0 if not summary["totals"]["errors"] and not summary["left_in_engine"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

