"""Runs the official `qwen_tts` 0.1.1 implementation (the fidelity reference) and captures its codes."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

GREEDY = dict(do_sample=False, subtalker_dosample=False)


@lru_cache(maxsize=None)
def reference_model(folder: str):
    from qwen_tts import Qwen3TTSModel
    return Qwen3TTSModel.from_pretrained(folder, dtype=torch.float32)


def run_reference(folder: str, method: str, **kwargs) -> tuple[np.ndarray, np.ndarray]:
    """Call `Qwen3TTSModel.<method>(**kwargs)` greedily; return (codes [frames, 16], waveform)."""
    model = reference_model(folder)
    captured = []
    original = model.model.generate

    def capture(*args, **kw):
        out = original(*args, **kw)
        captured.append(out[0][0])
        return out

    model.model.generate = capture
    try:
        wavs, sr = getattr(model, method)(**kwargs, **GREEDY)
    finally:
        model.model.generate = original
    assert sr == 24000
    return captured[0].cpu().numpy().astype(np.int64), wavs[0]
