"""Benchmark: time to first audio, per-frame latency, real-time factor, throughput and playback
underruns against concurrency, for our engine, and one stream of two peers side by side: the official
`qwen_tts` (`--reference`; float32 on CPU, bfloat16 on a GPU) and faster-qwen3-tts (`--faster-only`, from
its own package folder: scripts/gpu_peers_bench.sh).

    python -m tts_engine.tools.bench --demo tiny --concurrency 1,4 --frames 40            # CPU smoke run
    python -m tts_engine.tools.bench --demo 0.6b --concurrency 1 --frames 8 --reference   # CPU, vs official
    python -m tts_engine.tools.bench --demo 1.7b --concurrency 1 --frames 50 --faster-only --faster-chunks 1,8
    python -m tts_engine.tools.bench --combine ours.json official.json faster.json --markdown peers.md
    python -m tts_engine.tools.bench --demo 1.7b --concurrency 1,4,16,64 --frames 100     # GPU
    python -m tts_engine.tools.bench --model Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice --speaker ryan
    python -m tts_engine.tools.bench --webrtc http://127.0.0.1:7860 --voice sample        # a running app
    python -m tts_engine.tools.bench --url http://127.0.0.1:7860 --voice sample --concurrency 16,64  # over HTTP

What is measured, per request (times from the moment the request is handed to the engine):
  * first chunk: the first delta PCM chunk reaches the caller (server side, in process; `engine`
    columns are the engine's own RequestMetrics, which start after prompt building);
  * first audible: the arrival of the chunk holding the first 20 ms window (10 ms hop) whose RMS
    is >= -45 dBFS; over WebRTC, the first received 20 ms frame above -45 dBFS (client side);
  * per-frame latency: time between consecutive codec frames (80 ms of audio each) of one stream;
  * RTF: wall time of the request / audio seconds (< 1 is faster than real time; xRT = 1/RTF);
  * audio-s/s: audio seconds finished per wall second over a concurrency level;
  * underruns: a real-time player starts at the first chunk and plays continuously; every time the
    next chunk arrives after the buffered audio ran out is one underrun (stall time summed).
Random-weight checkpoints rarely stop on their own, so each request asks for exactly `--frames`
frames (min_new_tokens = max_new_tokens = frames + 1: the last sampled token is never fed back).
Output: a Markdown table on stdout (and --markdown FILE) and everything in JSON (--json FILE).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import gc
import json
import logging
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

import numpy as np

log = logging.getLogger("tts_engine.tools.bench")
SAMPLE_RATE = 24000
FRAME_S = 0.08
AUDIBLE_DBFS = -45.0
REPO = Path(__file__).resolve().parents[2]

TEXTS = [
    "The quick brown fox jumps over the lazy dog, and then it runs back into the forest.",
    "Real-time speech needs the first sound within tens of milliseconds of the request.",
    "She sells sea shells by the sea shore, every single morning before the tide comes in.",
    "A streaming decoder turns sixteen codes per frame into eighty milliseconds of audio.",
    "Please remember to bring an umbrella tomorrow, because the forecast says it will rain.",
    "Numbers like three hundred and forty two are spoken out in full by most voices.",
]


# ---- metrics --------------------------------------------------------------------------------------
@dataclass
class RequestResult:
    request_id: str
    submitted_s: float                       # since the level started
    frames: int = 0
    audio_s: float = 0.0
    first_chunk_s: float | None = None       # caller-observed (in process)
    first_audible_s: float | None = None
    finished_s: float | None = None
    engine_first_frame_s: float | None = None
    engine_first_chunk_s: float | None = None
    submit_s: float | None = None           # from the call to the engine's route existing (validation, prompt)
    engine_legs: dict[str, float] = field(default_factory=dict)   # RequestMetrics.first_audio_legs()
    frame_intervals_s: list[float] = field(default_factory=list)
    chunks: list[tuple[float, int]] = field(default_factory=list)   # (arrival since submit, samples)
    underruns: int = 0
    underrun_s: float = 0.0
    late_chunk_indexes: list[int] = field(default_factory=list)   # which chunks (from 1) came after a run-dry
    # in process: the engine's index of each chunk in `chunks`, and each engine chunk's (handed to Stage 1, its
    # call began, its audio ready), seconds since submission (RequestMetrics)
    chunk_indexes: list[int] = field(default_factory=list)
    engine_chunk_times: list[tuple[float, float, float]] = field(default_factory=list)
    late_chunk_legs: list[dict[str, float]] = field(default_factory=list)   # stall, stage1_wait, stage1_call
    error: str | None = None
    replica: str | None = None               # --url: the x-tts-replica header of the answer (Ray Serve)

    @property
    def rtf(self) -> float | None:
        return self.finished_s / self.audio_s if self.finished_s and self.audio_s else None


def first_audible_sample(audio: np.ndarray, sr: int = SAMPLE_RATE, threshold_dbfs: float = AUDIBLE_DBFS,
                         window_s: float = 0.02, hop_s: float = 0.01) -> int | None:
    """Index of the first sample of the first `window_s` window (hop `hop_s`) at or above the level."""
    win, hop = int(sr * window_s), int(sr * hop_s)
    if audio.size < win:
        return None
    x = audio.astype(np.float64)
    power = np.convolve(x * x, np.ones(win), mode="valid")[::hop] / win
    level = 10 * np.log10(np.maximum(power, 1e-20))
    idx = np.nonzero(level >= threshold_dbfs)[0]
    return int(idx[0] * hop) if idx.size else None


def player_underruns(chunks: list[tuple[float, int]], sr: int = SAMPLE_RATE,
                     prebuffer_s: float = 0.0, tolerance_s: float = 0.001) -> tuple[int, float]:
    """A real-time player fed by (arrival time, samples) chunks: it starts once `prebuffer_s` of audio
    (or everything) has arrived and then plays without pause. Returns (underruns, total stall seconds)."""
    late = late_chunks(chunks, sr, prebuffer_s, tolerance_s)
    return len(late), sum(stall for _, stall in late)


def late_chunks(chunks: list[tuple[float, int]], sr: int = SAMPLE_RATE, prebuffer_s: float = 0.0,
                tolerance_s: float = 0.001) -> list[tuple[int, float]]:
    """(index from 1, stall seconds) of each chunk that arrived after the player ran dry (`player_underruns`):
    which chunk of the schedule misses its deadline tells which lever helps. Chunks without audio (a first
    chunk the leading-silence trim emptied) are not counted."""
    chunks = [(t, n) for t, n in chunks if n > 0]
    if not chunks:
        return []
    buffered, start = 0.0, None
    for i, (t, n) in enumerate(chunks):
        buffered += n / sr
        if buffered >= prebuffer_s or i == len(chunks) - 1:
            start, first_rest = t, i + 1
            break
    end = start + buffered                      # when the buffered audio runs out
    late = []
    for index, (t, n) in enumerate(chunks[first_rest:], start=first_rest + 1):
        if t > end + tolerance_s:
            late.append((index, t - end))
            end = t
        end += n / sr
    return late


def _pct(values: list[float], q: float) -> float | None:
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    k = (len(values) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def summarize(name: str, level: int, mode: str, results: list[RequestResult], wall_s: float,
              frames: int, extra: dict | None = None) -> dict:
    ok = [r for r in results if r.error is None and r.finished_s is not None]
    intervals = [x for r in ok for x in r.frame_intervals_s]
    audio = sum(r.audio_s for r in ok)
    ms = lambda v: None if v is None else round(v * 1000, 1)  # noqa: E731
    out = {
        "name": name, "level": level, "mode": mode, "requests": len(results), "errors": len(results) - len(ok),
        "frames_per_request": frames,
        "first_chunk_ms_p50": ms(_pct([r.first_chunk_s for r in ok], 50)),
        "first_chunk_ms_p95": ms(_pct([r.first_chunk_s for r in ok], 95)),
        "first_audible_ms_p50": ms(_pct([r.first_audible_s for r in ok], 50)),
        "first_audible_ms_p95": ms(_pct([r.first_audible_s for r in ok], 95)),
        "engine_first_chunk_ms_p50": ms(_pct([r.engine_first_chunk_s for r in ok], 50)),
        # before Stage 0 (executor, validation, prompt build) and after Stage 1 (delivery to the consumer)
        "submit_ms_p95": ms(_pct([r.submit_s for r in ok if r.submit_s is not None], 95)),
        "outside_stages_ms_p95": ms(_pct([r.first_chunk_s - r.engine_first_chunk_s for r in ok
                                          if r.first_chunk_s is not None and r.engine_first_chunk_s is not None], 95)),
        "frame_ms_p50": ms(_pct(intervals, 50)), "frame_ms_p95": ms(_pct(intervals, 95)),
        "rtf_p50": _round(_pct([r.rtf for r in ok], 50), 4), "rtf_p95": _round(_pct([r.rtf for r in ok], 95), 4),
        "audio_s_per_s": _round(audio / wall_s if wall_s > 0 else None, 2),
        "streams_with_underruns": sum(1 for r in ok if r.underruns), "underruns": sum(r.underruns for r in ok),
        "underrun_ms_total": ms(sum(r.underrun_s for r in ok)), "wall_s": round(wall_s, 2),
        "underruns_by_chunk": {str(i): n for i, n in sorted(collections.Counter(
            i for r in ok for i in r.late_chunk_indexes).items())},
        **late_chunk_summary([leg for r in ok for leg in r.late_chunk_legs]),
        "error_messages": sorted({r.error for r in results if r.error})[:3],
    }
    path = first_chunk_path(ok)
    if path:
        out["first_chunk_path_ms"] = path
    if GC_PAUSES.installed:
        out.update(GC_PAUSES.take())
    out.update(STEPS.take())
    out.update(COUNTERS.take())
    out.update(extra or {})
    return out


def late_chunk_summary(legs: list[dict[str, float]]) -> dict:
    """`late_chunk_legs_ms`: p50 and max of each leg over a level's late chunks (none: no key)."""
    if not legs:
        return {}
    return {"late_chunk_legs_ms": {f"{leg}_{stat}": round(fn([x[leg] for x in legs]) * 1000, 1)
                                   for leg in ("stall", "stage1_wait", "stage1_call")
                                   for stat, fn in (("50", lambda v: _pct(v, 50)), ("max", max))}}


