"""Streaming output types and the per-request job that wires Stage 0 -> processor -> Stage 1.

A `_Job` lives from submission until its last chunk is delivered (or it is aborted). Its callbacks
run on the stage threads: Stage 0 calls `on_frames`/`on_finish` (the connector is only touched there),
Stage 1 calls `on_output`. Consumers receive `StreamingChunkOutput`s (or an exception) through
`deliver`, which the engine binds to a thread queue (synthesize) or an asyncio queue (generate).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch


@dataclass
class RequestMetrics:
    """Timings of one request, seconds since submission."""

    request_id: str
    submitted_at: float                     # time.perf_counter() at submission
    first_frame_s: float | None = None
    first_chunk_s: float | None = None      # first delta PCM ready (server side)
    finished_s: float | None = None
    frame_times_s: list[float] = field(default_factory=list)
    frames: int = 0
    audio_samples: int = 0
    sample_rate: int = 24000

    @property
    def audio_seconds(self) -> float:
        return self.audio_samples / self.sample_rate

    @property
    def real_time_factor(self) -> float | None:
        """Wall time per second of audio (< 1 is faster than real time)."""
        if self.finished_s is None or self.audio_samples == 0:
            return None
        return self.finished_s / self.audio_seconds

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


class RequestAborted(StreamFailed):
    """The request was aborted (by the caller, or because its consumer went away)."""


class _StageRequest:
    """What the stage input processor sees of a request."""

    def __init__(self, request_id: str):
        self.request_id = request_id
        self.finished = False

    def is_finished(self) -> bool:
        return self.finished


class Job:
    def __init__(self, request_id: str, processor, connector, pipeline, deliver: Callable,
                 on_done: Callable[[str], None], stage1_device: torch.device):
        self.request_id = request_id
        self.stage_request = _StageRequest(request_id)
        self.processor = processor
        self.connector = connector
        self.pipeline = pipeline
        self.deliver = deliver
        self.on_done = on_done
        self.stage1_device = stage1_device
        self.metrics = RequestMetrics(request_id, time.perf_counter())
        self.chunk_codes: dict[int, torch.Tensor] = {}
        self.samples = 0
        self.closed = False

    def _elapsed(self) -> float:
        return time.perf_counter() - self.metrics.submitted_at

    def _forward(self, chunk: dict | None) -> None:
        if chunk is None:
            return
        new = chunk["codes"][chunk["left_context_size"]:]
        self.chunk_codes[chunk["chunk_idx"]] = new
        chunk["codes"] = chunk["codes"].to(self.stage1_device, non_blocking=True)
        self.pipeline.put(chunk)

    # Stage 0 thread ------------------------------------------------------------------------------
    def on_frames(self, frames: torch.Tensor) -> None:
        now = self._elapsed()
        for frame in frames:
            self.metrics.frame_times_s.append(now)
            self.metrics.frames += 1
            self._forward(self.processor(self.connector, {"codes": frame[None]}, self.stage_request))
        if self.metrics.first_frame_s is None:
            self.metrics.first_frame_s = now

    def on_finish(self, error: str | None) -> None:
        if error is not None:
            self.connector.free(self.request_id)
            self.pipeline.abort(self.request_id)
            self._fail(StreamFailed(error))
            return
        self.stage_request.finished = True
        chunk = self.processor(self.connector, None, self.stage_request)
        self.connector.free(self.request_id)
        self._forward(chunk)

    # Stage 1 thread ------------------------------------------------------------------------------
    def on_output(self, request_id: str, chunk_idx: int, audio: np.ndarray, finished: bool,
                  error: str | None) -> None:
        if self.closed:
            return
        if error is not None:
            self._fail(StreamFailed(error))
            return
        now = self._elapsed()
        if self.metrics.first_chunk_s is None:
            self.metrics.first_chunk_s = now
        self.samples += audio.shape[0]
        codes = self.chunk_codes.pop(chunk_idx, None)
        output = StreamingChunkOutput(
            request_id=request_id, chunk_idx=chunk_idx, is_finished=finished, total_generated=self.samples,
            audio=audio.astype(np.float32, copy=False),
            codec_codes=None if codes is None else codes.cpu().numpy().astype(np.int64))
        if finished:
            self.metrics.finished_s = now
            self.metrics.audio_samples = self.samples
            output.metrics = self.metrics
            self.closed = True
            self.on_done(self.request_id)
        self.deliver(output)

    def cancel(self) -> None:
        """Called by `TTSEngine.abort`: wake a consumer still waiting, then ignore all later output."""
        self._fail(RequestAborted(f"request {self.request_id} was aborted"))

    def _fail(self, exc: Exception) -> None:
        if self.closed:
            return
        self.closed = True
        self.on_done(self.request_id)
        self.deliver(exc)
