"""The route of one request through the engine: Stage 0 -> stage input processor -> Stage 1.

A `Route` lives from submission until its last chunk is delivered (or it is aborted). The three-thread
contract:

* the **Stage 0 thread** (`tts-stage0`) calls `on_frames` and `on_finish`; the connector and the
  processor are touched only there, so they need no lock;
* the **Stage 1 thread** (`tts-stage1`) calls `on_output` with delta PCM;
* the **caller's thread** (an asyncio loop or a plain thread) only receives: `deliver` hands it each
  `StreamingChunkOutput` or the exception that ends the stream, and `cancel` (from `TTSEngine.abort`)
  wakes it with `RequestAborted`. After the first terminal delivery (`closed`), later output is dropped.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np
import torch

from tts_engine.processors.qwen3_tts import ChunkConnector, CodecChunk
from tts_engine.request import RequestAborted, RequestMetrics, StreamFailed, StreamingChunkOutput
from tts_engine.stages.trim import LeadingSilenceTrimmer


class _StageRequest:
    """What the stage input processor sees of a request."""

    def __init__(self, request_id: str):
        self.request_id = request_id
        self.finished = False

    def is_finished(self) -> bool:
        return self.finished


class Route:
    def __init__(self, request_id: str, processor: Callable, connector: ChunkConnector, pipeline,
                 deliver: Callable, on_done: Callable[[str], None], stage1_device: torch.device,
                 trimmer: LeadingSilenceTrimmer | None = None, prompt_s: float | None = None):
        self.request_id = request_id
        self.stage_request = _StageRequest(request_id)
        self.processor = processor
        self.connector = connector
        self.pipeline = pipeline
        self.deliver = deliver
        self.on_done = on_done
        self.stage1_device = stage1_device
        self.metrics = RequestMetrics(request_id, time.perf_counter(), prompt_s=prompt_s)
        self.chunk_codes: dict[int, torch.Tensor] = {}
        self.samples = 0
        self.closed = False
        self.trimmer = trimmer

    def _elapsed(self) -> float:
        return time.perf_counter() - self.metrics.submitted_at

    def _forward(self, chunk: CodecChunk | None) -> None:
        if chunk is None:
            return
        self.chunk_codes[chunk.chunk_idx] = chunk.new_codes
        chunk.codes = chunk.codes.to(self.stage1_device, non_blocking=True)
        self.metrics.chunk_put_s.append(self._elapsed())
        self.pipeline.put(chunk)

    # Stage 0 thread ------------------------------------------------------------------------------
    def on_admitted(self) -> None:
        self.metrics.admitted_s = self._elapsed()

    def on_frames(self, frames: torch.Tensor) -> None:
        now = self._elapsed()
        for frame in frames:
            self.metrics.frame_times_s.append(now)
            self.metrics.frames += 1
            self._forward(self.processor(self.connector, {"codes": frame[None]}, self.stage_request))
        if self.metrics.first_frame_s is None:
            self.metrics.first_frame_s = now

    def on_finish(self, error: Exception | None) -> None:
        if error is not None:
            self.connector.free(self.request_id)
            self.pipeline.abort(self.request_id)
            self.fail(error)
            return
        self.stage_request.finished = True
        chunk = self.processor(self.connector, None, self.stage_request)
        self.connector.free(self.request_id)
        self._forward(chunk)

    # Stage 1 thread ------------------------------------------------------------------------------
    def on_decode_start(self, chunk_idx: int) -> None:
        """Stage 1 begins the call that decodes this request's chunk `chunk_idx` (they come in order)."""
        now = self._elapsed()
        calls = self.metrics.chunk_call_s
        if chunk_idx < len(calls):     # its batch failed and Stage 1 retries it alone: the retry's call counts
            calls[chunk_idx] = now
        else:
            calls.append(now)
        if chunk_idx == 0 and self.metrics.first_decode_s is None:
            self.metrics.first_decode_s = now

    def on_output(self, request_id: str, chunk_idx: int, audio: np.ndarray, finished: bool,
                  error: str | None) -> None:
        if self.closed:
            return
        if error is not None:
            self.fail(StreamFailed(error))
            return
        now = self._elapsed()
        self.metrics.chunk_done_s.append(now)
        if self.trimmer is not None:
            audio = self.trimmer.push(audio)
            self.metrics.trimmed_samples = self.trimmer.trimmed
        if self.metrics.first_chunk_s is None and (audio.size or finished):
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
        self.fail(RequestAborted(f"request {self.request_id} was aborted"))

    def fail(self, exc: Exception) -> None:
        """End the stream with `exc` (once; later output is dropped)."""
        if self.closed:
            return
        self.closed = True
        self.on_done(self.request_id)
        self.deliver(exc)