def first_chunk_path(results: list[RequestResult]) -> dict[str, float]:
    """Where the time to the first chunk goes, leg by leg (p50 and p95 of each, ms; in-process runs only):
    queue (waiting for an executor thread, validation), prompt (building it), admit (until Stage 0 hands it
    to vLLM), first_frame (prefill and the steps to the first frame), decode (until Stage 1 has decoded the
    first chunk; split into decode_wait, until Stage 1 begins that chunk's call, and decode_call, the call)
    and delivery (until the consumer holds it). Legs' p95s do not add up to the total's."""
    legs: dict[str, list[float]] = collections.defaultdict(list)
    for r in results:
        engine = r.engine_legs
        if (r.submit_s is None or r.engine_first_chunk_s is None or r.first_chunk_s is None
                or not {"prompt", "admit", "first_frame", "decode"} <= engine.keys()):
            continue
        for leg, value in {"queue": r.submit_s - engine["prompt"], **engine,
                           "delivery": r.first_chunk_s - r.submit_s - r.engine_first_chunk_s}.items():
            legs[leg].append(value)
    return {f"{leg}_{q}": round(_pct(values, q) * 1000, 1) for leg, values in legs.items() for q in (50, 95)}


class GcPauses:
    """Python's garbage-collector pauses in this process (every thread stops for them), counted between
    `reset` and `take`: the in-process bench reports them per level, so a latency tail can be checked
    against them."""

    def __init__(self):
        self.installed = False
        self._start: float | None = None
        self.pauses: list[float] = []

    def install(self) -> None:
        if not self.installed:
            gc.callbacks.append(self._on_gc)
            self.installed = True

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            self.pauses.append(time.perf_counter() - self._start)
            self._start = None

    def reset(self) -> None:
        self.pauses = []

    def take(self) -> dict:
        pauses, self.pauses = self.pauses, []
        return {"gc_pauses": len(pauses), "gc_pause_ms_total": round(1000 * sum(pauses), 1),
                "gc_pause_ms_max": round(1000 * max(pauses, default=0.0), 1)}


GC_PAUSES = GcPauses()


class StageZeroSteps:
    """Stage 0's step times per level (`stages.step_log`), for the in-process bench: taken at a level's start
    (discarded) and at its row."""

    def __init__(self):
        self.log = None

    def reset(self) -> None:
        if self.log is not None:
            self.log.take()

    def take(self) -> dict:
        return summarize_steps(self.log.take()) if self.log is not None else {}


def summarize_steps(records: list) -> dict:
    """Stage 0 step wall times (`stages.step_log.StepRecord`) in ms, p50/p95 overall and p95 split by whether a
    joining request's prefill rode in the step, and the share of steps it did."""
    def ms(seconds: float | None) -> float | None:
        return None if seconds is None else round(seconds * 1000, 2)

    every = [r.seconds for r in records]
    joined = [r.seconds for r in records if r.joined]
    plain = [r.seconds for r in records if not r.joined]
    return {"steps": len(records), "step_ms_p50": ms(_pct(every, 50)), "step_ms_p95": ms(_pct(every, 95)),
            "step_ms_p95_joined": ms(_pct(joined, 95)), "step_ms_p95_not_joined": ms(_pct(plain, 95)),
            "steps_joined_pct": round(100 * len(joined) / len(records), 1) if records else None}


STEPS = StageZeroSteps()


class LevelCounters:
    """Engine counters per level: what `read` returns at the level's end minus what it returned at its start.
    Stage 1's decode calls, how many of them began with the chunk they were for already overdue (its player
    had run dry: `AsyncDecodingPipeline.calls_overdue`) and how many the pass-over bound of the smallest-first
    order chose (`max_passed_over`: whether the bound acts at a level at all); the prompt builder's host pieces
    found and computed (a computed one waited for the GPU: `PromptBuilder.first_rows`, `leads`)."""

    def __init__(self):
        self.read: Callable[[], dict[str, int]] | None = None
        self._start: dict[str, int] = {}

    def reset(self) -> None:
        if self.read is not None:
            self._start = self.read()

    def take(self) -> dict:
        if self.read is None:
            return {}
        now = self.read()
        self._start, start = now, self._start
        return {key: value - start.get(key, 0) for key, value in now.items()}


def engine_counters(engine) -> dict[str, int]:
    prompts, pipeline = engine.prompts, engine.pipeline
    return {"stage1_calls": pipeline.calls, "stage1_calls_overdue": pipeline.calls_overdue,
            "stage1_calls_by_pass_over": pipeline.calls_by_pass_over,
            "prompt_rows_cached": prompts.first_rows.hits + prompts.leads.hits,
            "prompt_rows_computed": prompts.first_rows.misses + prompts.leads.misses}


COUNTERS = LevelCounters()


def _round(v, nd):
    return None if v is None else round(v, nd)


COLUMNS = [("name", "run"), ("level", "conc."), ("requests", "req"), ("frames_per_request", "frames"),
           ("first_chunk_ms_p50", "1st chunk p50 ms"), ("first_chunk_ms_p95", "1st chunk p95 ms"),
           ("first_audible_ms_p50", "1st audible p50 ms"), ("first_audible_ms_p95", "1st audible p95 ms"),
           ("frame_ms_p50", "frame p50 ms"), ("frame_ms_p95", "frame p95 ms"), ("rtf_p50", "RTF p50"),
           ("audio_s_per_s", "audio-s/s"), ("streams_with_underruns", "streams w/ underrun"),
           ("underrun_ms_total", "stall ms"), ("submit_ms_p95", "submit p95 ms"),
           ("outside_stages_ms_p95", "outside stages p95 ms"),
           ("gc_pause_ms_max", "GC pause max ms"), ("errors", "err")]


def markdown_table(rows: list[dict], columns=COLUMNS) -> str:
    head = "| " + " | ".join(title for _, title in columns) + " |"
    sep = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join("" if r.get(k) is None else str(r.get(k)) for k, _ in columns) + " |" for r in rows]
    return "\n".join([head, sep, *body])


# ---- our engine -----------------------------------------------------------------------------------
def make_request(args, index: int, voice=None):
    from tts_engine import SpeechRequest
    text = TEXTS[index % len(TEXTS)]
    kw: dict[str, Any] = dict(text=text, language="english", max_new_tokens=args.frames + 1,
                              min_new_tokens=args.frames + 1, trim_leading_silence=not args.no_trim)
    if args.seed is not None:
        kw["seed"] = args.seed + index
    if voice is not None:
        kw["voice"] = voice
    elif args.speaker:
        kw["speaker"] = args.speaker
    if args.instruct:
        kw["instruct"] = args.instruct
    return SpeechRequest(**kw)


async def _one_request(engine, request, t_level: float) -> Heard:
    result = RequestResult(request_id="", submitted_s=time.perf_counter() - t_level)
    t0 = time.perf_counter()
    pieces: list[np.ndarray] = []
    try:
        async for chunk in engine.generate(request):
            now = time.perf_counter() - t0
            result.request_id = chunk.request_id
            if chunk.audio.size:
                if result.first_chunk_s is None:
                    result.first_chunk_s = now
                pieces.append(chunk.audio)
                result.chunks.append((now, int(chunk.audio.size)))
                result.chunk_indexes.append(chunk.chunk_idx)
            if chunk.is_finished:
                result.finished_s = now
                m = chunk.metrics
                if m is not None:
                    result.frames = m.frames
                    result.engine_first_frame_s = m.first_frame_s
                    result.engine_first_chunk_s = m.first_chunk_s
                    result.submit_s = m.submitted_at - t0
                    result.engine_legs = m.first_audio_legs()
                    result.engine_chunk_times = list(zip(m.chunk_put_s, m.chunk_call_s, m.chunk_done_s))
                    times = m.frame_times_s
                    result.frame_intervals_s = [b - a for a, b in zip(times, times[1:])]
    except Exception as exc:  # a failed request is counted, not fatal
        result.error = f"{type(exc).__name__}: {exc}"
    return result, pieces


def _keep_details(args, row: dict, results: list[RequestResult]) -> None:
    if args.keep_requests:
        row["requests_detail"] = [dataclasses.asdict(r) for r in results]


def _listened(result: RequestResult, pieces: list[np.ndarray], prebuffer_s: float,
              engine_chunks: bool = False) -> RequestResult:
    """What a listener gets from the chunks: duration, first audible chunk, underruns of a real-time player.
    `engine_chunks`: the chunks are the engine's (in process), so which of them came late is kept; over HTTP
    or WebRTC they are network reads or 20 ms packets, whose indexes say nothing about the schedule."""
    audio = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
    result.audio_s = audio.size / SAMPLE_RATE
    idx = first_audible_sample(audio)
    if idx is not None:
        total = 0
        for t, n in result.chunks:
            total += n
            if total > idx:
                result.first_audible_s = t
                break
    late = late_chunks(result.chunks, prebuffer_s=prebuffer_s)
    result.underruns, result.underrun_s = len(late), sum(stall for _, stall in late)
    result.late_chunk_indexes = [index for index, _ in late] if engine_chunks else []
    if engine_chunks:
        result.late_chunk_legs = late_chunk_legs(result, late)
    return result


def late_chunk_legs(result: RequestResult, late: list[tuple[int, float]]) -> list[dict[str, float]]:
    """For each chunk that came after the player ran dry: the stall, and the chunk's time in Stage 1 (waiting
    for its call, and the call). A wait about as long as the stall says Stage 1's order made it late; a short
    wait says its frames came late (Stage 0) or the call was slow."""
    legs = []
    for index, stall in late:
        engine_idx = result.chunk_indexes[index - 1]
        if engine_idx < len(result.engine_chunk_times):
            put, call, done = result.engine_chunk_times[engine_idx]
            legs.append({"stall": stall, "stage1_wait": call - put, "stage1_call": done - call})
    return legs


