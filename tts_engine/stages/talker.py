"""Stage 0: the talker on vLLM, stepped by its own thread, emitting 16-code frames per request.

Per-request decode state (invariant I5) lives in `_RequestState`, keyed by vLLM's internal request id
for the in-step hooks and by our id for commands; both entries are dropped on finish and on abort.
Each step, `decode_embeddings` runs the code predictor for every request whose codebook-0 token was
just sampled, completing that frame, and returns the talker's next input embedding; `process_logits`
records the hidden state the predictor needs and applies the official logits processors (repetition
penalty over generated codebook-0 tokens, minimum of 2 tokens before EOS, suppressed special ids).
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Callable

import torch

from tts_engine.models.qwen3_tts.config import Qwen3TTSConfig
from tts_engine.models.qwen3_tts.prompt import TalkerPrompt
from tts_engine.models.qwen3_tts.sampling import BatchSampling, RowSampling
from tts_engine.stages.vllm_bridge import PreemptedRequest, TalkerEngine

log = logging.getLogger(__name__)
MIN_NEW_TOKENS = 2

FramesCallback = Callable[[torch.Tensor], None]       # new frames [n, 16] (device tensor)
FinishCallback = Callable[[str | None], None]         # None on success, else an error message


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


@dataclass
class _RequestState:
    request_id: str
    prompt: TalkerPrompt
    sampling: TalkerSampling
    on_frames: FramesCallback
    on_finish: FinishCallback
    seen: torch.Tensor                      # [vocab] bool: codebook-0 tokens generated so far
    internal_id: str = ""
    step: int = 0                           # decode steps fed so far (= frames completed)
    hidden: torch.Tensor | None = None      # talker state that produced the pending codebook-0 token
    pending: list[torch.Tensor] = field(default_factory=list)   # frames not yet handed out
    error: str | None = None


class TalkerStage:
    """Owns the vLLM talker engine and its stepping thread."""

    def __init__(self, engine: TalkerEngine, config: Qwen3TTSConfig, device: torch.device):
        self.engine = engine
        self.config = config
        self.device = device
        self.model = engine.model
        talker = config.talker
        self.eos = talker.codec.eos
        self.suppress = torch.zeros(talker.vocab_size, dtype=torch.bool, device=device)
        self.suppress[talker.vocab_size - 1024:] = True
        self.suppress[self.eos] = False
        self._by_internal: dict[str, _RequestState] = {}
        self._by_id: dict[str, _RequestState] = {}
        self._commands: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        engine.attach(self)
        self._thread = threading.Thread(target=self._run, name="tts-stage0", daemon=True)
        self._thread.start()

    # ---- commands (any thread) -------------------------------------------------------------------
    def submit(self, request_id: str, prompt: TalkerPrompt, sampling: TalkerSampling,
               on_frames: FramesCallback, on_finish: FinishCallback) -> None:
        seen = torch.zeros(self.config.talker.vocab_size, dtype=torch.bool, device=self.device)
        state = _RequestState(request_id, prompt, sampling, on_frames, on_finish, seen)
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
        return list(self._by_id)

    # ---- stepping thread -------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            block = not self.engine.has_unfinished()
            try:
                while True:
                    cmd, arg = self._commands.get(block=block, timeout=0.5 if block else None)
                    block = False
                    self._handle(cmd, arg)
            except queue.Empty:
                pass
            if not self.engine.has_unfinished():
                continue
            try:
                outputs = self.engine.step()
            except PreemptedRequest as exc:
                self._fail_all(str(exc))
                continue
            except Exception as exc:  # an engine failure must not hang callers
                log.exception("talker step failed")
                self._fail_all(f"talker step failed: {exc}")
                continue
            self._deliver(outputs)

    def _handle(self, cmd: str, arg) -> None:
        if cmd == "add":
            state: _RequestState = arg
            s = state.sampling
            max_tokens = min(s.max_new_tokens, self.engine.max_model_len - state.prompt.prefill.shape[0])
            if max_tokens < 1:
                state.on_finish(f"prompt of {state.prompt.prefill.shape[0]} positions leaves no room "
                                f"under max_model_len={self.engine.max_model_len}")
                return
            try:
                state.internal_id = self.engine.add(
                    state.request_id, state.prompt.prefill, greedy=s.greedy, temperature=s.temperature,
                    top_k=s.top_k, top_p=s.top_p, max_tokens=max_tokens, eos_id=self.eos, seed=s.seed)
            except Exception as exc:
                state.on_finish(f"talker rejected the request: {exc}")
                return
            self._by_internal[state.internal_id] = state
            self._by_id[state.request_id] = state
        elif cmd == "barrier":
            arg.set()
        elif cmd == "abort":
            state = self._by_id.get(arg)
            if state is not None:
                self.engine.abort([state.internal_id])
                self._release(state, "aborted")

    def _release(self, state: _RequestState, error: str | None) -> None:
        self._by_internal.pop(state.internal_id, None)
        self._by_id.pop(state.request_id, None)
        state.prompt = None  # type: ignore[assignment]  # free device tensors now
        state.hidden = None
        state.on_finish(error)

    def _fail_all(self, message: str) -> None:
        states = list(self._by_id.values())
        self.engine.abort([s.internal_id for s in states])
        for state in states:
            self._release(state, message)

    def _deliver(self, outputs) -> None:
        for state in list(self._by_id.values()):
            if state.pending:
                frames = torch.stack(state.pending)
                state.pending.clear()
                state.on_frames(frames)
        for out in outputs:
            state = self._by_id.get(out.request_id)
            if state is not None and out.finished:
                self._release(state, state.error)

    # ---- hooks called by the model inside engine.step() --------------------------------------------
    @torch.inference_mode()
    def decode_embeddings(self, token_ids: torch.Tensor, rows: list[str]) -> torch.Tensor:
        states = [self._by_internal[r] for r in rows]
        hidden = torch.stack([s.hidden for s in states])
        embed_tokens = self.model.model.embed_tokens
        c0_embed = embed_tokens(token_ids)
        params = BatchSampling.stack([s.sampling.subtalker for s in states], self.device)
        codes, frame_embed = self.model.code_predictor.predict(hidden, c0_embed, params)
        frames = torch.cat([token_ids.unsqueeze(1), codes], dim=1)
        text = []
        for i, s in enumerate(states):
            trailing = s.prompt.trailing
            text.append(trailing[s.step] if s.step < trailing.shape[0] else s.prompt.tts_pad)
            s.pending.append(frames[i])
            s.seen[token_ids[i]] = True
            s.step += 1
        return frame_embed + torch.stack(text).to(frame_embed.dtype)

    @torch.inference_mode()
    def process_logits(self, hidden: torch.Tensor, logits: torch.Tensor, rows: list[str]) -> torch.Tensor:
        states = [self._by_internal.get(r) for r in rows]
        if any(s is None for s in states):
            return logits
        for i, s in enumerate(states):
            s.hidden = hidden[i].clone()
        seen = torch.stack([s.seen for s in states])
        penalty = torch.tensor([s.sampling.repetition_penalty for s in states], device=logits.device,
                               dtype=logits.dtype).unsqueeze(1)
        penalized = torch.where(logits < 0, logits * penalty, logits / penalty)
        logits = torch.where(seen, penalized, logits)
        early = torch.tensor([s.step < MIN_NEW_TOKENS for s in states], device=logits.device)
        logits[:, self.eos] = torch.where(early, torch.full_like(logits[:, self.eos], float("-inf")),
                                          logits[:, self.eos])
        return logits.masked_fill(self.suppress, float("-inf"))
