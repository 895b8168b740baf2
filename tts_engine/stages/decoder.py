"""Stage 1: the AsyncDecodingPipeline, a background thread turning code chunks into delta PCM.

Two modes. `exact` (default) carries each request's decoder state from chunk to chunk, so the
concatenated stream equals one decode of the whole sequence. `context` is the seed's
`chunked_decode_streaming` method: each chunk is decoded from scratch with its left-context frames
and the context's samples are trimmed (approximate: the decoder reaches further back than 25 frames).
Chunks of different requests that arrive together are decoded in one batched call when they have the
same length; each request's chunks are always decoded in order.

On CUDA the decoder runs on its own stream, so its kernels overlap the talker's instead of queueing
behind them on the default stream; a chunk's codes carry an event recorded where they were made.
Steps replay CUDA graphs (`Code2WavDecoder.enable_cuda_graphs`) for every chunk size and remainder and
batch buckets up to what a call may hold, and each round is one call, taken by the pending chunk due first:
a new request's first chunk is due when it arrives, a stream's next chunk when a player that started at its
first audio runs out of what it has. So a first chunk waits for the call in progress and the chunks that
are about to run dry, not behind every stream's 25-frame chunks, and no stream's chunk is held back behind
smaller ones while its player starves (the order before: smallest chunks first, `order = "smallest"`).

Threads: commands (`open`, `put`, `abort`, `barrier`) come from any thread through one queue; only
the `tts-stage1` thread touches `_streams` and the decoder; `on_output` callbacks run on it.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from tts_engine.cuda_streams import high_priority_stream
from tts_engine.models.qwen3_tts.codec_decoder import Code2WavDecoder, DecoderStateTable, DecoderStreamState
from tts_engine.models.qwen3_tts.sampling import to_device
from tts_engine.processors.qwen3_tts import CodecChunk
from tts_engine.stages.owner_thread import OwnerThread

log = logging.getLogger(__name__)

# on_output(request_id, chunk_idx, audio float32 [n], finished, error)
OutputCallback = Callable[[str, int, np.ndarray, bool, str | None], None]


@dataclass
class _Stream:
    on_output: OutputCallback
    on_decode_start: Callable[[int], None] | None = None  # told a chunk's index when the call decoding it begins
    state: DecoderStreamState | None = None       # exact mode: the stream's own state (`use_state_table` off)
    slot: int | None = None                       # exact mode: its row in the pipeline's state table
    history: torch.Tensor | None = None          # context mode: frames available as left context
    pending: list[CodecChunk] = field(default_factory=list)
    # the pending chunks' arrivals (oldest first): (arrival number, arrival time on the pipeline's clock)
    arrivals: list[tuple[int, float]] = field(default_factory=list)
    passed_over: int = 0     # calls that took smaller chunks ahead of this stream's oldest pending one
    first_out_s: float | None = None     # when its first audio was delivered (its player's start)
    frames_out: int = 0                  # frames delivered so far


class AsyncDecodingPipeline:
    def __init__(self, decoder: Code2WavDecoder, device: torch.device, mode: str = "exact",
                 max_batch_size: int = 16, left_context_size: int = 25,
                 graph_shapes: list[tuple[int, int]] | None = None,
                 batch_limit: Callable[[int], int] | None = None,
                 on_death: Callable[[BaseException], None] | None = None,
                 sample_rate: int = 24000, clock: Callable[[], float] = time.perf_counter):
        if mode not in ("exact", "context"):
            raise ValueError(f"decode mode must be 'exact' or 'context', got {mode!r}")
        self.decoder = decoder
        self.device = device
        self.mode = mode
        self.max_batch_size = max_batch_size
        self.left_context_size = left_context_size
        self.samples_per_frame = decoder.samples_per_frame
        self.frame_s = decoder.samples_per_frame / sample_rate      # audio one frame plays for
        self.clock = clock
        self._streams: dict[str, _Stream] = {}
        self._inbox: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        # A candidate, off unless set (bench variant `stage1-first-chunk-priority`; measured in the ninth pass, no
        # gain: the first chunk's call did not get shorter, so it is not waiting for the GPU's scheduler): a call
        # that carries a request's first chunk runs on a stream of Stage 0's priority instead of the default
        # one, so the GPU does not put it behind the talker's steps. Safe with one thread of calls because
        # each call ends with its read-back (the next call finds both streams idle) and waits for the main
        # stream first (priming decodes are queued there without a read-back).
        self.first_chunk_stream: torch.cuda.Stream | None = None
        self._priority_stream: torch.cuda.Stream | None = None
        self.batch_limit = batch_limit or (lambda frames: max_batch_size)
        # the old loop, for the bench (variant `stage1-drain-pending`)
        self.drain_pending = False
        # Which chunks a call takes (see `_decode_round`): "due" (the chunk due first, and the chunks of its size
        # due next) or "smallest" (the order before the eleventh pass; bench variant `stage1-smallest-first`).
        self.order = "due"
        # "smallest": smaller chunks go first (a new request's first chunk: time to first audio), but a chunk
        # passed over this many times goes next, every other call, so a steady supply of small chunks cannot
        # hold a stream's chunk forever and a first chunk waits for at most one such call.
        self.max_passed_over = 8
        self._last_by_pass_over = False
        self._arrivals = 0
        # "due": a stream's next chunk counts as due `lead_s` before its player runs dry, a running mean of the
        # calls' times (each new call weighs a fifth), since the call that takes it must end by then. (Calls are
        # not pre-empted, so a call in progress can still push a chunk past its due time; a lead of the mean plus
        # the longest recent call, which covers that, did worse on the H200: closed 128 had 211 vs 21-42 of 256
        # streams underrun, with more and smaller calls, and closed 64's first chunk p50 rose ~30 ms; BENCHMARKS.md,
        # eleventh pass)
        self.lead_s = 0.0
        self._timed_calls = 0
        # decode calls made; of them, how many the pass-over bound chose ("smallest") and how many began with the
        # chunk they were for already overdue ("due"); the bench reports them per level; Stage 1's thread writes them
        self.calls = 0
        self.calls_by_pass_over = 0
        self.calls_overdue = 0
        if self._stream is not None and mode == "exact" and graph_shapes:
            decoder.enable_cuda_graphs(graph_shapes)
        # Exact mode keeps the streams' decoder states as rows of one table per layer, so a batched call costs
        # two ops per layer whatever its batch (see DecoderStateTable). Off (bench variant
        # `stage1-per-stream-states`): each stream keeps a state of its own, as before; read when a stream opens.
        # (allocated on Stage 1's stream, where it is read and written and where a grown table frees the old one)
        self.table = None
        if mode == "exact":
            with contextlib.ExitStack() as on_stage1:
                if self._stream is not None:
                    on_stage1.enter_context(torch.cuda.device(device))
                    on_stage1.enter_context(torch.cuda.stream(self._stream))
                self.table = DecoderStateTable(decoder, max(8, max_batch_size))
        self.use_state_table = True
        self._thread = OwnerThread("tts-stage1", self._run, on_death)

    # ---- commands (any thread) -------------------------------------------------------------------
    def open(self, request_id: str, on_output: OutputCallback, context_codes: torch.Tensor | None = None,
             on_decode_start: Callable[[int], None] | None = None) -> None:
        """Start a stream. `context_codes` (ICL reference codes) condition the decoder, unheard;
        `on_decode_start(chunk_idx)` is told (on Stage 1's thread) when the call that decodes a chunk begins."""
        self._inbox.put(("open", request_id, (on_output, context_codes, on_decode_start)))

    def barrier(self, timeout: float = 30.0) -> None:
        """Return once every message sent before this call has been handled."""
        done = threading.Event()
        self._inbox.put(("barrier", "", done))
        if not done.wait(timeout):
            raise TimeoutError("Stage 1 did not reach the barrier")

    def put(self, chunk: CodecChunk) -> None:
        if self._stream is not None and chunk.codes.is_cuda:
            chunk.ready = torch.cuda.Event()
            chunk.ready.record()            # on the producer's (Stage 0) current stream
        self._inbox.put(("chunk", chunk.request_id, chunk))

    def abort(self, request_id: str) -> None:
        self._inbox.put(("abort", request_id, None))

    def close(self) -> None:
        self._stop.set()
        self._inbox.put(("stop", "", None))
        self._thread.join(timeout=30)

    @property
    def active_request_ids(self) -> set[str]:
        return set(self._streams)

    @property
    def alive(self) -> bool:
        return self._thread.alive

    # ---- decoder thread --------------------------------------------------------------------------
    def _run(self) -> None:
        if self._stream is None:
            self._loop()
            return
        with torch.cuda.device(self.device), torch.cuda.stream(self._stream):   # Stage 1 may have a GPU of its own
            self._loop()

    def _loop(self) -> None:
        """Take every waiting command, then run one call; block only when no chunk is pending. Reading the
        inbox between calls is what lets a first chunk that arrives while many 25-frame chunks are pending
        go next, instead of after all of them (closed 64 streams: a first chunk waited ~120 ms p95)."""
        while not self._stop.is_set():
            if not self._any_pending():
                self._take(self._inbox.get())
            while True:
                try:
                    self._take(self._inbox.get_nowait())
                except queue.Empty:
                    break
            self._decode_round()
            while self.drain_pending and self._any_pending():
                self._decode_round()

    def _any_pending(self) -> bool:
        return any(s.pending for s in self._streams.values())

    def _take(self, message) -> None:
        kind, request_id, payload = message
        if kind == "open":
            on_output, context, on_decode_start = payload
            stream = _Stream(on_output=on_output, on_decode_start=on_decode_start)
            try:
                self._prime(stream, context)
            except Exception as exc:  # a broken prompt must not kill the thread
                log.exception("decoder priming failed")
                on_output(request_id, 0, np.zeros(0, np.float32), True, f"decoder failed: {exc}")
                return
            self._forget(request_id)        # a stream of the same id (the engine refuses those) gives its row back
            self._streams[request_id] = stream
        elif kind == "chunk":
            stream = self._streams.get(request_id)
            if stream is not None:          # chunks of aborted requests are dropped
                stream.pending.append(payload)
                stream.arrivals.append((self._arrivals, self.clock()))
                self._arrivals += 1
        elif kind == "abort":
            self._forget(request_id)
        elif kind == "barrier":
            while self._any_pending():
                self._decode_round()
            payload.set()

    def _forget(self, request_id: str) -> None:
        stream = self._streams.pop(request_id, None)
        if stream is not None and stream.slot is not None:
            self.table.close(stream.slot)
            stream.slot = None

    def _prime(self, stream: _Stream, context: torch.Tensor | None) -> None:
        if self.mode == "exact" and self.use_state_table:
            stream.slot = self.table.open()
            if context is not None and context.shape[0]:
                try:
                    self.decoder.decode_rows(self.table, self._slots([stream]), context.to(self.device)[None])
                except Exception:
                    self.table.close(stream.slot)
                    raise
        elif self.mode == "exact":
            stream.state = self.decoder.new_stream_state()
            if context is not None and context.shape[0]:
                self.decoder.decode_step(stream.state, context.to(self.device))
        elif context is not None and context.shape[0]:
            stream.history = context.to(self.device)

    def _decode_round(self) -> None:
        """Decode one call's worth: the streams' oldest pending chunks of one size (one batched call), chosen by
        `order`, up to `batch_limit` of them. One call per round, so the loop takes new commands between calls
        and a chunk that arrives while many are pending is weighed against them at the next call."""
        heads = [(rid, stream) for rid, stream in self._streams.items() if stream.pending]
        if not heads:
            return
        frames, members = self._due_first(heads) if self.order == "due" else self._smallest_first(heads)
        self.calls += 1
        batch = []
        for rid, stream in members[:self.batch_limit(frames)]:
            stream.arrivals.pop(0)
            stream.passed_over = 0
            batch.append((rid, stream, stream.pending.pop(0)))
        self._decode_batch(batch, frames)

    def _due(self, stream: _Stream) -> float:
        """When the stream's oldest pending chunk is needed: a first chunk at once (it arrived: time to first
        audio), any other when a player that started at the first audio, with no pre-buffer, has played every
        frame delivered so far, less `lead_s`."""
        if stream.first_out_s is None:
            return stream.arrivals[0][1]
        return self._runs_dry(stream) - self.lead_s

    def _runs_dry(self, stream: _Stream) -> float:
        """When a player that started at the stream's first audio, with no pre-buffer, has played all it got."""
        return stream.first_out_s + stream.frames_out * self.frame_s

    def _due_first(self, heads: list[tuple[str, _Stream]]) -> tuple[int, list[tuple[str, _Stream]]]:
        """The chunk due first decides the call's size; the chunks of that size fill it, those due first
        first (same due: the older first). Chunks of other sizes wait for a later call, however small."""
        ranked = sorted(heads, key=lambda m: (self._due(m[1]), m[1].arrivals[0][0]))    # each due computed once
        first = ranked[0][1]
        if first.first_out_s is not None and self._runs_dry(first) < self.clock():
            self.calls_overdue += 1
        frames = first.pending[0].new_frames
        return frames, [m for m in ranked if m[1].pending[0].new_frames == frames]

    def _smallest_first(self, heads: list[tuple[str, _Stream]]) -> tuple[int, list[tuple[str, _Stream]]]:
        """Among the streams' oldest pending chunks, the group with the fewest new frames (a new request's first
        chunk first), the oldest chunks first. Every other call at most, a chunk passed over for smaller ones
        `max_passed_over` times takes the call for its group instead (a steady supply of small chunks must
        not hold it back forever), so a first chunk that arrives while big chunks are pending waits for the
        call in progress and at most one call that the bound chose."""
        groups: dict[int, list[tuple[str, _Stream]]] = {}
        for rid, stream in heads:
            groups.setdefault(stream.pending[0].new_frames, []).append((rid, stream))
        frames = smallest = min(groups)
        held = max((stream for _, stream in heads), key=lambda s: s.passed_over)
        if held.passed_over >= self.max_passed_over and not self._last_by_pass_over:
            frames = held.pending[0].new_frames
        self._last_by_pass_over = frames != smallest
        if self._last_by_pass_over:
            self.calls_by_pass_over += 1
        for size, group in groups.items():
            if size > frames:
                for _, stream in group:
                    stream.passed_over += 1
        return frames, sorted(groups[frames], key=lambda m: (-m[1].passed_over, m[1].arrivals[0][0]))

    def _decode_batch(self, batch: list, frames: int) -> None:
        """Decode and deliver; a failing batch is retried one stream at a time, so a bad request fails
        alone and the others go on (the streams' states are only replaced after a successful step)."""
        for _, stream, chunk in batch:
            if stream.on_decode_start is not None:
                stream.on_decode_start(chunk.chunk_idx)
        started = self.clock()
        try:
            audio = self._decode(batch, frames)
        except Exception as exc:
            if len(batch) > 1:
                log.warning("batched decode of %d streams failed (%s); decoding them one by one", len(batch), exc)
                for item in batch:
                    self._decode_batch([item], frames)
                return
            log.exception("decode failed")
            rid, stream, chunk = batch[0]
            self._forget(rid)
            stream.on_output(rid, chunk.chunk_idx, np.zeros(0, np.float32), True, f"decoder failed: {exc}")
            return
        done = self.clock()
        self.lead_s = done - started if not self._timed_calls else 0.8 * self.lead_s + 0.2 * (done - started)
        self._timed_calls += 1
        for (rid, stream, chunk), wav in zip(batch, audio):
            if stream.first_out_s is None:
                stream.first_out_s = done
            stream.frames_out += chunk.new_frames
            if chunk.finished:
                self._forget(rid)
            stream.on_output(rid, chunk.chunk_idx, wav, chunk.finished, None)

    def first_chunk_priority(self, on: bool) -> None:
        """Switch the first-chunk stream (see `first_chunk_stream`); GPU only, a no-op on the CPU."""
        if self._stream is None:
            return
        if on and self._priority_stream is None:      # made once: the high-priority pool hands out 32 in turn
            self._priority_stream = high_priority_stream(self.device)
        self.first_chunk_stream = self._priority_stream if on else None

    def _decode(self, batch: list, frames: int) -> list[np.ndarray]:
        if frames == 0:
            return [np.zeros(0, np.float32) for _ in batch]
        if self._stream is None:
            return self._decode_on(batch)
        stream = self._stream
        if self.first_chunk_stream is not None and any(chunk.chunk_idx == 0 for _, _, chunk in batch):
            stream = self.first_chunk_stream
            stream.wait_stream(self._stream)
        for _, _, chunk in batch:
            if chunk.ready is not None:
                stream.wait_event(chunk.ready)
                chunk.ready = None
            if chunk.codes.is_cuda:
                chunk.codes.record_stream(stream)
        with torch.cuda.stream(stream):     # the loop's own stream already, unless a first chunk moved it
            return self._decode_on(batch)

    def _slots(self, streams: list[_Stream]) -> torch.Tensor:
        return to_device([s.slot for s in streams], torch.long, self.device)

    def _decode_on(self, batch: list) -> list[np.ndarray]:
        """The decode itself, on the current stream; ends with the read-back of the audio."""
        if self.mode == "exact":
            codes = torch.stack([c.new_codes for _, _, c in batch]).to(self.device)
            streams = [s for _, s, _ in batch]
            if all(s.slot is not None for s in streams):
                wav = self.decoder.decode_rows(self.table, self._slots(streams), codes)
            elif all(s.state is not None for s in streams):
                wav = self.decoder.decode_step([s.state for s in streams], codes)
            else:       # streams opened on both sides of a `use_state_table` switch: one at a time (the retry)
                raise ValueError("a batch mixes streams with table rows and streams with states of their own")
            return list(wav.float().cpu().numpy())
        out = []
        for _, stream, chunk in batch:
            # The seed's method: decode (left context + chunk) from scratch and drop the context's
            # samples. The context is the stream's own history, which also covers ICL reference codes.
            new = chunk.new_codes.to(self.device)
            history = stream.history if stream.history is not None else new[:0]
            context = history[max(0, history.shape[0] - self.left_context_size):]
            wav = self.decoder.decode_full(torch.cat([context, new]))[context.shape[0] * self.samples_per_frame:]
            stream.history = torch.cat([context, new])
            out.append(wav.float().cpu().numpy())
        return out