async def run_level(engine, args, level: int, voice=None, index0: int = 0, requests: int | None = None
                    ) -> tuple[list[RequestResult], float]:
    """Our engine in process at one level (see `run_arrivals`)."""
    def one(i: int, t_level: float):
        return _one_request(engine, make_request(args, index0 + i, voice), t_level)
    GC_PAUSES.reset()
    STEPS.reset()
    COUNTERS.reset()
    return await run_arrivals(args, level, one, requests, engine_chunks=True)


# A request's result and the audio pieces it brought, not analysed yet (see `run_arrivals`).
Heard = tuple[RequestResult, list[np.ndarray]]


async def run_arrivals(args, level: int, one: Callable[[int, float], Awaitable[Heard]], requests: int | None = None,
                       stream: int = 0, engine_chunks: bool = False) -> tuple[list[RequestResult], float]:
    """Closed loop (`level` streams, each starting its next request when one finishes) or Poisson
    arrivals (`level` requests per second); `one(i, t_level)` runs request i. `stream`: which of several
    client processes sharing a level this is (each draws its own Poisson arrivals).

    What each listener heard (`_listened`: first audible sample, underruns) is worked out after the level,
    not as each request ends: it is milliseconds of CPU per request on the client's event loop, and at 64
    streams finishing together it held other requests' chunks back by up to ~200 ms (p95), which the bench
    then reported as their latency (BENCHMARKS.md, sixth pass)."""
    n = requests if requests is not None else (args.requests or max(2 * level, 4))
    t_level = time.perf_counter()
    heard: list[Heard] = []
    if args.arrival == "closed":
        counter = iter(range(n))

        async def worker():
            for i in counter:
                heard.append(await one(i, t_level))
        await asyncio.gather(*(worker() for _ in range(min(level, n))))
    else:
        rng = random.Random(1234 + level + 100_003 * stream)
        tasks = []
        for i in range(n):
            tasks.append(asyncio.ensure_future(one(i, t_level)))
            await asyncio.sleep(rng.expovariate(level))
        heard = list(await asyncio.gather(*tasks))
    wall = time.perf_counter() - t_level
    prebuffer_s = args.prebuffer_ms / 1000
    return [_listened(r, pieces, prebuffer_s, engine_chunks) if r.error is None else r for r, pieces in heard], wall


# rows of a run that are not load levels (component timings, the kernel profile): kept out of the tables
AUX_ROWS = ("component", "kernel profile", "burst profile")

VARIANTS: dict[str, dict[str, Any]] = {
    # name: settings applied to a running engine (see apply_variant); each switches one optimization off
    "default": {},
    "no-predictor-graphs": {"predictor_graphs": False},                # eager 15-step predictor loop
    "plain-predictor-graphs": {"predictor_compile": False},            # graphs of the uncompiled loop
    # the smallest bucket's predictor graph with cuBLAS for every product, not the Triton kernel for o_proj's
    "no-small-gemv": {"predictor_small_gemv": False},
    # every compiled predictor graph samples with PyTorch's sort and Inductor's kernels, not the one Triton kernel
    "no-fused-sampler": {"predictor_fused_sampler": False},
    "host-syncs": {"host_syncs": True},                                # the old blocking uploads per step
    "no-decoder-graphs": {"decoder_graphs": False},
    "decoder-graphs-b1": {"decoder_graph_max_batch": 1},              # graphs for single streams only
    "decoder-fp32": {"tf32": False},                                   # no TF32 in the codec
    "seed-chunks": {"initial_chunk_size": 1, "chunk_growth": 1, "initial_chunk_repeats": 1},   # 1, then 25s
    "first-chunk-4": {"initial_chunk_size": 4, "initial_chunk_repeats": 1},   # 4, 8, 16, 25
    "prompt-default-stream": {"prompt_stream": False},                 # prompts built on the caller's stream
    "gc-unfrozen": {"gc_frozen": False},                               # no gc.freeze() after the warm-up
    "prompt-uncached": {"prompt_cache": False},                        # every prompt embeds its constant parts
    # prompts built on the GPU and read back (the constant parts still cached), not put together from host pieces
    "prompt-readback": {"prompt_host_pieces": False},
    # the prompt builder waits for rows it made on the GPU to reach the host (before the twelfth pass), instead of
    # Stage 0 admitting the request once its copy has completed
    "prompt-wait-readback": {"prompt_wait_for_prefill": True},
    # Stage 0 handles commands until its queue is empty before it steps (before the thirteenth pass): a burst's
    # first step waits for its last prompt
    "stage0-drain-commands": {"stage0_drain_commands": True},
    # candidates (switched on): at most two / one prompt builds at once (measured in the twelfth pass with Stage 0's
    # old loop and in the fourteenth with its new one: not adopted)
    "prompt-builds-2": {"concurrent_prompt_builds": 2},
    "prompt-builds-1": {"concurrent_prompt_builds": 1},
    # candidates (switched on; fourteenth pass, one thread measured once): requests submitted on a pool of the
    # engine's own of one / two threads, not on the event loop's default executor (20 threads on the H200 machine)
    "submit-threads-1": {"submit_threads": 1, "batch_submits": False},   # one thread, a request at a time
    "submit-threads-2": {"submit_threads": 2, "batch_submits": False},
    # the default before the fifteenth pass: submits on the event loop's executor, each request built alone
    "unbatched-submits": {"submit_threads": None, "batch_submits": False},
    "first-chunk-once": {"initial_chunk_repeats": 1},                  # 1, 2, 4, ...: chunk 2 takes twice the steps
    # a candidate (switched on): shorter Stage 1 calls (4 x 25 frames, not 16 x 25)
    "decoder-calls-100-frames": {"decoder_batch_frames": 100},
    # a candidate (switched on): Stage 1 calls that carry a first chunk run on a stream of Stage 0's priority
    "stage1-first-chunk-priority": {"first_chunk_priority": True},
    # frames go to Stage 1 after the whole talker step, not once the code predictor made them
    "late-handover": {"early_handover": False},
    # Stage 1 decodes every pending chunk before it reads new commands (the loop before the ninth pass): a first
    # chunk that arrives meanwhile waits for all of them
    "stage1-drain-pending": {"stage1_drain_pending": True},
    # each Stage 1 stream keeps a decoder state of its own (before the tenth pass): a batched call concatenates
    # every buffer in and slices every stream's out, instead of one gather and one scatter per buffer
    "stage1-per-stream-states": {"stage1_state_table": False},
    # a candidate (switched on; the default in the thirteenth pass): a new Stage 1 stream's decoder-state row is set
    # with the other rows opened since at the next call (one copy per buffer for all of them), not when it opens
    "stage1-lazy-open": {"stage1_lazy_open": True},
    # a candidate (switched on; sixteenth pass, not yet measured): lazy opens, so Stage 1 takes a burst's first chunks
    # as they come, with the calls that carry them at Stage 0's priority, so they do not crawl beside Stage 0's steps
    "stage1-lazy-open-priority": {"stage1_lazy_open": True, "first_chunk_priority": True},
    # candidates (switched on): the interpreter hands its lock to a waiting thread after 1 / 0.25 ms instead of
    # Python's 5 ms, so Stage 0 might wait less behind the threads building a burst's prompts and Stage 1 (measured
    # in the fourteenth pass: no gain)
    "switch-interval-1ms": {"switch_interval_ms": 1.0},
    "switch-interval-0.25ms": {"switch_interval_ms": 0.25},
    # Stage 1 takes the smallest pending chunks first (a chunk passed over 8 times gets every other call; before
    # the eleventh pass), not the chunk due first
    "stage1-smallest-first": {"stage1_order": "smallest"},
}


# Variants that need an engine of their own (set at start-up, not switchable in a running engine):
# `--engine-variant NAME` starts the engine with these stage-config overrides and names its rows after it.
ENGINE_VARIANTS: dict[str, dict[str, Any]] = {
    "sync-scheduling": {"async_scheduling": False},    # vLLM schedules step t+1 only after step t's outputs
    # vLLM's own graphs: full graphs for decode-only steps only (a step a prefill joins runs piecewise, attention
    # eager) and up to 2 x max_num_seqs tokens
    "talker-piecewise-graphs": {"cudagraph_mode": "FULL_AND_PIECEWISE", "cudagraph_max_tokens": None},
    # full graphs only up to 512 tokens (the default before the eighth pass): a step of more tokens (a burst of
    # prompts) runs without graphs
    "talker-graphs-512": {"cudagraph_max_tokens": 512},
    # Stage 0 on a stream of the default priority, the same as Stage 1's
    "talker-normal-priority": {"high_priority_steps": False},
    # a candidate for a burst of joins (switched on): a budget every step of which fits 512-token graphs
    # (measured: BENCHMARKS seventh pass, not adopted)
    "talker-budget-512": {"max_batched_tokens": 512},
    # a candidate for a burst of joins (switched on): 4,096 tokens a step, graphs to match (which needs sequences
    # that long: max_model_len 4,096), so a burst of 64 prompts prefills in two steps, not three (measured:
    # BENCHMARKS eleventh pass, the first frames came no sooner; not adopted)
    "talker-budget-4096": {"max_batched_tokens": 4096, "cudagraph_max_tokens": 4096, "max_model_len": 4096},
}


_SCHEDULE_FIELDS = {"initial_chunk_size": "initial", "chunk_size": "size", "chunk_growth": "growth",
                    "initial_chunk_repeats": "repeats"}


