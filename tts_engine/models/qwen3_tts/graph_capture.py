"""Capture one CUDA graph on the GPU its tensors live on: shared by the code predictor and the decoder.

`torch.cuda.graph` without a `stream=` captures on a stream it creates once per process, on whatever
device was current the first time any graph was captured. With both stages on one GPU that is harmless;
with Stage 1 on another GPU (configs/qwen3_tts_split_gpus.yaml) the first capture (the decoder's, on
GPU 1) fixed that stream on GPU 1, and the code predictor's capture on GPU 0 then recorded onto a GPU 1
stream while allocating on GPU 0: "operation not permitted when stream is capturing" (and the broken
capture left the pool recording, so the eager fallback failed too). Each capture here names a stream of
its own device: one per device for the process, because the caching allocator hands a freed block only
to the stream that freed it, so graphs captured on fresh streams cannot share their pool's blocks (one
stream per capture took 87 GiB of graph pools on an H200 and ran it out of memory).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")
WARMUP_RUNS = 2     # before capture, on the side stream: lazy inits and autotuning never land in a graph
_CAPTURE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def capture_stream(device: torch.device) -> torch.cuda.Stream:
    """The one capture stream of `device` (made on first use)."""
    device = torch.device(device)
    if device not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[device] = torch.cuda.Stream(device)
    return _CAPTURE_STREAMS[device]


def capture_on_device(run: Callable[[], T], device: torch.device,
                      pool) -> tuple[torch.cuda.CUDAGraph, T]:
    """Warm `run` up and capture it on a fresh stream of `device`, allocating from `pool`.

    thread_local: the other stage may use its GPU from its own thread while this thread captures."""
    with torch.cuda.device(device):
        side = capture_stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                run()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, stream=side, capture_error_mode="thread_local"):
            out = run()
        torch.cuda.current_stream(device).wait_stream(side)
    return graph, out
