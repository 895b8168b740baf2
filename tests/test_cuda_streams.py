"""High-priority streams: callers fall back to the current stream off CUDA, where none is made."""

from __future__ import annotations

import torch

from tts_engine.cuda_streams import HIGH_PRIORITY, high_priority_stream


def test_no_stream_off_cuda():
    assert high_priority_stream("cpu") is None
    assert high_priority_stream(torch.device("cpu")) is None


def test_the_priority_is_above_the_default():
    # CUDA: a lower number is a higher priority; 0 is what every stream made without one gets
    assert HIGH_PRIORITY < 0