def apply_variant(engine, settings: dict[str, Any]) -> dict[str, Any]:
    """Switch engine knobs at run time; returns the previous values (to restore)."""
    previous: dict[str, Any] = {}
    predictor = engine.talker_engine.model.code_predictor
    for key, value in settings.items():
        if key == "predictor_graphs":
            previous[key] = predictor.use_graphs
            predictor.use_graphs = value
        elif key == "predictor_compile":
            graphs = predictor.graphs
            previous[key] = True
            if graphs is not None and not value:
                from tts_engine.models.qwen3_tts.code_predictor import PredictorGraphs
                plain = getattr(predictor, "_plain_graphs", None)
                if plain is None:
                    plain = PredictorGraphs(predictor, graphs.max_batch, graphs.device, graphs.hidden.dtype,
                                            compile=False)
                    plain.capture_all()
                    predictor._plain_graphs, predictor._fused_graphs = plain, graphs
                predictor.graphs = plain
            elif value and getattr(predictor, "_fused_graphs", None) is not None:
                predictor.graphs = predictor._fused_graphs
        elif key == "predictor_small_gemv":
            previous[key] = predictor.small_gemv
            predictor.small_gemv = value
            if predictor.graphs is not None:
                predictor.graphs.capture_small()
        elif key == "predictor_fused_sampler":
            previous[key] = predictor.fused_sampler
            predictor.fused_sampler = value
            if predictor.graphs is not None:
                predictor.graphs.capture_sampled()
        elif key == "host_syncs":
            previous[key] = "decode_embeddings" in vars(engine.talker)
            _host_syncs(engine.talker, value)
        elif key == "early_handover":
            previous[key] = engine.talker.early_handover
            engine.talker.early_handover = value
        elif key == "decoder_graphs":
            previous[key] = getattr(engine.decoder, "use_graphs", False)
            engine.decoder.use_graphs = value
        elif key == "decoder_graph_max_batch":
            graphs = engine.decoder._graphs
            previous[key] = graphs.max_batch if graphs is not None else None
            if graphs is not None and value is not None:
                graphs.max_batch = value
        elif key == "tf32":
            import torch
            previous[key] = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = value
            torch.backends.cudnn.allow_tf32 = value
        elif key == "prompt_stream":
            prompts = engine.prompts
            previous[key] = prompts.stream is not None
            if not value:
                prompts._own_stream, prompts.stream = prompts.stream, None
            elif prompts.stream is None:
                prompts.stream = getattr(prompts, "_own_stream", None)
        elif key == "prompt_cache":       # every cache of the prompt builder
            previous[key] = engine.prompts.cache_constants
            engine.prompts.cache_constants = engine.prompts.cache_prefills = value
        elif key == "prompt_host_pieces":
            previous[key] = engine.prompts.cache_prefills
            engine.prompts.cache_prefills = value
        elif key == "prompt_wait_for_prefill":
            previous[key] = engine.prompts.wait_for_prefill
            engine.prompts.wait_for_prefill = value
        elif key == "concurrent_prompt_builds":
            previous[key] = engine.concurrent_prompt_builds
            engine.concurrent_prompt_builds = value
        elif key == "submit_threads":
            previous[key] = engine.submit_threads
            engine.submit_threads = value
        elif key == "batch_submits":
            previous[key] = engine.batch_submits
            engine.batch_submits = value
        elif key == "stage0_drain_commands":
            previous[key] = engine.talker.drain_commands
            engine.talker.drain_commands = value
        elif key == "switch_interval_ms":     # the whole process's (sys.setswitchinterval)
            previous[key] = sys.getswitchinterval() * 1e3
            sys.setswitchinterval(value / 1e3)
        elif key == "gc_frozen":
            previous[key] = gc.get_freeze_count() > 0
            if value:
                gc.collect()
                gc.freeze()
            else:
                gc.unfreeze()
        elif key == "decoder_batch_frames":
            # streams x new frames per Stage 1 call; the captured graphs (powers of two) cover smaller batches.
            # The pipeline's limit is a DecoderStageConfig's bound `batch_limit`: swap in one with this value.
            limits = engine.pipeline.batch_limit.__self__
            previous[key] = limits.max_batch_frames
            engine.pipeline.batch_limit = dataclasses.replace(limits, max_batch_frames=value).batch_limit
        elif key == "stage1_order":
            previous[key] = engine.pipeline.order
            engine.pipeline.order = value
        elif key == "stage1_drain_pending":
            previous[key] = engine.pipeline.drain_pending
            engine.pipeline.drain_pending = value
        elif key == "stage1_lazy_open":     # no table (a decode mode without one): nothing to switch
            table = engine.pipeline.table
            previous[key] = table.lazy_open if table is not None else value
            if table is not None:
                table.lazy_open = value
        elif key == "stage1_state_table":   # read when a stream opens: switched between levels, it holds for the next
            previous[key] = engine.pipeline.use_state_table
            engine.pipeline.use_state_table = value
        elif key == "first_chunk_priority":
            previous[key] = engine.pipeline.first_chunk_stream is not None
            engine.pipeline.first_chunk_priority(value)
        elif key in _SCHEDULE_FIELDS:
            schedule = engine.connector.schedule
            name = _SCHEDULE_FIELDS[key]
            previous[key] = getattr(schedule, name)
            engine.connector.schedule = dataclasses.replace(schedule, **{name: value})
        else:
            raise ValueError(f"unknown variant setting {key!r}")
    if settings and "gc_frozen" not in settings and gc.get_freeze_count():
        # A switch that builds (a recompile, recaptured graphs) leaves what it built in the collector's view, where
        # start-up's freeze had left nothing: a full collection in the next level then walked it all (267-426 ms
        # pauses, BENCHMARKS.md seventeenth pass). Freeze it as start-up does, so levels compare.
        gc.collect()
        gc.freeze()
    return previous


def _host_syncs(talker, on: bool) -> None:
    """Re-create the blocking uploads the step hooks once did (5 before the decode hook: hidden states and
    four sampling tensors; 2 before the logits hook), by wrapping the hooks of this TalkerStage
    instance; off restores the class's own hooks. Keeps the debug switch out of the engine's hot path."""
    import torch

    for name, syncs in (("decode_embeddings", 5), ("process_logits", 2)):
        vars(talker).pop(name, None)
        if not on or talker.device.type != "cuda":
            continue
        hook = getattr(type(talker), name).__get__(talker)

        def synced(*args, _hook=hook, _syncs=syncs):
            for _ in range(_syncs):
                torch.cuda.synchronize(talker.device)
            return _hook(*args)
        setattr(talker, name, synced)


def component_timings(engine, max_batch: int) -> list[dict]:
    """Where a frame's time goes (GPU, engine idle): the code predictor per batch and the decoder per
    (streams x frames), each timed alone with a device sync (median of 20)."""
    import torch

    from tts_engine.models.qwen3_tts.sampling import BatchSampling, RowSampling

    def timed(fn) -> float:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(20):
            t = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t) * 1000)
        return round(statistics.median(times), 3)

    rows = []
    predictor = engine.talker_engine.model.code_predictor
    h = engine.config.talker.shape.hidden_size
    dtype = next(predictor.parameters()).dtype
    with torch.inference_mode():
        for b in (1, 4, 16, 64):
            if b > max_batch:
                continue
            hidden = torch.randn(b, h, device=engine.device, dtype=dtype)
            c0 = torch.randn(b, h, device=engine.device, dtype=dtype)
            params = BatchSampling.stack([RowSampling(True, 0.9, 50, 1.0) for _ in range(b)], engine.device)
            for label, use in (("code predictor, graph", True), ("code predictor, eager", False)):
                predictor.use_graphs = use
                rows.append({"component": label, "batch": b, "frames": 1,
                             "ms": timed(lambda: predictor.predict(hidden, c0, params))})
            predictor.use_graphs = True
        decoder = engine.decoder
        for b, n in ((1, 1), (1, 25), (16, 1), (16, 25), (64, 25)):
            if b > max_batch:
                continue
            states = [decoder.new_stream_state(1) for _ in range(b)]
            codes = torch.randint(0, 2048, (b, n, 16), device=engine.decoder_device)
            rows.append({"component": "decoder step" + (", graph" if b == 1 else ""), "batch": b, "frames": n,
                         "ms": timed(lambda: decoder.decode_step(states, codes))})
    return rows


