"""Stage 0: the talker on vLLM, stepped by its own thread, emitting 16-code frames per request.

Per-request decode state (invariant I5) lives in `_RequestState`, keyed by vLLM's internal request id
for the in-step hooks and by our id for commands; both entries are dropped on finish and on abort.
Each step, `decode_embeddings` runs the code predictor for every request whose codebook-0 token was
just sampled, completing that frame, and returns the talker's next input embedding; `process_logits`
records the hidden state the predictor needs and applies the official logits processors (repetition
penalty over generated codebook-0 tokens, minimum of 2 tokens before EOS, suppressed special ids).

The hooks run once per engine step for the whole batch, so they avoid per-row device work and host
syncs: each request owns a row ("slot") of two device tables (the talker state that produced its
pending token, and the codebook-0 tokens it has generated), and the batch's slot indices, sampling
settings and step counters are uploaded only when the batch composition changes.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from tts_engine.cuda_streams import high_priority_stream
from tts_engine.models.qwen3_tts.config import Qwen3TTSConfig
from tts_engine.models.qwen3_tts.prompt import TalkerPrompt
from tts_engine.models.qwen3_tts.sampling import BatchSampling, RowSampling, to_device
from tts_engine.request import PromptTooLong, RequestAborted, StreamFailed
from tts_engine.stages.owner_thread import OwnerThread
from tts_engine.stages.step_log import StepLog
from tts_engine.stages.vllm_bridge import PreemptedRequest, TalkerEngine

log = logging.getLogger(__name__)
MIN_NEW_TOKENS = 2

FramesCallback = Callable[[torch.Tensor], None]       # new frames [n, 16] (device tensor)
FinishCallback = Callable[[Exception | None], None]   # None on success, else why it ended


@dataclass
class TalkerSampling:
    greedy: bool
    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float
    max_new_tokens: int
    seed: int | None
    subtalker: RowSampling
    min_new_tokens: int = MIN_NEW_TOKENS     # EOS is masked until this many tokens (fixed-length runs)


@dataclass
class _RequestState:
    request_id: str
    prompt: TalkerPrompt
    sampling: TalkerSampling
    on_frames: FramesCallback
    on_finish: FinishCallback
    on_admitted: Callable[[], None] | None = None   # told when vLLM has the request (latency breakdown)
    slot: int = -1                          # row of TalkerStage's per-request device tables
    internal_id: str = ""
    step: int = 0                           # decode steps fed so far (= frames completed)
    pending: list[torch.Tensor] = field(default_factory=list)   # frames not yet handed out
    tokens: int = 0                         # codebook-0 tokens vLLM has reported


def frames_to_hand_out(pending: int, handed_out: int, tokens: int, finished: bool) -> int:
    """How many of a request's pending frames may go on now.

    A token's frame is made by the decode hook of the step after the one that sampled it. With async
    scheduling vLLM launches that next step before it reports the token, so a frame can exist for a token
    not reported yet, or for the stop token of a request that has just finished (the stop token is not
    audio). Every reported token has its frame except the last one of a finished request (its stop token,
    or the token that reached max_tokens, which no later step embeds): the same frames either way.
    """
    allowed = tokens - 1 if finished else tokens
    return max(0, min(pending, allowed - handed_out))


class TalkerStage:
    """Owns the vLLM talker engine and its stepping thread."""

    def __init__(self, engine: TalkerEngine, config: Qwen3TTSConfig, device: torch.device,
                 on_death: Callable[[BaseException], None] | None = None, high_priority: bool = True,
                 early_handover: bool = True):
        self.engine = engine
        self.config = config
        self.device = device
        self.model = engine.model
        talker = config.talker
        self.eos = talker.codec.eos
        self.suppress = torch.zeros(talker.vocab_size, dtype=torch.bool, device=device)
        self.suppress[talker.vocab_size - 1024:] = True
        self.suppress[self.eos] = False
        # the value written into `_seen_table` each step, on the device: a Python `True` would be made a CPU
        # tensor and copied from pageable memory by index_put_, which waits for every queued kernel (a host
        # sync in each step: 5 ms a step at 48 streams on the H200, 20 ms while Stage 1 shared the GPU)
        self._seen_mark = torch.ones((), dtype=torch.bool, device=device)
        self._by_internal: dict[str, _RequestState] = {}
        self._by_id: dict[str, _RequestState] = {}
        # added, not yet given to vLLM: their prefill is still being copied to the host (`_admit_arrived`)
        self._parked: list[_RequestState] = []
        # Per-request device tables, one row per slot (grown on demand): the talker state that
        # produced each request's pending codebook-0 token, and the codebook-0 tokens it generated.
        self._free_slots: list[int] = []
        self._slot_count = 0
        self._hidden_table: torch.Tensor | None = None
        self._seen_table: torch.Tensor | None = None
        self._decode_batch: _BatchCache | None = None
        self._logits_batch: _BatchCache | None = None
        self._commands: queue.Queue = queue.Queue()
        # False (the default): between steps the thread handles the commands queued by then and steps, so a burst's
        # first prompts prefill while its later ones are still being built. True (bench variant
        # `stage0-drain-commands`, the loop before the thirteenth pass): it handles commands until the queue is
        # empty, and in a burst, whose adds came faster than this thread took them on an interpreter shared with
        # 20 builders, the first step waited for the last prompt (H200, 64 at once: first step at 98 ms, after the
        # last build at 92 ms, the first at 8 ms)
        self.drain_commands = False
        self._stop = threading.Event()
        self.step_log = StepLog()
        # The stream this thread steps on (vLLM launches on the thread's current stream), of a priority above
        # the default one every other stream has (Stage 1, the prompt builder): the GPU then schedules a step's
        # kernels ahead of those of Stage 1's decoder calls queued beside it (tens of ms at 64 streams) rather
        # than sharing the SMs with them.
        self.step_stream = high_priority_stream(device) if high_priority else None
        # Early hand-over (config `early_handover`, default on; bench variant `late-handover` switches it off):
        # frames go on to Stage 1 from a stream of their own that waits only for the code predictor (the event
        # `decode_embeddings` records), not for the talker's forward and sampling queued behind it on the steps'
        # stream. Since the host no longer syncs once a step, it hands frames over while the step is still
        # queued, so with a late hand-over Stage 1 waits for the whole step (ninth pass, Poisson 1: the first
        # chunk's decode call p50 6.1 vs 8.1 ms).
        self._handover = high_priority_stream(device)
        self._frames_made = torch.cuda.Event() if device.type == "cuda" else None
        self.early_handover = early_handover
        if self.device.type == "cuda" and not engine.enforce_eager:
            # One graph per batch bucket up to the engine's batch limit, captured before serving.
            self.model.code_predictor.enable_cuda_graphs(engine.max_num_seqs)
        engine.attach(self)
        self._thread = OwnerThread("tts-stage0", self._run, on_death)

    # ---- commands (any thread) -------------------------------------------------------------------
    def submit(self, request_id: str, prompt: TalkerPrompt, sampling: TalkerSampling,
               on_frames: FramesCallback, on_finish: FinishCallback,
               on_admitted: Callable[[], None] | None = None) -> None:
        state = _RequestState(request_id, prompt, sampling, on_frames, on_finish, on_admitted)
        self._commands.put(("add", state))

    def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id))

    def barrier(self, timeout: float = 30.0) -> None:
        """Return once every command sent before this call has been handled."""
        done = threading.Event()
        self._commands.put(("barrier", done))
        if not done.wait(timeout):
            raise TimeoutError("Stage 0 did not reach the barrier")

    def close(self) -> None:
        self._stop.set()
        self._commands.put(("wake", None))
        self._thread.join(timeout=30)

    @property
    def active_request_ids(self) -> list[str]:
        return list(self._by_id) + [s.request_id for s in list(self._parked)]

    @property
    def alive(self) -> bool:
        return self._thread.alive

    # ---- stepping thread -------------------------------------------------------------------------
    def _run(self) -> None:
        if self.step_stream is not None:
            torch.cuda.set_stream(self.step_stream)   # vLLM's own stream helper follows set_stream
        while not self._stop.is_set():
            self._take_commands(block=not self.engine.has_unfinished() and not self._parked)
            if self._parked:
                self._admit_arrived(wait=not self.engine.has_unfinished())
            if not self.engine.has_unfinished():
                continue
            try:
                started = time.perf_counter()
                outputs = self.engine.step()
                self.step_log.record(time.perf_counter() - started)
            except PreemptedRequest as exc:
                self._fail_all(StreamFailed(str(exc)))
                continue
            except Exception as exc:  # an engine failure must not hang callers
                log.exception("talker step failed")
                self._fail_all(StreamFailed(f"talker step failed: {exc}"))
                continue
            self._deliver(outputs)

    def _take_commands(self, block: bool) -> None:
        """Handle the commands queued now (waiting up to 0.5 s for one if `block`); those that come meanwhile wait
        for the next round, after a step (see `drain_commands`)."""
        try:
            first = self._commands.get(block=block, timeout=0.5 if block else None)
            count = 1 << 30 if self.drain_commands else self._commands.qsize()
            self._handle(*first)
            for _ in range(count):
                self._handle(*self._commands.get_nowait())
        except queue.Empty:
            pass

    def _handle(self, cmd: str, arg) -> None:
        if cmd == "add":
            state: _RequestState = arg
            if self._max_tokens(state) < 1:
                state.on_finish(PromptTooLong(f"text is too long: its prompt takes {state.prompt.prefill.shape[0]} "
                                              f"positions, which leaves no room under max_model_len="
                                              f"{self.engine.max_model_len}"))
            elif state.prompt.prefill_arrived():
                self._admit(state)
            else:
                self._parked.append(state)
        elif cmd == "barrier":
            arg.set()
        elif cmd == "abort":
            state = self._by_id.get(arg)
            if state is not None:
                self.engine.abort([state.internal_id])
            else:
                state = self._unpark(arg)
            if state is not None:
                self._release(state, RequestAborted(f"request {arg} was aborted"))

    def _unpark(self, request_id: str) -> _RequestState | None:
        for i, state in enumerate(self._parked):
            if state.request_id == request_id:
                return self._parked.pop(i)
        return None

    def _admit_arrived(self, wait: bool) -> None:
        """Give vLLM every parked request whose prefill has reached the host. Between steps this only asks the
        prompts' events; with nothing to step (`wait`) it waits for the oldest, a copy of a few hundred KB behind
        a few small kernels, rather than spin."""
        arrived = []
        for i, state in enumerate(self._parked):     # only this thread changes the list (others read it)
            if wait and i == 0:
                state.prompt.wait_for_prefill()
            if state.prompt.prefill_arrived():
                self._admit(state)
                arrived.append(state)
        if arrived:        # a new list, after the admissions: a reader never misses a request in between
            self._parked = [s for s in self._parked if not any(s is a for a in arrived)]

    def _max_tokens(self, state: _RequestState) -> int:
        return min(state.sampling.max_new_tokens, self.engine.max_model_len - state.prompt.prefill.shape[0])

    def _admit(self, state: _RequestState) -> None:
        s = state.sampling
        try:
            state.internal_id = self.engine.add(
                state.request_id, state.prompt.prefill, greedy=s.greedy, temperature=s.temperature,
                top_k=s.top_k, top_p=s.top_p, max_tokens=self._max_tokens(state), eos_id=self.eos, seed=s.seed)
        except Exception as exc:
            state.on_finish(StreamFailed(f"talker rejected the request: {exc}"))
            return
        if state.prompt.trailing.is_cuda:   # built on the prompt builder's stream, read by this thread's steps
            steps = torch.cuda.current_stream(state.prompt.trailing.device)
            if state.prompt.ready is not None:   # the builder did not wait for its kernels: the steps do
                steps.wait_event(state.prompt.ready)
            state.prompt.trailing.record_stream(steps)
            state.prompt.tts_pad.record_stream(steps)
        state.slot = self._take_slot()
        self._by_internal[state.internal_id] = state
        self._by_id[state.request_id] = state
        self.step_log.request_added()
        if state.on_admitted is not None:
            state.on_admitted()

    def _release(self, state: _RequestState, error: Exception | None) -> None:
        self._by_internal.pop(state.internal_id, None)
        self._by_id.pop(state.request_id, None)
        if state.slot >= 0:
            self._free_slots.append(state.slot)
            state.slot = -1
        state.prompt = None  # type: ignore[assignment]  # free device tensors now
        state.pending = []   # a stop token's frame (a view of its step's batch tensor) is not handed out
        state.on_finish(error)

    def _take_slot(self) -> int:
        if not self._free_slots:
            grow = max(8, self._slot_count)
            self._free_slots.extend(range(self._slot_count + grow - 1, self._slot_count - 1, -1))
            self._slot_count += grow
            vocab = self.config.talker.vocab_size
            seen = torch.zeros(self._slot_count, vocab, dtype=torch.bool, device=self.device)
            if self._seen_table is not None:
                seen[:self._seen_table.shape[0]] = self._seen_table
            self._seen_table = seen
            if self._hidden_table is not None:
                hidden = self._hidden_table.new_zeros(self._slot_count, self._hidden_table.shape[1])
                hidden[:self._hidden_table.shape[0]] = self._hidden_table
                self._hidden_table = hidden
            self._decode_batch = self._logits_batch = None
        slot = self._free_slots.pop()
        self._seen_table[slot] = False
        self._decode_batch = self._logits_batch = None   # a reused slot may carry other settings
        return slot

    def _batch(self, which: str, states: list[_RequestState]) -> "_BatchCache":
        """Device tensors describing this step's rows, rebuilt only when the composition changes."""
        cached = self._decode_batch if which == "decode" else self._logits_batch
        key = tuple(s.slot for s in states)
        if cached is not None and cached.key == key:
            return cached
        slots = to_device(list(key), torch.long, self.device)
        if which == "decode":
            batch = _BatchCache(key, slots, sampling=BatchSampling.stack([s.sampling.subtalker for s in states],
                                                                          self.device))
            self._decode_batch = batch
        else:
            batch = _BatchCache(key, slots)
            batch.penalty = to_device([s.sampling.repetition_penalty for s in states], torch.float32,
                                      self.device).unsqueeze(1)
            batch.min_new = to_device([s.sampling.min_new_tokens for s in states], torch.long, self.device)
            self._logits_batch = batch
        return batch

    def _fail_all(self, error: Exception) -> None:
        states = list(self._by_id.values())
        self.engine.abort([s.internal_id for s in states])
        parked, self._parked = self._parked, []
        for state in states + parked:
            self._release(state, error)

    def _handover_stream(self):
        """Where frames are stacked, chunked and handed to Stage 1: the steps' own stream, or (early hand-over)
        a stream that waits only for the predictor that made them."""
        if self._handover is None or not self.early_handover:
            return contextlib.nullcontext()
        self._handover.wait_event(self._frames_made)
        return torch.cuda.stream(self._handover)

    def _deliver(self, outputs) -> None:
        with self._handover_stream():
            self._hand_out(outputs)

    def _hand_out(self, outputs) -> None:
        finished = {}
        for out in outputs:
            state = self._by_id.get(out.request_id)
            if state is not None:
                state.tokens += out.new_tokens
                if out.finished:
                    finished[out.request_id] = out
        for state in list(self._by_id.values()):
            if state.pending:          # `step` frames made so far; those not pending went out already
                count = frames_to_hand_out(len(state.pending), state.step - len(state.pending), state.tokens,
                                           state.request_id in finished)
                ready, state.pending = state.pending[:count], state.pending[count:]
                if ready:
                    state.on_frames(ready[0].unsqueeze(0) if len(ready) == 1 else torch.stack(ready))
        for out in finished.values():
            state = self._by_id[out.request_id]
            error = None
            if out.finish_reason not in (None, "stop", "length"):
                error = StreamFailed(f"the talker engine ended the request ({out.finish_reason})")
            self._release(state, error)

    # ---- hooks called by the model inside engine.step() --------------------------------------------
    @torch.inference_mode()
    def decode_embeddings(self, token_ids: torch.Tensor, rows: list[str]) -> torch.Tensor:
        states = [self._by_internal[r] for r in rows]
        batch = self._batch("decode", states)
        hidden = self._hidden_table[batch.slots]
        embed_tokens = self.model.model.embed_tokens
        c0_embed = embed_tokens(token_ids)
        codes, frame_embed = self.model.code_predictor.predict(hidden, c0_embed, batch.sampling)
        frames = torch.cat([token_ids.unsqueeze(1), codes], dim=1)
        if self._handover is not None:
            # recorded whether or not the hand-over is early (an event and the allocator's note, ~µs): a switch
            # that flips between this hook and the frames' hand-over then finds either path safe
            self._frames_made.record()
            frames.record_stream(self._handover)     # read there, after this step's tensors are freed here
        self._seen_table.index_put_((batch.slots, token_ids), self._seen_mark)
        text = []
        for i, s in enumerate(states):
            trailing = s.prompt.trailing
            text.append(trailing[s.step] if s.step < trailing.shape[0] else s.prompt.tts_pad)
            s.pending.append(frames[i])
            s.step += 1
        return frame_embed + torch.stack(text).to(frame_embed.dtype)

    @torch.inference_mode()
    def process_logits(self, hidden: torch.Tensor, logits: torch.Tensor, rows: list[str]) -> torch.Tensor:
        states = [self._by_internal.get(r) for r in rows]
        if any(s is None for s in states):
            return logits
        if self._hidden_table is None or self._hidden_table.dtype != hidden.dtype:
            self._hidden_table = hidden.new_zeros(self._slot_count, hidden.shape[1])
        batch = self._batch("logits", states)
        steps = [s.step for s in states]
        if batch.steps is not None and batch.host_steps is not None and steps == [t + 1 for t in batch.host_steps]:
            batch.steps += 1              # the usual case: every row advanced by one frame
        else:
            batch.steps = to_device(steps, torch.long, self.device)
        batch.host_steps = steps
        self._hidden_table.index_copy_(0, batch.slots, hidden)
        seen = self._seen_table[batch.slots]
        penalty = batch.penalty.to(logits.dtype)
        penalized = torch.where(logits < 0, logits * penalty, logits / penalty)
        logits = torch.where(seen, penalized, logits)
        early = batch.steps < batch.min_new
        logits[:, self.eos] = torch.where(early, torch.full_like(logits[:, self.eos], float("-inf")),
                                          logits[:, self.eos])
        return logits.masked_fill(self.suppress, float("-inf"))


@dataclass
class _BatchCache:
    """Device-side description of one step's batch (rows in vLLM's order)."""

    key: tuple[int, ...]                     # the rows' slots
    slots: torch.Tensor
    sampling: BatchSampling | None = None    # decode hook: code-predictor sampling settings
    penalty: torch.Tensor | None = None      # logits hook: [B, 1] repetition penalties
    min_new: torch.Tensor | None = None      # [B] minimum tokens before EOS
    steps: torch.Tensor | None = None        # [B] tokens fed so far (device copy of host_steps)
    host_steps: list[int] | None = None
