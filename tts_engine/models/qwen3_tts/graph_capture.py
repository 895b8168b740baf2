"""Capture one CUDA graph on the GPU its tensors live on: shared by the code predictor and the decoder.

`torch.cuda.graph` without a `stream=` captures on a stream it creates once per process, on whatever
device was current the first time any graph was captured. With both stages on one GPU that is harmless;
with Stage 1 on another GPU (configs/qwen3_tts_split_gpus.yaml) the first capture (the decoder's, on
GPU 1) fixed that stream on GPU 1, and the code predictor's capture on GPU 0 then recorded onto a GPU 1
stream while allocating on GPU 0: "operation not permitted when stream is capturing" (and the broken
capture left the pool recording, so the eager fallback failed too). Each capture here names its own
stream on its own device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")
WARMUP_RUNS = 2     # before capture, on the side stream: lazy inits and autotuning never land in a graph


def capture_on_device(run: Callable[[], T], device: torch.device,
                      pool) -> tuple[torch.cuda.CUDAGraph, T]:
    """Warm `run` up and capture it on a fresh stream of `device`, allocating from `pool`.

    thread_local: the other stage may use its GPU from its own thread while this thread captures."""
    with torch.cuda.device(device):
        side = torch.cuda.Stream(device)
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
