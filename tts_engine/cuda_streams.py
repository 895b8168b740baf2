"""CUDA streams that run ahead of the decoder's calls: one place says what "high priority" is.

A GPU offers streams of two priorities here: 0, the default every stream made without one gets (Stage 1's,
vLLM's, the graph captures'), and -1, whose pending kernels the GPU schedules first. Stage 0's steps, the early
hand-over of frames, the prompt builder and (a bench candidate) Stage 1's first-chunk calls run at -1, so the
talker's step and a new request's first work do not queue behind Stage 1's long decoder calls (BENCHMARKS.md,
eighth and ninth passes).
"""

from __future__ import annotations

import torch

HIGH_PRIORITY = -1


def high_priority_stream(device: torch.device | str) -> torch.cuda.Stream | None:
    """A stream of the higher priority on `device`; None off CUDA (callers then use the current stream).
    PyTorch hands these out from a pool of 32 per device and priority, in turn: make each once and keep it,
    or a later one may be one already in use (safe, but their work would then queue on one stream)."""
    device = torch.device(device)
    return torch.cuda.Stream(device, priority=HIGH_PRIORITY) if device.type == "cuda" else None
