"""Public request/result types. Field names mirror the official `qwen_tts` API."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Union

import numpy as np
import torch

AudioInput = Union[str, Path, tuple[np.ndarray, int]]


class RequestError(ValueError):
    """The request cannot be served as given; the message names the field and the problem."""


@dataclass
class VoicePrompt:
    """A cloned voice: what a Base model needs from a reference clip (reusable across requests).

    Mirrors the official `VoiceClonePromptItem`: x-vector always, reference codes + text for ICL.
    """

    speaker_vector: torch.Tensor            # [H] x-vector (CPU, float32)
    ref_codes: torch.Tensor | None = None   # [T, 16] int64 (ICL only)
    ref_text: str | None = None
    x_vector_only: bool = False


@dataclass
class SpeechRequest:
    text: str
    language: str = "auto"
    speaker: str | None = None
    instruct: str | None = None
    ref_audio: AudioInput | None = None
    ref_text: str | None = None
    x_vector_only: bool = False
    voice: VoicePrompt | None = None        # a prepared clone (instead of ref_audio)
    non_streaming_mode: bool | None = None  # None: the official default of the mode
    do_sample: bool | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    subtalker_do_sample: bool | None = None
    subtalker_temperature: float | None = None
    subtalker_top_k: int | None = None
    subtalker_top_p: float | None = None
    max_new_tokens: int | None = None
    min_new_tokens: int | None = None       # EOS is masked before this many tokens (default 2, as official)
    seed: int | None = None


@dataclass
class SynthesisResult:
    audio: np.ndarray       # float32 mono
    sample_rate: int
    codes: np.ndarray       # int64 [frames, 16]
