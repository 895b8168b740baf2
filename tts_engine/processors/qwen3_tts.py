"""Stage input processors: Stage 0 (talker frames) -> Stage 1 (Code2Wav) inputs.

The contract is the RFC's: `processor(connector, pooling_output, request) -> CodecChunk | None`. The
connector buffers each request's frames (`code_prompt_token_ids[request_id]`); the processor returns
None until a chunk is ready, then the chunk's frames preceded by up to `left_context_size` frames of
context. `talker2code2wav_async_chunk` streams (chunk sizes from the connector's `ChunkSchedule`, the
remainder flushed with `finished=True`); `talker2code2wav` is the batch mode (everything at once when
Stage 0 finishes). Call it once per new frame, and once more with `pooling_output=None` when the
request finishes. Each processor declares `streams` (True / False), which the stage config checks
against `async_chunk`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch


class StageRequest(Protocol):
    request_id: str

    def is_finished(self) -> bool: ...


class Schedule(Protocol):
    def frames(self, chunk_idx: int) -> int: ...


@dataclass
class CodecChunk:
    """One Stage 1 input: `codes` = `left_context_size` frames of context, then the new frames."""

    request_id: str
    chunk_idx: int
    codes: torch.Tensor                   # int64 [context + new, 16]
    left_context_size: int
    finished: bool
    ready: Any = None                     # CUDA event recorded where the codes were made (Stage 1 waits on it)

    @property
    def new_codes(self) -> torch.Tensor:
        return self.codes[self.left_context_size:]

    @property
    def new_frames(self) -> int:
        return self.codes.shape[0] - self.left_context_size


@dataclass
class ChunkConnector:
    """Per-request buffers between the stages; `free` drops everything of a request."""

    schedule: Schedule
    left_context_size: int = 25
    code_prompt_token_ids: dict[str, list[torch.Tensor]] = field(default_factory=lambda: defaultdict(list))
    put_requests: dict[str, int] = field(default_factory=lambda: defaultdict(int))   # chunks sent
    sent_frames: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def free(self, request_id: str) -> None:
        for table in (self.code_prompt_token_ids, self.put_requests, self.sent_frames):
            table.pop(request_id, None)

    def active_request_ids(self) -> set[str]:
        return set(self.code_prompt_token_ids) | set(self.put_requests) | set(self.sent_frames)


def _buffer(connector: ChunkConnector, pooling_output: dict[str, Any] | None, request_id: str) -> list:
    frames = connector.code_prompt_token_ids[request_id]
    codes = None if pooling_output is None else pooling_output.get("codes")
    if codes is not None:
        frames.extend(codes.reshape(-1, codes.shape[-1]).unbind(0))
    return frames


def _emit(connector: ChunkConnector, request_id: str, frames: list, count: int, finished: bool,
          left_context_size: int) -> CodecChunk:
    start = connector.sent_frames[request_id]
    context = min(left_context_size, start)
    window = frames[start - context:start + count]
    chunk = CodecChunk(request_id=request_id, chunk_idx=connector.put_requests[request_id],
                       codes=torch.stack(window) if window else torch.zeros(0, 16, dtype=torch.long),
                       left_context_size=context, finished=finished)
    connector.sent_frames[request_id] = start + count
    connector.put_requests[request_id] += 1
    return chunk


def talker2code2wav_async_chunk(connector: ChunkConnector, pooling_output: dict[str, Any] | None,
                                request: StageRequest) -> CodecChunk | None:
    request_id = request.request_id
    finished = request.is_finished()
    frames = _buffer(connector, pooling_output, request_id)
    pending = len(frames) - connector.sent_frames[request_id]
    target = connector.schedule.frames(connector.put_requests[request_id])
    if finished:
        return _emit(connector, request_id, frames, pending, True, connector.left_context_size)
    if pending < target:
        return None
    return _emit(connector, request_id, frames, target, False, connector.left_context_size)


def talker2code2wav(connector: ChunkConnector, pooling_output: dict[str, Any] | None,
                    request: StageRequest) -> CodecChunk | None:
    request_id = request.request_id
    frames = _buffer(connector, pooling_output, request_id)
    if not request.is_finished():
        return None
    return _emit(connector, request_id, frames, len(frames), True, 0)


talker2code2wav_async_chunk.streams = True   # type: ignore[attr-defined]
talker2code2wav.streams = False              # type: ignore[attr-defined]
