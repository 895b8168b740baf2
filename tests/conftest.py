"""Shared fixtures: tiny official-format checkpoints and a real speech clip."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.checkpoints.tiny_qwen3_tts import write_tiny_checkpoint

# Small KV cache and context: tiny models, 2 cores. Engines are started once per test module.
ENGINE_OPTIONS = dict(max_num_seqs=8, max_model_len=512, kv_cache_gib=0.25)


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """Base 0.6B-like; CustomVoice and VoiceDesign 1.7B-like (code predictor behind a projection)."""
    root = tmp_path_factory.mktemp("checkpoints")
    return {
        "base": write_tiny_checkpoint(root / "base", "base", "0b6", seed=1),
        "custom_voice": write_tiny_checkpoint(root / "custom_voice", "custom_voice", "1b7", seed=2),
        "voice_design": write_tiny_checkpoint(root / "voice_design", "voice_design", "1b7", seed=3),
    }


@pytest.fixture(scope="session")
def reference_clip(tmp_path_factory) -> Path:
    """A real English utterance (espeak-ng, 22.05 kHz): the voice-cloning reference."""
    if shutil.which("espeak-ng") is None:
        pytest.fail("espeak-ng is required (apt-get install espeak-ng); .ci/run installs it")
    path = tmp_path_factory.mktemp("clips") / "reference.wav"
    subprocess.run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", str(path),
                    "The quick brown fox jumps over the lazy dog."], check=True)
    return path


REFERENCE_TEXT = "The quick brown fox jumps over the lazy dog."
