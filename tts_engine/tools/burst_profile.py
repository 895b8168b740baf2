"""What a step that a burst of new requests joins spends its time on, on the GPU and on the host.

At 64 closed-loop streams a request's first frame waits 8-12 Stage 0 steps, and the steps that new requests
join have a p95 of 115-142 ms against ~15 ms for the others (BENCHMARKS.md, sixth pass), while the GPU
arithmetic of a few hundred prompt tokens is a few ms. The step log says how long such a step takes, not
why. This runs `running` long streams, waits until each is streaming, then submits `burst` requests at once
under torch.profiler (host ops of every thread, CUDA kernels) until every one of them has its first chunk,
and reports each Stage 0 step of that window: wall time, tokens vLLM launched in it, GPU busy time, kernel
time per CUDA stream, and the host calls that took longest inside it (a `cudaStreamSynchronize` or a copy
there is the host waiting for the GPU). Stage 1's decode rounds are marked too, and on the GPU the source lines
of the engine that made the host wait (`torch.cuda.set_sync_debug_mode`) are counted:

    python -m tts_engine.tools.bench --demo 1.7b --concurrency 1 --burst-profile 48x16,0x64
"""

from __future__ import annotations

import bisect
import os
import threading
import time
import warnings
from collections import Counter, defaultdict
from typing import Callable

from tts_engine.tools.kernel_profile import Kernel, busy_us, is_copy, kernels_of

STEP, ROUND = "tts::stage0_step", "tts::stage1_round"


def is_sync(kernel: Kernel) -> bool:
    """CUPTI's synchronisation records (`enable_cuda_sync_events`): the host waiting, not the GPU working."""
    return kernel.name.endswith(" Sync") or kernel.name == "Stream Wait Event"


def host_events(events) -> list:
    """The profile's host-side events. A `record_function` range is also reported on the GPU's timeline
    under the same name; counted as a step it would make every step appear two or three times."""
    from torch.autograd import DeviceType

    return [e for e in events if e.device_type == DeviceType.CPU]


def sync_sites(caught: list[warnings.WarningMessage], top: int = 8) -> list[tuple[str, int]]:
    """Where the host waited for the GPU, from `set_sync_debug_mode("warn")`'s warnings: "file:line" (the
    path from its package folder on, the innermost such folder: a checkout may sit in a folder of that name)
    and how often, most frequent first."""
    sites: Counter = Counter()
    for w in caught:
        if "synchroniz" in str(w.message):
            parts = os.path.normpath(w.filename).split(os.sep)
            package = max((i for i, part in enumerate(parts) if part in ("tts_engine", "vllm", "torch")),
                          default=len(parts) - 1)
            sites[f"{'/'.join(parts[package:])}:{w.lineno}"] += 1
    return sites.most_common(top)


def _clipped_us(kernels: list[Kernel], start: float, end: float) -> float:
    return busy_us([Kernel(k.name, k.stream, max(k.start_us, start), min(k.end_us, end))
                    for k in kernels if k.end_us > start and k.start_us < end])


class _Listener:
    """One stream on a thread of its own: notes its first audio and how it ended."""

    def __init__(self, engine, request, stop: threading.Event):
        self.first = threading.Event()
        self.settled = threading.Event()     # first audio, or the stream ended without it
        self.error: str | None = None
        self._thread = threading.Thread(target=self._listen, args=(engine, request, stop), daemon=True)
        self._thread.start()

    def _listen(self, engine, request, stop: threading.Event) -> None:
        try:
            stream = engine.stream(request)
            try:
                for chunk in stream:
                    if chunk.audio.size:
                        self.first.set()
                        self.settled.set()
                    if stop.is_set() or chunk.is_finished:
                        break
            finally:
                stream.close()       # aborts a request still running
        except Exception as exc:     # reported in the summary, never hidden
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.settled.set()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


def _wait_first(listeners: list[_Listener], deadline: float) -> int:
    """Wait until every listener has its first audio or ended with an error; how many have audio."""
    for listener in listeners:
        listener.settled.wait(max(0.0, deadline - time.monotonic()))
    return sum(listener.first.is_set() for listener in listeners)


