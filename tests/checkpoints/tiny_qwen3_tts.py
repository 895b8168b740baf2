"""Tiny random Qwen3-TTS 12 Hz checkpoints in the official on-disk format.

Real weights cannot be downloaded in our build environment, so the loading code is exercised on
folders that look exactly like the published ones (config.json written by hand with every field,
model.safetensors with the official parameter names, a Qwen2 BPE tokenizer, speech_tokenizer/), only
small. The parameters come from the official `qwen_tts` classes, so both implementations read the
same names and shapes. Talker head_dim is 64 because vLLM's CPU attention rejects smaller heads.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from tests.checkpoints.tiny_speech_tokenizer import write_tiny_speech_tokenizer

# The configuration data (config.json, generation_config.json, text tokenizer) lives in the app's
# demo-checkpoint module, so the tests and `--demo` share ONE copy. Only the weights differ in origin:
# here the official classes, there our own modules (tests/test_demo_checkpoint.py checks them against
# the official classes).
from tts_engine.tools.demo_checkpoint import DEMO_GENERATION as OFFICIAL_GENERATION
from tts_engine.tools.demo_checkpoint import (
    DIALECTS,
    LANGUAGES,
    SPEAKERS,
    SPECIAL_TOKENS,
    TEXT_VOCAB,
    write_text_tokenizer,
)
from tts_engine.tools.demo_checkpoint import demo_config as tiny_config

__all__ = ["DIALECTS", "LANGUAGES", "OFFICIAL_GENERATION", "SPEAKERS", "SPECIAL_TOKENS", "TEXT_VOCAB", "tiny_config",
           "write_text_tokenizer", "write_tiny_checkpoint"]


def _randomize(module: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """Every parameter random (the default init leaves some at 0/1, which hides bugs)."""
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name, tensor in module.state_dict().items():
        if not tensor.is_floating_point():
            state[name] = tensor.clone()
            continue
        noise = torch.randn(tensor.shape, generator=gen)
        if name.endswith("norm.weight") or "layernorm" in name or name.endswith(".scale"):
            value = 1.0 + 0.1 * noise
        elif "running_var" in name:
            value = 1.0 + 0.1 * noise.abs()
        else:
            value = 0.05 * noise
        state[name] = value.to(torch.float32).contiguous()
    return state


def write_tiny_checkpoint(folder: str | Path, model_type: str = "base", size: str = "0b6",
                          seed: int = 0) -> Path:
    """Write a complete official-format checkpoint folder and return its path."""
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = tiny_config(model_type, size)
    (folder / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    (folder / "generation_config.json").write_text(json.dumps(OFFICIAL_GENERATION, indent=1), encoding="utf-8")
    write_text_tokenizer(folder)
    torch.manual_seed(seed)
    model = Qwen3TTSForConditionalGeneration(Qwen3TTSConfig(**json.loads(json.dumps(config))))
    save_file(_randomize(model, seed), str(folder / "model.safetensors"), metadata={"format": "pt"})
    write_tiny_speech_tokenizer(folder / "speech_tokenizer", seed=seed + 1)
    return folder