def environment(device: str) -> dict:
    import torch
    env = {"python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform(),
           "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
           "torch_threads": torch.get_num_threads()}
    with contextlib.suppress(Exception):
        import vllm
        env["vllm"] = vllm.__version__
    if device.startswith("cuda") and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
    with contextlib.suppress(Exception):
        env["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                       text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout.strip()
        env["dirty"] = bool(dirty)
    with contextlib.suppress(Exception):
        env["tree"] = worktree_id(REPO)
    return env


def worktree_id(repo: Path) -> str:
    """The git tree id of the files as they are (tracked ones, and untracked ones git does not ignore). A copy
    of the tree on another machine (the GPU's gets the files with a stale history, so its `commit` names the
    wrong one) gives the same id, and `git log --format='%h %T' | grep ID` here finds the commit that ran, as
    long as the copy holds the same files with the same modes and no others that git would not ignore. Hashing
    leaves the files' blobs in `.git` (loose objects, collected by `git gc`); the index is a temporary one."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "GIT_INDEX_FILE": os.path.join(tmp, "index")}
        subprocess.run(["git", "add", "-A"], cwd=repo, env=env, capture_output=True, check=True)
        return subprocess.run(["git", "write-tree"], cwd=repo, env=env, capture_output=True, text=True,
                              check=True).stdout.strip()


def resolve_checkpoint(args) -> Path:
    if args.model:
        from tts_engine.hub import resolve_model
        return Path(resolve_model(args.model))
    from tts_engine.tools.demo_checkpoint import build_demo_checkpoint
    root = Path(args.demo_dir or tempfile.gettempdir()) / f"tts_bench_{args.demo}_{args.demo_type}"
    if (root / "config.json").exists() and not args.rebuild:
        return root
    return build_demo_checkpoint(root, args.demo_type, "0b6", seed=0, shape=args.demo)


def default_stage_config(args, on_gpu: bool) -> Path:
    if args.stage_config:
        return Path(args.stage_config)
    if on_gpu:
        return REPO / "configs" / "qwen3_tts.yaml"
    return REPO / "configs" / ("qwen3_tts_tiny_cpu.yaml" if args.demo == "tiny" else "qwen3_tts_cpu.yaml")


def burst_pairs(args) -> list[tuple[int, int]]:
    """`--burst-profile 48x16,0x64` as (running, burst) pairs."""
    pairs = []
    for pair in filter(None, (args.burst_profile or "").split(",")):
        running, burst = pair.split("x")
        pairs.append((int(running), int(burst)))
    return pairs


async def bench_engine(args, folder: Path, report: Callable[[dict], None]) -> list[dict]:
    import torch

    from tts_engine import TTSEngine
    GC_PAUSES.install()
    on_gpu = (args.device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    levels = [int(x) for x in args.concurrency.split(",")]
    closed = levels if args.arrival == "closed" else [64]        # Poisson: concurrency follows the arrivals
    closed = closed + [int(x) for x in (args.closed_levels or "").split(",") if x]
    closed = closed + [running + burst for running, burst in burst_pairs(args)]   # a burst joins, it never queues
    overrides: dict[str, Any] = {"max_num_seqs": args.max_num_seqs or max(max(closed), 1),
                                 "max_model_len": args.max_model_len}
    if args.device:
        overrides["device"] = args.device
    if on_gpu:
        overrides["gpu_memory_utilization"] = args.gpu_memory_utilization
    else:
        overrides["kv_cache_gib"] = args.kv_cache_gib
    overrides.update(ENGINE_VARIANTS.get(args.engine_variant, {}))
    base = f"ours/{args.engine_variant}" if args.engine_variant else "ours"
    t = time.perf_counter()
    engine = TTSEngine.from_pretrained(folder, stage_config=default_stage_config(args, on_gpu), dtype=args.dtype,
                                       **overrides)
    startup_s = time.perf_counter() - t
    log.info("engine started in %.1f s", startup_s)
    STEPS.log = engine.talker.step_log
    COUNTERS.read = lambda: engine_counters(engine)
    graphs = engine.talker_engine.model.code_predictor.graphs
    info = {"engine_startup_s": round(startup_s, 1), "predictor_graphs": graphs is not None,
            "predictor_compiled": bool(graphs is not None and graphs.compiled),
            "decoder_graphs": engine.decoder._graphs is not None,
            "async_scheduling": engine.talker_engine.async_scheduling,
            "cudagraph_mode": engine.talker_engine.cudagraph_mode,
            "cudagraph_max_tokens": engine.talker_engine.cudagraph_max_tokens,
            "max_batched_tokens": engine.talker_engine.max_batched_tokens}
    if args.engine_variant:
        info["engine_variant"] = args.engine_variant
    voice = None
    if engine.config.model_type == "base" and args.voice_vector_seed is not None:
        import torch

        from tts_engine import VoicePrompt
        hidden = engine.config.talker.shape.hidden_size
        vector = torch.randn(hidden, generator=torch.Generator().manual_seed(args.voice_vector_seed))
        voice = VoicePrompt(speaker_vector=vector, x_vector_only=True)
    elif engine.config.model_type == "base":
        clip = Path(args.ref_audio) if args.ref_audio else REPO / "assets" / "reference_en.wav"
        voice = engine.create_voice_prompt(str(clip), x_vector_only=True)
    if engine.config.model_type == "custom_voice" and not args.speaker:
        args.speaker = engine.config.supported_speakers[0]
    if engine.config.model_type == "voice_design" and not args.instruct:
        args.instruct = "A calm, clear voice."
    rows = []
    try:
        if args.startup_warmup != "none":       # what app.py does before it reports ready
            t = time.perf_counter()
            engine.warmup(batch_sizes=[1] if args.startup_warmup == "single" else None)
            info["startup_warmup"] = args.startup_warmup
            info["startup_warmup_s"] = round(time.perf_counter() - t, 1)
            log.info("start-up warm-up (%s) took %.1f s", args.startup_warmup, info["startup_warmup_s"])
        if args.cold:                           # the first level users meet after start-up
            results, wall = await run_level(engine, args, levels[0], voice, 50_000)
            row = summarize(f"{base}/cold", levels[0], args.arrival, results, wall, args.frames, {**info, "variant": "cold"})
            _keep_details(args, row, results)
            rows.append(row)
            report(row)
        if args.warmup:
            warm = argparse.Namespace(**{**vars(args), "frames": min(args.frames, 40)})
            log.info("warm-up: %d requests at concurrency %d, then 1", args.warmup, max(levels))
            await run_level(engine, warm, max(levels), voice, 10_000, requests=max(args.warmup, max(levels)))
            await run_level(engine, warm, 1, voice, 20_000, requests=min(args.warmup, 2))
        index = 0
        for variant in args.variants.split(","):
            settings = VARIANTS[variant]
            variant_levels, run_args = levels, args
            if variant != "default":
                if args.variant_levels:
                    variant_levels = [int(x) for x in args.variant_levels.split(",")]
                if args.variant_frames:
                    run_args = argparse.Namespace(**{**vars(args), "frames": args.variant_frames})
            # the closed-loop levels (a second load shape on the same engine) run for every variant too
            shapes = [(run_args, variant_levels)]
            if args.closed_levels:
                closed_args = argparse.Namespace(**{**vars(run_args), "arrival": "closed", "requests": None})
                shapes.append((closed_args, [int(x) for x in args.closed_levels.split(",")]))
            previous = apply_variant(engine, settings)
            try:
                for shape_args, shape_levels in shapes:
                    for level in shape_levels:
                        results, wall = await run_level(engine, shape_args, level, voice, index)
                        index += len(results)
                        row = summarize(f"{base}/{variant}" if variant != "default" else base, level,
                                        shape_args.arrival, results, wall, shape_args.frames,
                                        {**info, "variant": variant})
                        _keep_details(args, row, results)
                        rows.append(row)
                        report(row)
            finally:
                apply_variant(engine, previous)
        if args.breakdown and engine.device.type == "cuda":
            for row in component_timings(engine, max(levels)):
                report({"name": "component", "level": row["batch"], **row})
        if args.kernel_profile and engine.device.type == "cuda":
            from tts_engine.tools import kernel_profile
            summary = kernel_profile.profile_requests(
                engine, [make_request(args, 90_000 + i, voice) for i in range(args.kernel_profile)])
            report({"name": "kernel profile", "level": 1, **summary})
        for running, burst in burst_pairs(args):
            from tts_engine.tools import burst_profile
            summary = burst_profile.profile_burst(
                engine, lambda i, frames: make_request(argparse.Namespace(**{**vars(args), "frames": frames}), i, voice),
                running, burst, burst_frames=args.frames, running_frames=8 * args.frames)
            report({"name": "burst profile", "level": burst, **summary})
    finally:
        STEPS.log = None
        COUNTERS.read = None
        engine.close()
    return rows


# ---- the official implementation (side by side) ------------------------------------------------
def _peer_device_dtype(args) -> tuple[str, Any]:
    """Where a peer runs: the GPU in bfloat16 when there is one (as released), else the CPU in float32;
    `--device` / `--dtype` override."""
    import torch
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = args.dtype or ("bfloat16" if device.startswith("cuda") else "float32")
    return device, getattr(torch, dtype)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch
        torch.cuda.synchronize()


def bench_reference(args, folder: Path, report: Callable[[dict], None]) -> list[dict]:
    """The official `qwen_tts` on the same checkpoint, texts and frame counts, one request at a time
    (it has no streaming and no concurrent use): first audio = the whole request. On a GPU it runs in
    bfloat16 with `device_map` on that GPU (codec too, as the official loader does) after one untimed
    warm-up request; on the CPU in float32 with no warm-up."""
    from qwen_tts import Qwen3TTSModel

    device, dtype = _peer_device_dtype(args)
    on_gpu = device.startswith("cuda")
    t = time.perf_counter()
    model = Qwen3TTSModel.from_pretrained(str(folder), dtype=dtype, **({"device_map": device} if on_gpu else {}))
    startup_s = time.perf_counter() - t
    talker = model.model.talker
    original = talker.generate
    timing: dict[str, float] = {}

    def fixed_length_generate(*a, **kw):
        kw["min_new_tokens"] = kw.get("max_new_tokens", args.frames + 1)   # no early EOS: fixed frame counts
        start = time.perf_counter()
        out = original(*a, **kw)
        _sync(device)
        timing["generate_s"] = time.perf_counter() - start
        return out

    talker.generate = fixed_length_generate
    kind = model.model.tts_model_type if hasattr(model.model, "tts_model_type") else None
    kind = kind or json.loads((folder / "config.json").read_text())["tts_model_type"]
    speaker = args.speaker or (model.get_supported_speakers() or [None])[0]

    def synthesize(text: str, frames: int):
        gen = dict(max_new_tokens=frames + 1)
        if kind == "custom_voice":
            return model.generate_custom_voice(text=text, speaker=speaker, language="English", **gen)
        if kind == "voice_design":
            return model.generate_voice_design(text=text, instruct=args.instruct or "A calm voice.",
                                               language="English", **gen)
        clip = str(Path(args.ref_audio) if args.ref_audio else REPO / "assets" / "reference_en.wav")
        return model.generate_voice_clone(text=text, language="English", ref_audio=clip,
                                          x_vector_only_mode=True, **gen)

    info = {"engine_startup_s": round(startup_s, 1), "variant": "reference", "device": device,
            "dtype": str(dtype).removeprefix("torch.")}
    rows = []
    try:
        if on_gpu:                  # CUDA context, cuBLAS handles, the allocator: not the request's cost
            t = time.perf_counter()
            synthesize(TEXTS[-1], min(args.frames, 8))
            info["warmup_s"] = round(time.perf_counter() - t, 1)
            log.info("official qwen-tts: loaded in %.1f s, warm-up request %.1f s", startup_s, info["warmup_s"])
        for level in sorted({1} | {int(x) for x in args.concurrency.split(",")}):
            if level != 1:
                continue   # the reference is not safe to call concurrently (its own issue #350)
            results = []
            t_level = time.perf_counter()
            for i in range(args.requests or 4):
                start = time.perf_counter()
                wavs, sr = synthesize(TEXTS[i % len(TEXTS)], args.frames)
                total = time.perf_counter() - start
                audio = np.asarray(wavs[0], dtype=np.float32)
                r = RequestResult(request_id=f"ref-{i}", submitted_s=start - t_level, frames=audio.size // 1920,
                                  audio_s=audio.size / sr, first_chunk_s=total, finished_s=total)
                idx = first_audible_sample(audio)
                r.first_audible_s = total if idx is not None else None
                gen_s = timing.get("generate_s", total)
                r.frame_intervals_s = [gen_s / max(r.frames, 1)] * max(r.frames, 1)
                r.chunks = [(total, audio.size)]
                results.append(r)
            row = summarize("official qwen-tts", 1, "sequential", results, time.perf_counter() - t_level,
                            args.frames, info)
            rows.append(row)
            report(row)
    finally:
        talker.generate = original
    return rows


# ---- faster-qwen3-tts (the strongest pip-installable single-stream peer) ---------------------------
def _faster_rope_shim() -> str | None:
    """Bench-only fix for loading ANY Qwen3-TTS checkpoint with faster-qwen3-tts 0.5.4 under
    transformers >= 5.17 (found on our random checkpoints; the released speech_tokenizer/config.json
    has the same `encoder_config.rope_theta`).

    faster-qwen3-tts loads through `qwen-tts-hf` 0.1.1.post1 (the `qwen_tts` port to transformers 5),
    whose import registers `ROPE_INIT_FUNCTIONS["default"]` with a function that reads
    `config.rope_theta`. transformers 5.x configs such as `MimiConfig` (the codec encoder) keep it in
    `config.rope_parameters["rope_theta"]` only, and from 5.17.0 `PreTrainedModel._init_weights`
    prefers `ROPE_INIT_FUNCTIONS["default"]` over the module's own `compute_default_rope_parameters`
    (5.15.1 and 5.16.1 call the module's own): `AttributeError: 'MimiConfig' object has no attribute
    'rope_theta'`. The shim keeps their function for configs that have `rope_theta` (qwen-tts's own)
    and computes the plain RoPE frequencies from `rope_parameters` for the others. Returns what it did."""
    import qwen_tts  # noqa: F401  (registers their "default" initializer)
    import torch
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    theirs = ROPE_INIT_FUNCTIONS.get("default")
    if theirs is None or getattr(theirs, "bench_shim", False):
        return None

    def default_rope(config, *args, **kwargs):
        if hasattr(config, "rope_theta"):
            return theirs(config, *args, **kwargs)
        device = args[0] if args else kwargs.get("device")
        params = config.rope_parameters
        dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        dim = int(dim * params.get("partial_rotary_factor", 1.0))
        inv_freq = 1.0 / (params["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        return inv_freq.to(device), 1.0

    default_rope.bench_shim = True
    ROPE_INIT_FUNCTIONS["default"] = default_rope
    return "ROPE_INIT_FUNCTIONS['default'] falls back to config.rope_parameters['rope_theta'] (MimiConfig)"


def _faster_without_cuda(folder: Path, dtype):
    """CPU dry run of the faster-qwen3-tts path (tests this bench where there is no GPU): their loader,
    wrapper, prompt building, streaming loop, sampling and codec decode, with the two graph classes'
    capture/replay swapped for the eager calls they capture. Not a measurement."""
    import torch
    from faster_qwen3_tts import FasterQwen3TTS
    from faster_qwen3_tts.predictor_graph import PredictorGraph
    from faster_qwen3_tts.talker_graph import TalkerGraph
    from qwen_tts import Qwen3TTSModel

    torch.cuda.synchronize = lambda *a, **k: None          # this process has no GPU
    torch.cuda.current_device = lambda: 0

    def capture_predictor(self, num_warmup=3):
        self._init_cache_layers()
        self._build_attention_masks()
        self.captured = True

    def run_predictor(self, pred_input):
        self.input_buf.copy_(pred_input)
        self.static_cache.reset()
        return self._full_loop().clone()

    def capture_talker(self, prefill_len=100, num_warmup=3):
        self._init_cache_layers()
        self._build_attention_masks()
        self.captured = True

    def run_talker(self, input_embeds, position):
        self.input_buf.copy_(input_embeds)
        self.cache_position[0] = position
        self._set_attention_mask(position)
        delta = self.rope_deltas + self.cache_position[0].to(self.rope_deltas.dtype)
        self.position_ids.copy_(delta.unsqueeze(0).expand(3, -1, -1))
        self._decode_step()
        return self.output_buf

    PredictorGraph.capture, PredictorGraph.run = capture_predictor, run_predictor
    TalkerGraph.capture, TalkerGraph.run = capture_talker, run_talker
    base = Qwen3TTSModel.from_pretrained(str(folder), device_map="cpu", torch_dtype=dtype, attn_implementation="sdpa")
    talker = base.model.talker
    config = base.model.config.talker_config
    predictor = PredictorGraph(talker.code_predictor, talker.code_predictor.model.config, config.hidden_size,
                               device="cpu", dtype=dtype, do_sample=True, top_k=50, temperature=0.9)
    graph = TalkerGraph(talker.model, config, device="cpu", dtype=dtype, max_seq_len=2048)
    return FasterQwen3TTS(base, predictor, graph, device="cpu", dtype=dtype, max_seq_len=2048)


def bench_faster(args, folder: Path, report: Callable[[dict], None]) -> list[dict]:
    """faster-qwen3-tts (CUDA graphs for the talker step and the 15-step predictor loop, one stream)
    on the same checkpoint, texts, speaker and frame counts, one request at a time through its
    streaming API (`generate_custom_voice_streaming`, one row per `--faster-chunks` size). First chunk:
    the first audio it yields; frame: the gap between yields spread over the frames of the chunk
    (its codec decode runs in between, serially); `gen_ms_per_frame`: its own talker + predictor time
    per frame (the `decode_ms` it reports, codec excluded). Needs transformers >= 5.15 (its own package
    folder); runs on the CPU only as an eager dry run of the same code (`_faster_without_cuda`)."""
    import faster_qwen3_tts

    shim = _faster_rope_shim()
    device, dtype = _peer_device_dtype(args)
    on_gpu = device.startswith("cuda")
    kind = json.loads((folder / "config.json").read_text())["tts_model_type"]
    if kind != "custom_voice":
        raise SystemExit("--faster: the comparison uses a CustomVoice checkpoint (--demo-type custom_voice)")
    t = time.perf_counter()
    if on_gpu:
        from faster_qwen3_tts import FasterQwen3TTS
        model = FasterQwen3TTS.from_pretrained(str(folder), device=device, dtype=dtype)
    else:
        model = _faster_without_cuda(folder, dtype)
    startup_s = time.perf_counter() - t
    import transformers
    info: dict[str, Any] = {"engine_startup_s": round(startup_s, 1), "variant": "faster-qwen3-tts",
                            "device": device, "dtype": str(dtype).removeprefix("torch."),
                            "faster_qwen3_tts": faster_qwen3_tts.__version__,
                            "transformers": transformers.__version__, "rope_shim": shim,
                            "graphs": on_gpu}

    def stream(text: str, frames: int, chunk: int):
        return model.generate_custom_voice_streaming(
            text=text, speaker=args.speaker, language="English", max_new_tokens=frames, min_new_tokens=frames,
            chunk_size=chunk)      # its loop makes one frame per new token: exactly `frames` frames

    chunks = [int(x) for x in args.faster_chunks.split(",")]
    t = time.perf_counter()        # the first request captures both graphs (their warmup())
    for _ in stream(TEXTS[-1], min(args.frames, 8), chunks[0]):
        pass
    info["warmup_s"] = round(time.perf_counter() - t, 1)
    log.info("faster-qwen3-tts: loaded in %.1f s, warm-up (graph capture) %.1f s", startup_s, info["warmup_s"])
    rows = []
    for chunk in chunks:
        results, gen_ms = [], []
        t_level = time.perf_counter()
        for i in range(args.requests or 4):
            r = RequestResult(request_id=f"faster-{chunk}-{i}", submitted_s=time.perf_counter() - t_level)
            pieces, steps, decode_ms = [], 0, 0.0
            t0 = last = time.perf_counter()
            try:
                for audio, _sr, timing in stream(TEXTS[i % len(TEXTS)], args.frames, chunk):
                    now = time.perf_counter()
                    n = int(timing["chunk_steps"])
                    steps += n
                    decode_ms += float(timing["decode_ms"])
                    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
                    if audio.size:
                        if r.first_chunk_s is None:
                            r.first_chunk_s = now - t0
                        else:
                            r.frame_intervals_s += [(now - last) / max(n, 1)] * n
                        pieces.append(audio)
                        r.chunks.append((now - t0, int(audio.size)))
                    last = now
                r.finished_s = time.perf_counter() - t0
                r.frames = steps
                gen_ms.append(decode_ms / max(steps, 1))
            except Exception as exc:  # a failed request is counted, not fatal
                r.error = f"{type(exc).__name__}: {exc}"
                results.append(r)
                continue
            results.append(_listened(r, pieces, args.prebuffer_ms / 1000))
        extra = {**info, "chunk_size": chunk,
                 "gen_ms_per_frame_p50": _round(_pct(gen_ms, 50), 2)}
        name = f"faster-qwen3-tts chunk {chunk}" + ("" if on_gpu else " (CPU dry run, no graphs)")
        row = summarize(name, 1, "sequential", results, time.perf_counter() - t_level, args.frames, extra)
        _keep_details(args, row, results)
        rows.append(row)
        report(row)
    return rows


def ratio_rows(ours: list[dict], ref: list[dict]) -> list[dict]:
    """ours vs the reference at concurrency 1: how many times faster (reference / ours)."""
    out = []
    base = next((r for r in ref if r["level"] == 1), None)
    mine = next((r for r in ours if r["level"] == 1 and r.get("variant") == "default"), None)
    if base and mine:
        def ratio(key):
            a, b = base.get(key), mine.get(key)
            return round(a / b, 2) if a and b else None
        out.append({"metric": "speed-up at concurrency 1 (reference / ours)",
                    "first_chunk": ratio("first_chunk_ms_p50"), "first_audible": ratio("first_audible_ms_p50"),
                    "per_frame": ratio("frame_ms_p50"), "rtf": ratio("rtf_p50"),
                    "audio_s_per_s": round(mine["audio_s_per_s"] / base["audio_s_per_s"], 2)
                    if mine.get("audio_s_per_s") and base.get("audio_s_per_s") else None})
    return out


PEER_COLUMNS = [("name", "run"), ("device", "device"), ("dtype", "dtype"), ("requests", "req"),
                ("frames_per_request", "frames"), ("first_chunk_ms_p50", "1st chunk p50 ms"),
                ("first_chunk_ms_p95", "1st chunk p95 ms"), ("first_audible_ms_p50", "1st audible p50 ms"),
                ("frame_ms_p50", "frame p50 ms"), ("frame_ms_p95", "frame p95 ms"),
                ("gen_ms_per_frame_p50", "gen ms/frame p50"), ("rtf_p50", "RTF p50"),
                ("streams_with_underruns", "streams w/ underrun"), ("engine_startup_s", "load s"),
                ("errors", "err")]
PEER_RATIO_COLUMNS = [("peer", "peer"), ("first_chunk", "1st chunk p50"), ("first_chunk_p95", "1st chunk p95"),
                      ("first_audible", "1st audible p50"), ("per_frame", "frame p50"), ("rtf", "RTF p50")]


def peer_comparison(docs: list[dict]) -> dict:
    """One stream, ours against each peer (rows from several `--json` files of the same checkpoint and
    workload): every level-1 row, and per peer how many times ours is faster (peer / ours, > 1 = ours
    is faster) on first chunk, first audible, per-frame time and RTF."""
    rows = []
    for d in docs:
        where = "cuda" if (d.get("environment") or {}).get("gpu") else "cpu"
        rows += [{"device": where, **r} for r in d.get("results", [])
                 if r.get("name") not in AUX_ROWS and r.get("level") == 1]
    ours = next((r for r in rows if r.get("name") == "ours" and r.get("variant", "default") == "default"), None)
    ratios = []
    for peer in rows:
        if peer is ours or peer.get("name", "").startswith("ours"):
            continue

        def ratio(key, peer=peer):
            a, b = peer.get(key), (ours or {}).get(key)
            return round(a / b, 2) if a and b else None
        ratios.append({"peer": peer["name"], "first_chunk": ratio("first_chunk_ms_p50"),
                       "first_chunk_p95": ratio("first_chunk_ms_p95"), "first_audible": ratio("first_audible_ms_p50"),
                       "per_frame": ratio("frame_ms_p50"), "rtf": ratio("rtf_p50")})
    ordered = ([ours] if ours else []) + [r for r in rows if r is not ours]
    table = markdown_table(ordered, PEER_COLUMNS)
    if ratios:
        table += "\n\nHow many times faster ours is (peer / ours):\n\n" + markdown_table(ratios, PEER_RATIO_COLUMNS)
    return {"rows": ordered, "ratios": ratios, "ours_found": ours is not None, "markdown": table,
            "environments": [d.get("environment") for d in docs], "checkpoints": [d.get("checkpoint") for d in docs]}


# ---- WebRTC client (against a running app) -------------------------------------------------------
async def bench_webrtc(args, report: Callable[[dict], None]) -> list[dict]:
    """Client-side time to first audio over WebRTC: an aiortc peer opens a session with fastrtc's POST
    /webrtc/offer, then POST /v1/realtime/say; from just before the say request, first chunk = the first RTP
    packet of audio to arrive, first audible = the first received 20 ms frame whose RMS >= -45 dBFS (aiortc
    releases it once its jitter buffer holds 4 packets: ~80 ms after the first)."""
    import httpx

    from tts_engine.tools.webrtc_client import AgentSession

    threshold = 32768 * 10 ** (AUDIBLE_DBFS / 20)        # int16 RMS
    rows = []

    async def session(client, i: int, t_level: float) -> RequestResult:
        webrtc_id = f"bench{i}-{random.getrandbits(32):08x}"
        agent = AgentSession(args.webrtc, webrtc_id)
        result = RequestResult(request_id=webrtc_id, submitted_s=time.perf_counter() - t_level)
        try:
            await agent.open(client)
            await asyncio.sleep(0.5)                  # let the idle stream settle
            idle_packets = await agent.packets_received()
            t0 = time.perf_counter()
            r = await client.post(args.webrtc + "/v1/realtime/say", headers=agent.headers, json={
                "webrtc_id": webrtc_id, "text": TEXTS[i % len(TEXTS)], "voice": args.voice, "language": "english",
                "final": True})
            r.raise_for_status()
            # first chunk = the first RTP packet of the utterance here; first audible = the first decoded frame
            # above the threshold (after aiortc's 80 ms receive prefetch)
            result.first_chunk_s = await agent.first_packet(t0, idle_packets, args.webrtc_timeout)
            first = await agent.first_audible(t0, threshold, args.webrtc_timeout)
            if first is not None:
                result.first_audible_s = first
            # keep listening until the speech ends (1 s of silence) or `--frames` worth of it has played, then
            # interrupt as an agent would (random weights rarely stop by themselves; a say has no length limit)
            want_s = args.frames * 0.08 if args.frames else None
            while first is not None and time.perf_counter() < t0 + args.webrtc_timeout:
                audible = agent.audible_since(t0, threshold)
                if want_s is not None and sum(n for _, _, n in audible) / SAMPLE_RATE >= want_s:
                    with contextlib.suppress(httpx.HTTPError):    # the measurement is taken; stopping is courtesy
                        await client.post(args.webrtc + "/v1/realtime/interrupt", headers=agent.headers,
                                          json={"webrtc_id": webrtc_id})
                    break
                if time.perf_counter() - audible[-1][0] > 1.0:      # the speech ended by itself
                    break
                await asyncio.sleep(0.05)
            loud = [t for t, _, _ in agent.audible_since(t0, threshold)]
            last = loud[-1] if loud else t0
            result.chunks = [(t - t0, n) for t, _, n in agent.frames if t >= t0]
            result.audio_s = sum(n for t, _, n in agent.frames if t0 <= t <= last) / SAMPLE_RATE
            result.finished_s = last - t0
            if result.first_audible_s is None:     # say where it stopped: the engine, or the track
                stats = await client.get(f"{args.webrtc}/v1/realtime/stats/{webrtc_id}", headers=agent.headers)
                heard = [rms for t, rms, _ in agent.frames if t >= t0]
                result.error = (f"no audible audio arrived: {len(heard)} frames received since say "
                                f"(loudest RMS {max(heard, default=0):.0f}, {len(agent.frames)} in all), "
                                f"connection {agent.pc.connectionState}; server's clauses: "
                                f"{stats.text[:300] if stats.status_code == 200 else stats.status_code}")
        except Exception as exc:
            result.error = f"{type(exc).__name__}: {exc}"
        finally:
            await agent.close()
        return result

    async with httpx.AsyncClient(timeout=60) as client:
        for level in [int(x) for x in args.concurrency.split(",")]:
            t_level = time.perf_counter()
            n = args.requests or max(2 * level, 4)
            results = []
            for start in range(0, n, level):
                results += await asyncio.gather(*(session(client, i, t_level) for i in range(start, min(n, start + level))))
            row = summarize("webrtc client", level, "closed", results, time.perf_counter() - t_level, 0,
                            {"variant": "webrtc"})
            rows.append(row)
            report(row)
    return rows


# ---- a running server over HTTP (client side) -------------------------------------------------------
async def _url_request(client, args, url: str, i: int, t_level: float) -> Heard:
    """One streaming `POST /v1/audio/speech` (raw PCM), timed where the bytes arrive."""
    result = RequestResult(request_id="", submitted_s=time.perf_counter() - t_level)
    body: dict[str, Any] = {"input": TEXTS[i % len(TEXTS)], "language": "english", "response_format": "pcm",
                            "stream": True, "max_new_tokens": args.frames + 1,
                            "trim_leading_silence": not args.no_trim}
    if args.voice:
        body["voice"] = args.voice
    if args.instruct:
        body["instructions"] = args.instruct
    pieces, carry = [], b""
    t0 = time.perf_counter()
    try:
        async with client.stream("POST", url + "/v1/audio/speech", json=body) as r:
            if r.status_code != 200:
                result.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return result, pieces
            result.request_id = r.headers.get("x-request-id", "")
            result.replica = r.headers.get("x-tts-replica")
            async for part in r.aiter_raw():
                now = time.perf_counter() - t0
                data = carry + part
                usable = len(data) - len(data) % 2
                carry = data[usable:]
                if not usable:
                    continue
                pcm = np.frombuffer(data[:usable], "<i2").astype(np.float32) / 32768
                if result.first_chunk_s is None:
                    result.first_chunk_s = now
                pieces.append(pcm)
                result.chunks.append((now, int(pcm.size)))
        result.finished_s = time.perf_counter() - t0
        result.frames = int(sum(p.size for p in pieces) / 1920)
    except Exception as exc:  # a failed request is counted, not fatal
        result.error = f"{type(exc).__name__}: {exc}"
    return result, pieces


async def _url_level(args, url: str, level: int, requests: int, index0: int = 0, stream: int = 0
                     ) -> tuple[list[RequestResult], float, float]:
    """`level` clients of this process making `requests` requests: (results, wall s, CPU s of this process)."""
    import httpx

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=args.webrtc_timeout * 4, limits=limits) as client:
        cpu0 = time.process_time()
        results, wall = await run_arrivals(args, level, lambda i, t: _url_request(client, args, url, index0 + i, t),
                                           requests, stream)
        return results, wall, time.process_time() - cpu0


def _url_level_in_process(args, url: str, level: int, requests: int, index0: int, stream: int, start):
    """Client process `stream`'s share of a level (run by ProcessPoolExecutor); `start` (a shared barrier)
    lets the processes, started one by one, begin together."""
    start.wait(timeout=120)
    return asyncio.run(_url_level(args, url, level, requests, index0, stream))


def split_evenly(total: int, parts: int) -> list[int]:
    """`total` as `parts` integers differing by at most one (largest first)."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


async def bench_url(args, report: Callable[[dict], None]) -> list[dict]:
    """Many concurrent clients of `POST /v1/audio/speech` (raw PCM streaming) against a running app or
    Ray Serve deployment: the same metrics as in process, measured where the bytes arrive. With
    `--client-processes N` each level is shared by N client processes (one interpreter parsing every
    stream can become the bound before two replicas do); `client_cpu_share` near 1 says a client was."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    url = args.url.rstrip("/")
    rows = []
    for level in [int(x) for x in args.concurrency.split(",")]:
        n = args.requests or max(2 * level, 4)
        processes = max(1, min(args.client_processes, level, n))
        if processes == 1:
            results, wall, cpu = await _url_level(args, url, level, n)
            client_cpu_share = cpu / wall if wall > 0 else None
        else:
            shares, counts = split_evenly(level, processes), split_evenly(n, processes)
            offsets = [sum(counts[:i]) for i in range(processes)]
            loop = asyncio.get_running_loop()
            context = multiprocessing.get_context("spawn")
            with context.Manager() as manager, ProcessPoolExecutor(processes, mp_context=context) as pool:
                start = manager.Barrier(processes)
                parts = await asyncio.gather(*(
                    loop.run_in_executor(pool, _url_level_in_process, args, url, share, count, offset, stream, start)
                    for stream, (share, count, offset) in enumerate(zip(shares, counts, offsets))))
            results = [r for part_results, _, _ in parts for r in part_results]
            wall = max(part_wall for _, part_wall, _ in parts)
            client_cpu_share = max(cpu / part_wall for _, part_wall, cpu in parts if part_wall > 0)
        served_by = collections.Counter(r.replica for r in results if r.replica)
        row = summarize("http client", level, args.arrival, results, wall, args.frames,
                        {"variant": "url", "url": url, "replicas": sorted(served_by),
                         "requests_per_replica": dict(sorted(served_by.items())),
                         "client_processes": processes,
                         # the busiest client process's CPU time over the level: near 1.0 the client was the bound
                         "client_cpu_share": _round(client_cpu_share, 3)})
        _keep_details(args, row, results)
        rows.append(row)
        report(row)
    return rows


# ---- command line ---------------------------------------------------------------------------------
def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m tts_engine.tools.bench", description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    src = ap.add_argument_group("model")
    src.add_argument("--model", help="checkpoint folder or Hub id")
    src.add_argument("--demo", choices=("tiny", "0.6b", "1.7b"), help="build a random checkpoint of this shape")
    src.add_argument("--demo-type", default="custom_voice", choices=("base", "custom_voice", "voice_design"))
    src.add_argument("--demo-dir", help="where demo checkpoints are built/reused (default: the temp dir)")
    src.add_argument("--rebuild", action="store_true", help="rebuild the demo checkpoint even if present")
    eng = ap.add_argument_group("engine")
    eng.add_argument("--stage-config", help="stage config YAML (default by device and model size)")
    eng.add_argument("--device")
    eng.add_argument("--dtype", help="bfloat16 / float32 (default: bf16 on GPU, fp32 on CPU)")
    eng.add_argument("--max-model-len", type=int, default=2048,
                     help="the talker's full CUDA graphs reach this many tokens at most (2,048 is vLLM's step budget)")
    eng.add_argument("--max-num-seqs", type=int, help="default: the largest closed-loop level (64 for Poisson)")
    eng.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    eng.add_argument("--kv-cache-gib", type=float, default=1.0, help="CPU KV cache")
    load = ap.add_argument_group("load")
    load.add_argument("--concurrency", default="1,4,16,64",
                      help="levels: streams (closed loop) or requests/s (--arrival poisson)")
    load.add_argument("--arrival", choices=("closed", "poisson"), default="closed")
    load.add_argument("--closed-levels", help="then also these closed-loop levels on the same engine, for every "
                      "variant (after a --arrival poisson run, say)")
    load.add_argument("--requests", type=int, help="requests per level (default: max(2 x level, 4))")
    load.add_argument("--frames", type=int, default=100, help="codec frames per request (80 ms each)")
    load.add_argument("--warmup", type=int, default=2, help="the bench's own warm-up requests (0: none)")
    load.add_argument("--startup-warmup", choices=("full", "single", "none"), default="full",
                      help="engine.warmup() after start-up as app.py does: every batch size (full), one request, none")
    load.add_argument("--cold", action="store_true",
                      help="run the first level right after start-up, before the bench's warm-up (row 'ours/cold')")
    load.add_argument("--variants", default="default", help=f"comma list of {sorted(VARIANTS)}")
    load.add_argument("--engine-variant", choices=sorted(ENGINE_VARIANTS),
                      help="start the engine with this optimization off (rows named ours/NAME/...)")
    load.add_argument("--variant-levels", help="levels for non-default variants (default: --concurrency)")
    load.add_argument("--variant-frames", type=int, help="frames per request for non-default variants")
    load.add_argument("--speaker")
    load.add_argument("--instruct")
    load.add_argument("--ref-audio", help="Base models: reference clip (default assets/reference_en.wav)")
    load.add_argument("--voice-vector-seed", type=int,
                      help="Base models: a random speaker vector of this seed as the voice instead of cloning the clip "
                           "(what serving sees of a clone; for machines without the cloner's librosa)")
    load.add_argument("--seed", type=int, default=None)
    load.add_argument("--prebuffer-ms", type=float, default=0.0, help="player pre-buffer before playback starts")
    load.add_argument("--no-trim", action="store_true",
                      help="keep leading silence (the app and APIs trim up to 200 ms below -60 dBFS by default)")
    ref = ap.add_argument_group("comparison")
    ref.add_argument("--reference", action="store_true", help="also run the official qwen_tts (CPU, sequential)")
    ref.add_argument("--reference-only", action="store_true")
    ref.add_argument("--faster", action="store_true", help="also run faster-qwen3-tts (its own transformers >= 5.15 "
                     "must be importable: it runs best from its own package folder, see scripts/gpu_peers_bench.sh)")
    ref.add_argument("--faster-only", action="store_true")
    ref.add_argument("--faster-chunks", default="1,8", help="faster-qwen3-tts streaming chunk sizes, one row each")
    ref.add_argument("--combine", nargs="+", metavar="JSON", help="no run: one table of ours and the peers at one "
                     "stream from these --json files, with ratios (--json/--markdown write it)")
    ref.add_argument("--webrtc", metavar="URL", help="measure client-side over WebRTC against a running app")
    ref.add_argument("--url", metavar="URL", help="measure client-side over HTTP streaming against a running "
                     "app or Ray Serve deployment (many concurrent /v1/audio/speech clients)")
    ref.add_argument("--voice", default="sample", help="voice for --webrtc and --url (CustomVoice: a speaker)")
    ref.add_argument("--client-processes", type=int, default=1,
                     help="--url: share each level among this many client processes")
    ref.add_argument("--webrtc-timeout", type=float, default=60.0)
    out = ap.add_argument_group("output")
    out.add_argument("--json", help="write all results here")
    out.add_argument("--markdown", help="write the table here")
    out.add_argument("--keep-requests", action="store_true", help="per-request details in the JSON")
    out.add_argument("--breakdown", action="store_true", help="GPU: also time the predictor and decoder alone")
    out.add_argument("--kernel-profile", type=int, default=0, metavar="N",
                     help="GPU: then run N requests one at a time under torch.profiler: GPU busy share and the "
                          "kernels per frame (tools/kernel_profile.py)")
    out.add_argument("--burst-profile", metavar="RUNNINGxBURST,...",
                     help="then, per pair, submit BURST requests at once beside RUNNING streams under torch.profiler: "
                          "each Stage 0 step of the burst, its GPU and host time (tools/burst_profile.py)")
    out.add_argument("--label", default="", help="free text stored with the results")
    args = ap.parse_args(argv)
    if not (args.webrtc or args.url or args.model or args.demo or args.combine):
        ap.error("give --model, --demo, --webrtc, --url or --combine")
    return args


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parse_args(argv)
    rows: list[dict] = []
    doc: dict[str, Any] = {"label": args.label, "argv": sys.argv[1:] if argv is None else list(argv),
                           "results": rows}

    def report(row: dict) -> None:      # every finished level is printed and saved at once
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "requests_detail"}), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(doc, indent=1))

    if args.combine:
        comparison = peer_comparison([json.loads(Path(f).read_text()) for f in args.combine])
        print(comparison["markdown"], flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps({**doc, "results": comparison["rows"], **comparison}, indent=1))
        if args.markdown:
            Path(args.markdown).write_text(comparison["markdown"] + "\n")
        return 0
    if args.url:
        doc["environment"] = environment("cpu")
        asyncio.run(bench_url(args, report))
    elif args.webrtc:
        doc["environment"] = environment("cpu")
        asyncio.run(bench_webrtc(args, report))
    else:
        folder = resolve_checkpoint(args)
        doc["checkpoint"] = {"path": str(folder), "demo": args.demo, "type": args.demo_type}
        speakers = json.loads((folder / "config.json").read_text())["talker_config"].get("spk_id") or {}
        if speakers and not args.speaker:
            args.speaker = sorted(speakers)[0]          # the same voice for ours and the reference
        import torch
        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        doc["environment"] = environment(device)
        ref_rows: list[dict] = []
        if args.reference or args.reference_only:
            ref_rows = bench_reference(args, folder, report)
        if args.faster or args.faster_only:
            bench_faster(args, folder, report)
        if not (args.reference_only or args.faster_only):
            ours = asyncio.run(bench_engine(args, folder, report))
            if ref_rows:
                doc["ratio"] = ratio_rows(ours, ref_rows)
    main_rows = [r for r in rows if r.get("name") not in AUX_ROWS]
    table = markdown_table(main_rows)
    parts = [r for r in rows if r.get("name") == "component"]
    if parts:
        table += "\n\n" + markdown_table(parts, [("component", "component"), ("batch", "batch"),
                                                  ("frames", "frames"), ("ms", "ms")])
    for row in rows:
        if row.get("name") == "kernel profile":
            from tts_engine.tools.kernel_profile import markdown as kernel_markdown
            table += "\n\n" + kernel_markdown(row)
        if row.get("name") == "burst profile":
            from tts_engine.tools.burst_profile import markdown as burst_markdown
            table += "\n\n" + burst_markdown(row)
    if doc.get("ratio"):
        table += "\n\n" + markdown_table(doc["ratio"], [("metric", "metric"), ("first_chunk", "1st chunk"),
                                                       ("first_audible", "1st audible"), ("per_frame", "per frame"),
                                                       ("rtf", "RTF"), ("audio_s_per_s", "audio-s/s")])
    print(table, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
