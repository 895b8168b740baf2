"""High-priority streams: callers fall back to the current stream off CUDA, where none is made."""

from __future__ import annotations

import torch

from tts_engine.cuda_streams import high_priority_stream


def test_no_stream_off_cuda():
    assert high_priority_stream("cpu") is None
    assert high_priority_stream(torch.device("cpu")) is None
