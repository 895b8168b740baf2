"""Public types in and out of the engine, and its typed errors. Field names mirror the official
`qwen_tts` API.

Errors: `RequestError` (the request cannot be served as given: a 4xx for a server) and its
`PromptTooLong`; `StreamFailed` (a stage failed while serving it: a 5xx) and its `RequestAborted`
and `ConsumerTooSlow`;
`EngineClosed` (the engine no longer takes requests: a 503). Callers tell them apart by type.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

AudioInput = str | Path | tuple[np.ndarray, int]


class RequestError(ValueError):
    """The request cannot be served as given; the message names the field and the problem."""

    param: str | None = None


class PromptTooLong(RequestError):
    """The prompt (text, reference) leaves no room for audio under the engine's max_model_len."""

    param = "text"


class EngineClosed(RuntimeError):
    """The engine is closed (or closing) and takes no new requests."""


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
    # Drop audio below -60 dBFS from the start of the stream (at most 200 ms; the released checkpoints
    # open with ~80 ms of digital silence). Off here, so the engine reproduces the official output; the
    # app and its APIs turn it on by default.
    trim_leading_silence: bool = False


@dataclass
class SynthesisResult:
    audio: np.ndarray       # float32 mono
    sample_rate: int
    codes: np.ndarray       # int64 [frames, 16]


@dataclass
class RequestMetrics:
    """Timings of one request, seconds since submission."""

    request_id: str
    submitted_at: float                     # time.perf_counter() at submission (the prompt already built)
    prompt_s: float | None = None           # building the prompt, before submission
    admitted_s: float | None = None         # Stage 0 handed the request to vLLM
    first_frame_s: float | None = None
    first_decode_s: float | None = None     # Stage 1 began the call that decodes the first chunk
    first_chunk_s: float | None = None      # first delta PCM ready (server side)
    finished_s: float | None = None
    frame_times_s: list[float] = field(default_factory=list)
    # each chunk, by index: handed to Stage 1 (its last frame made), Stage 1 began the call that decodes it, its
    # audio ready. Where a chunk that came late to a player spent its time: Stage 1's queue, or the call.
    chunk_put_s: list[float] = field(default_factory=list)
    chunk_call_s: list[float] = field(default_factory=list)
    chunk_done_s: list[float] = field(default_factory=list)
    frames: int = 0
    audio_samples: int = 0
    sample_rate: int = 24000
    trimmed_samples: int = 0                # leading silence dropped (SpeechRequest.trim_leading_silence)

    @property
    def audio_seconds(self) -> float:
        return self.audio_samples / self.sample_rate

    @property
    def real_time_factor(self) -> float | None:
        """Wall time per second of audio (< 1 is faster than real time)."""
        if self.finished_s is None or self.audio_samples == 0:
            return None
        return self.finished_s / self.audio_seconds

    def first_audio_legs(self) -> dict[str, float]:
        """The engine's time to first audio by leg, in seconds: `prompt` (building it, before submission),
        `admit` (until Stage 0 gave the request to vLLM), `first_frame` (prefill and steps), `decode` (Stage 1,
        until the first chunk), and `decode` in two: `decode_wait` (until Stage 1 began the first chunk's call:
        the chunk's remaining frames, then Stage 1's calls before it) and `decode_call` (that call: its wait for
        the GPU work that made the frames, the decode, the read-back). A leg whose ends were not both recorded
        (a request that failed early, one with no audio) is left out."""
        ends = {"prompt": (0.0, self.prompt_s), "admit": (0.0, self.admitted_s),
                "first_frame": (self.admitted_s, self.first_frame_s), "decode": (self.first_frame_s, self.first_chunk_s),
                "decode_wait": (self.first_frame_s, self.first_decode_s),
                "decode_call": (self.first_decode_s, self.first_chunk_s)}
        return {leg: end - start for leg, (start, end) in ends.items()
                if start is not None and end is not None and end >= start}

    @property
    def per_frame_s(self) -> list[float]:
        """Time between consecutive frames (the first entry is time to the first frame)."""
        times = self.frame_times_s
        return [t - (times[i - 1] if i else 0.0) for i, t in enumerate(times)]


@dataclass
class StreamingChunkOutput:
    """One delta of a request's audio: only the samples produced since the previous chunk."""

    request_id: str
    chunk_idx: int
    is_finished: bool
    total_generated: int                    # samples delivered so far, this chunk included
    audio: np.ndarray                       # float32 mono delta
    sample_rate: int = 24000
    codec_codes: np.ndarray | None = None   # int64 [frames, 16] of this chunk
    metrics: RequestMetrics | None = None   # set on the final chunk


class StreamFailed(RuntimeError):
    """A request failed inside a stage (the message says where)."""


class ConsumerTooSlow(StreamFailed):
    """The consumer fell too far behind the stream (see `TTSEngine.generate(max_buffered_s=...)`)."""


class RequestAborted(StreamFailed):
    """The request was aborted (by the caller, or because its consumer went away)."""


# OpenAI / ISO-639-1 codes accepted everywhere as aliases of the checkpoint's language names.
LANGUAGE_ALIASES = {"en": "english", "zh": "chinese", "ja": "japanese", "ko": "korean", "de": "german",
                    "fr": "french", "ru": "russian", "pt": "portuguese", "es": "spanish", "it": "italian"}


class UnsupportedLanguage(RequestError):
    param = "language"


def resolve_language(language: str | None, supported: list[str]) -> str:
    """The one language resolver of every route: None/blank -> "auto", ISO codes -> names, case-blind."""
    raw = (language or "auto").strip().lower() or "auto"
    resolved = LANGUAGE_ALIASES.get(raw, raw)
    if resolved not in supported:
        raise UnsupportedLanguage(f"unsupported language {language!r}; supported: {', '.join(supported)} "
                                  f"(or the codes {', '.join(sorted(LANGUAGE_ALIASES))})")
    return resolved