def profile_burst(engine, make_request: Callable[[int, int], object], running: int, burst: int,
                  burst_frames: int = 50, running_frames: int = 400, timeout_s: float = 60.0) -> dict:
    """`make_request(index, frames)` builds one request. Returns the window's steps (see module doc). On a
    CPU engine there are no kernels, but the steps and their host calls are reported all the same."""
    import torch
    from torch._C._profiler import _ExperimentalConfig
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile

    talker, pipeline = engine.talker_engine, engine.pipeline
    if running + burst > talker.max_num_seqs:
        raise ValueError(f"a burst of {burst} beside {running} streams needs max_num_seqs >= {running + burst}, "
                         f"the engine has {talker.max_num_seqs}: the burst would queue, not join")
    step, decode_round = talker.step, pipeline._decode_round
    launched: list[int] = []

    def traced_step():
        with record_function(STEP):
            outputs = step()
        runner = talker.runner
        launched.append(int(runner.query_start_loc.np[runner.input_batch.num_reqs]))
        return outputs

    def traced_round():
        with record_function(ROUND):
            return decode_round()

    stop = threading.Event()
    listeners: list[_Listener] = []
    talker.step, pipeline._decode_round = traced_step, traced_round
    try:
        steady = [_Listener(engine, make_request(95_000 + i, running_frames), stop) for i in range(running)]
        listeners += steady
        deadline = time.monotonic() + timeout_s
        streaming = _wait_first(steady, deadline)
        on_gpu = torch.cuda.is_available() and engine.device.type == "cuda"
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
        # the stages' own threads, not only this one; CUDA synchronisation shown as events of its own
        every_thread = _ExperimentalConfig(profile_all_threads=True, enable_cuda_sync_events=on_gpu)
        # every thread's synchronising torch calls warn, with the line that made them (recorded, not shown)
        with warnings.catch_warnings(record=True) as caught, \
                profile(activities=activities, experimental_config=every_thread) as prof:
            warnings.simplefilter("always")
            if on_gpu:
                torch.cuda.set_sync_debug_mode("warn")
            try:
                launched.clear()
                t0 = time.perf_counter()
                joining = [_Listener(engine, make_request(96_000 + i, burst_frames), stop) for i in range(burst)]
                listeners += joining
                heard = _wait_first(joining, time.monotonic() + timeout_s)
                window_s = time.perf_counter() - t0
            finally:
                if on_gpu:
                    torch.cuda.set_sync_debug_mode("default")
                    torch.cuda.synchronize()
            tokens = list(launched)
    finally:
        stop.set()
        end = time.monotonic() + 60
        for listener in listeners:
            listener.join(max(0.0, end - time.monotonic()))
        talker.step, pipeline._decode_round = step, decode_round
    summary = summarize(host_events(prof.events()), kernels_of(prof), tokens, running, burst, window_s)
    errors = [listener.error for listener in listeners if listener.error]
    return {**summary, "running_streaming": streaming, "burst_first_chunks": heard, "errors": errors[:5],
            "sync_sites": sync_sites(caught)}


def summarize(events, kernels: list[Kernel], tokens: list[int], running: int, burst: int, window_s: float,
              top_host: int = 4) -> dict:
    syncs = [k for k in kernels if is_sync(k)]
    kernels = [k for k in kernels if not is_copy(k) and not is_sync(k)]
    steps = sorted((e for e in events if e.name == STEP), key=lambda e: e.time_range.start)
    rounds = [e for e in events if e.name == ROUND]
    stream_kernels: dict[int, list[Kernel]] = defaultdict(list)
    time_by_name: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for k in kernels:
        stream_kernels[k.stream].append(k)
        time_by_name[k.stream][k.name] += k.end_us - k.start_us
    named = {s: max(names, key=names.get)[:60] for s, names in time_by_name.items()}   # what tells the streams apart
    # host calls of the stepping thread, by start time, so each step finds its own with a bisection
    stepping = {e.thread for e in steps}
    host_calls = sorted(((e.time_range.start, e.time_range.end, e.name) for e in events
                         if e.thread in stepping and e.name not in (STEP, ROUND)), key=lambda c: c[0])
    starts = [c[0] for c in host_calls]
    rows = []
    for i, e in enumerate(steps):
        start, end = e.time_range.start, e.time_range.end
        host: dict[str, float] = defaultdict(float)
        for call_start, call_end, name in host_calls[bisect.bisect_left(starts, start):bisect.bisect_right(starts, end)]:
            if call_end <= end:
                host[name] += call_end - call_start
        by_stream = {str(s): round(_clipped_us(ks, start, end) / 1000, 2) for s, ks in stream_kernels.items()}
        rows.append({
            "wall_ms": round((end - start) / 1000, 2),
            "tokens": tokens[i] if i < len(tokens) else None,
            "gpu_busy_ms": round(_clipped_us(kernels, start, end) / 1000, 2),
            "host_waits_gpu_ms": round(_clipped_us(syncs, start, end) / 1000, 2),
            "kernel_ms_by_stream": {s: ms for s, ms in by_stream.items() if ms > 0},
            "stage1_rounds": sum(1 for r in rounds if r.time_range.start < end and r.time_range.end > start),
            "host_top": [(name, round(us / 1000, 2)) for name, us in sorted(host.items(), key=lambda i: -i[1])[:top_host]],
        })
    return {"running": running, "burst": burst, "window_ms": round(window_s * 1000, 1), "steps": rows,
            "streams": {str(s): {"top_kernel": named[s],
                                 "kernel_ms": round(sum(k.end_us - k.start_us for k in ks) / 1000, 1)}
                        for s, ks in stream_kernels.items()}}


def markdown(summary: dict) -> str:
    lines = [f"burst of {summary['burst']} requests beside {summary['running']} streaming "
             f"({summary.get('running_streaming')} were): {summary.get('burst_first_chunks')} first chunks in "
             f"{summary['window_ms']} ms; errors: {summary.get('errors') or 'none'}; CUDA streams: {summary['streams']}; "
             f"host syncs by source line: {summary.get('sync_sites') or 'none'}", "",
             "| step | wall ms | tokens | GPU busy ms | host waits for the GPU ms | kernel ms by stream | Stage 1 rounds "
             "| longest host calls (ms) |", "|---|---|---|---|---|---|---|---|"]
    for i, s in enumerate(summary["steps"]):
        host = ", ".join(f"{n[:40]} {ms}" for n, ms in s["host_top"])
        lines.append(f"| {i} | {s['wall_ms']} | {s['tokens']} | {s['gpu_busy_ms']} | {s['host_waits_gpu_ms']} | "
                     f"{s['kernel_ms_by_stream']} | {s['stage1_rounds']} | {host} |")
    return "\n".join(lines)
