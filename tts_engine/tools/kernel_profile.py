"""Where one stream's GPU time goes: every kernel of a request, recorded with torch.profiler (CUPTI).

The third pass of "under load" found the interpreter mostly idle and vLLM's async scheduling without
effect (BENCHMARKS.md), so a frame at one stream is GPU work: the code predictor graph, the talker's
forward and sampling, and Stage 1's decodes beside them. This says how busy the GPU is over a request and
which kernels (and CUDA streams: Stage 0 runs on the default stream, Stage 1 and the prompt builder on
their own) take the time, per frame, so the next fusion is chosen by measurement:

    python -m tts_engine.tools.bench --demo 1.7b --concurrency 1 --kernel-profile 3

Kernels inside CUDA graphs should be reported one by one (CUPTI traces graph nodes; not yet seen on the H200:
the first run will tell).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass


@dataclass(frozen=True)
class Kernel:
    name: str
    stream: int
    start_us: float
    end_us: float


def busy_us(kernels: list[Kernel]) -> float:
    """Time the GPU ran at least one kernel: the union of the kernels' intervals (streams overlap)."""
    total, end = 0.0, float("-inf")
    for k in sorted(kernels, key=lambda k: k.start_us):
        if k.start_us >= end:
            total += k.end_us - k.start_us
            end = k.end_us
        elif k.end_us > end:
            total += k.end_us - end
            end = k.end_us
    return total


# idle gaps between busy stretches, by length: a few microseconds is one kernel handing over to the next (in a
# CUDA graph or a tight launch queue); tens to hundreds is the host launching eagerly; longer is the host
# busy elsewhere (scheduling, Python between steps) or waiting
GAP_BUCKETS_US = ((0, 10, "under 10 us"), (10, 100, "10-100 us"), (100, 1000, "0.1-1 ms"), (1000, float("inf"), "over 1 ms"))


def idle_gaps_us(kernels: list[Kernel]) -> dict[str, float]:
    """Idle time between the busy stretches of `kernels` (first to last), summed per GAP_BUCKETS_US bucket."""
    out = {label: 0.0 for _, _, label in GAP_BUCKETS_US}
    end = None
    for k in sorted(kernels, key=lambda k: k.start_us):
        if end is not None and k.start_us > end:
            gap = k.start_us - end
            out[next(label for low, high, label in GAP_BUCKETS_US if low <= gap < high)] += gap
        end = k.end_us if end is None else max(end, k.end_us)
    return out


def is_copy(kernel: Kernel) -> bool:
    """CUPTI's memory activity (host/device copies, memsets) beside the kernels."""
    return kernel.name.startswith(("Memcpy", "Memset"))


def summarize(requests: list[list[Kernel]], frames: int, top: int = 15) -> dict:
    """Per frame: wall time of the requests' kernel windows (each request's own first to last kernel, so the
    host's pauses between requests do not count as idle GPU), GPU busy time, kernel count, time per CUDA
    stream, copies apart, and the `top` kernels by total time (name shortened to 120 characters)."""
    spans = [[k for k in request if not is_copy(k)] for request in requests]
    kernels = [k for ks in spans for k in ks]
    if not kernels:
        return {"frames": frames, "kernels": 0}
    frames = max(1, frames)
    window = sum(max(k.end_us for k in ks) - min(k.start_us for k in ks) for ks in spans if ks)
    busy = sum(busy_us(ks) for ks in spans)
    copies = sum(k.end_us - k.start_us for request in requests for k in request if is_copy(k))
    gaps: dict[str, float] = defaultdict(float)
    for ks in spans:
        for label, us in idle_gaps_us(ks).items():
            gaps[label] += us
    by_stream: dict[int, float] = defaultdict(float)
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for k in kernels:
        by_stream[k.stream] += k.end_us - k.start_us
        entry = by_name[k.name[:120]]
        entry[0] += k.end_us - k.start_us
        entry[1] += 1
    total = sum(by_stream.values())
    ranked = sorted(by_name.items(), key=lambda item: -item[1][0])[:top]
    return {
        "frames": frames, "kernels": len(kernels),
        "window_ms_per_frame": round(window / frames / 1000, 3),
        "gpu_busy_pct": round(100 * busy / window, 1) if window else 0.0,
        "busy_ms_per_frame": round(busy / frames / 1000, 3),
        "kernel_ms_per_frame": round(total / frames / 1000, 3),
        "kernels_per_frame": round(len(kernels) / frames, 1),
        "copy_ms_per_frame": round(copies / frames / 1000, 3),
        "streams": {str(s): round(t / frames / 1000, 3) for s, t in sorted(by_stream.items(), key=lambda i: -i[1])},
        "idle_ms_per_frame_by_gap": {label: round(gaps[label] / frames / 1000, 4) for _, _, label in GAP_BUCKETS_US},
        "top": [{"kernel": name, "ms_per_frame": round(t / frames / 1000, 4), "per_frame": round(n / frames, 2),
                 "share_pct": round(100 * t / total, 1)} for name, (t, n) in ranked],
    }


def kernels_of(profile) -> list[Kernel]:
    """The device kernels of a finished `torch.profiler.profile` (CUDA activity).

    A `record_function` range also shows on the GPU's timeline (a "gpu_user_annotation" spanning every
    kernel launched inside it): it is not a kernel, and counting it would make the range look busy."""
    from torch.autograd import DeviceType

    out = []
    for event in profile.events():
        if getattr(event, "is_user_annotation", False):
            continue
        if event.device_type == DeviceType.CUDA and event.time_range.end > event.time_range.start:
            out.append(Kernel(event.name, int(getattr(event, "device_resource_id", 0) or 0),
                              float(event.time_range.start), float(event.time_range.end)))
    return out


def profile_requests(engine, requests: list) -> dict:
    """Run `requests` one after another (one stream), each under its own profiler; returns `summarize` of
    their kernels over the frames they produced. GPU only (the CPU engine has no device kernels to trace)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    frames, traced = 0, []
    for request in requests:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            frames += engine.synthesize(request).codes.shape[0]
            torch.cuda.synchronize()
        traced.append(kernels_of(prof))
    return summarize(traced, frames)


def markdown(summary: dict) -> str:
    lines = [f"{summary['frames']} frames, {summary['kernels']} kernels ({summary.get('kernels_per_frame')} a "
             f"frame); per frame: window {summary.get('window_ms_per_frame')} ms, GPU busy "
             f"{summary.get('busy_ms_per_frame')} ms ({summary.get('gpu_busy_pct')}%), kernel time "
             f"{summary.get('kernel_ms_per_frame')} ms, copies {summary.get('copy_ms_per_frame')} ms; by CUDA "
             f"stream: {summary.get('streams')}; idle per frame by gap length (ms): "
             f"{summary.get('idle_ms_per_frame_by_gap')}", "",
             "| kernel | ms a frame | launches a frame | share of kernel time |", "|---|---|---|---|"]
    lines += [f"| `{t['kernel']}` | {t['ms_per_frame']} | {t['per_frame']} | {t['share_pct']}% |"
              for t in summary.get("top", [])]
    return "\n".join(lines)
