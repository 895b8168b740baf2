"""The code predictor ("sub-talker"): codebooks 1..15 of a frame from the talker state and codebook 0.

The official code runs a fresh HF `generate` per frame per request. Here one call serves every request
of a talker step at once: a 2-token prefill [h_t, E0(c0)] followed by 14 single-token steps against a
small static KV cache. It also returns the frame's summed codec embedding, which is the talker's next
input (plus the text term), so the frame never leaves the device between the two.

On CUDA the whole 15-step loop (~75 small kernels a step) is launch-bound, so `enable_cuda_graphs`
captures it once per batch bucket (and sampling variant) and `predict` replays the graph of the
smallest bucket that fits, padding the batch. Sampling noise is drawn before the replay (each seeded
request from its own generator), so a graph holds no host-side work. For the default variant
(sampling, no top-p) the graph is made of `torch.compile`d steps (`_fused_step`: fused q/k/v and
gate/up projections, attention over the whole 16-slot cache with a position mask, so every step has
the same shapes): Inductor fuses the norms, RoPE and residuals, ~3x fewer kernels a step, and the sampling is one
kernel of ours (`top_k_sampler.py`).
`TTS_PREDICTOR_COMPILE=0` keeps the plain captured loop.
"""

from __future__ import annotations

import logging
import os
import time

import torch
import torch.nn.functional as F
from torch import nn

from tts_engine.models.qwen3_tts.config import TalkerConfig
from tts_engine.models.qwen3_tts.gemv import small_linear
from tts_engine.models.qwen3_tts.graph_capture import capture_on_device
from tts_engine.models.qwen3_tts.layers import DecoderLayer, RMSNorm, apply_rope, rope_tables
from tts_engine.models.qwen3_tts.sampling import BatchSampling, draw_noise, sample, sample_rows
from tts_engine.models.qwen3_tts.top_k_sampler import sample_top_k

log = logging.getLogger(__name__)


class _PredictorModel(nn.Module):
    def __init__(self, talker: TalkerConfig):
        super().__init__()
        shape = talker.code_predictor
        self.layers = nn.ModuleList(DecoderLayer(shape) for _ in range(shape.num_layers))
        self.norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        # Embeddings of codebooks 1..15 live at *talker* width: they are summed into talker inputs.
        self.codec_embedding = nn.ModuleList(
            nn.Embedding(talker.codebook_size, talker.shape.hidden_size) for _ in range(talker.num_code_groups - 1))


class CodePredictor(nn.Module):
    """Parameter names mirror `talker.code_predictor.*` of the official checkpoint."""

    def __init__(self, talker: TalkerConfig):
        super().__init__()
        self.talker_config = talker
        shape = talker.code_predictor
        self.shape = shape
        self.model = _PredictorModel(talker)
        self.lm_head = nn.ModuleList(
            nn.Linear(shape.hidden_size, talker.codebook_size, bias=False) for _ in range(talker.num_code_groups - 1))
        if shape.hidden_size != talker.shape.hidden_size:
            self.small_to_mtp_projection: nn.Module = nn.Linear(talker.shape.hidden_size, shape.hidden_size, bias=True)
        else:
            self.small_to_mtp_projection = nn.Identity()
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None
        self.graphs: PredictorGraphs | None = None
        self.use_graphs = True               # a switch for benchmarks (graphs captured stay valid)
        # The graph of the smallest batch bucket (one or two streams) runs o_proj and the input projection (84 of a
        # frame's ~330 products, in the steps after the first) as a Triton matrix-vector kernel (`gemv.py`) instead
        # of cuBLAS's split-K tiles, which take 13 us for that 4 MB weight at 2 rows (H200, BENCHMARKS.md sixteenth
        # pass: predictor kernel time 3.98 -> 3.30 ms a frame, one stream's frame p50 7.0-7.2 -> 6.5-6.6 ms). Other
        # buckets keep cuBLAS: there the op boundary cost Inductor's fusions (batch 64: 4.7 -> 5.6 ms). Costs one more
        # compile at start-up. Read when a graph is captured (bench variant `no-small-gemv` recaptures it off).
        self.small_gemv = True
        # The compiled step samples with one Triton kernel a step (`top_k_sampler.py`: the top-k filter by a radix
        # select, the softmax and the draw in registers) instead of PyTorch's radix sort of the row (21 us a step on
        # the H200) plus Inductor's kernels around it: predictor graph at one stream 3.89-4.06 -> 3.65-3.71 ms, one
        # stream's frame p50 6.4 -> 6.0 ms (BENCHMARKS.md seventeenth pass). Every compiled graph; read when a graph
        # is captured (bench variant `no-fused-sampler` recaptures them with it off).
        self.fused_sampler = True

    def _rope_tables(self, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if self._rope is None or self._rope[0].device != device or self._rope[0].dtype != dtype:
            cos, sin = rope_tables(self.shape, self.talker_config.num_code_groups, device)
            self._rope = (cos.to(dtype), sin.to(dtype))
        return self._rope

    def embed_codes(self, codes: torch.Tensor, codebook0_embedding: nn.Module | torch.Tensor) -> torch.Tensor:
        """Sum of the 16 codebook embeddings of frames codes [..., 16] -> [..., H_talker]."""
        table0 = codebook0_embedding if isinstance(codebook0_embedding, torch.Tensor) else codebook0_embedding.weight
        parts = [nn.functional.embedding(codes[..., 0], table0)]
        parts += [emb(codes[..., q + 1]) for q, emb in enumerate(self.model.codec_embedding)]
        # One stacked reduction, in the official order, so float rounding matches the reference.
        return torch.stack(parts, dim=-2).sum(-2)

    def enable_cuda_graphs(self, max_batch: int, warmup: bool = True, compile: bool | None = None,
                           compile_mode: str | None = None) -> None:
        """Capture the predictor loop as CUDA graphs for batches up to `max_batch` (CUDA only).

        `compile` (default: env TTS_PREDICTOR_COMPILE, on): build the sampled-variant graphs from
        `torch.compile`d fused steps; falls back to the plain loop if compiling fails. `compile_mode`:
        torch.compile's mode (None: Inductor's default; scripts/gpu_microbench.py compares others)."""
        device = next(self.parameters()).device
        if device.type != "cuda":
            return
        if compile is None:
            compile = os.environ.get("TTS_PREDICTOR_COMPILE", "1") != "0"
        self.graphs = PredictorGraphs(self, max_batch, device, next(self.parameters()).dtype, compile=compile,
                                      compile_mode=compile_mode)
        if warmup:
            self.graphs.capture_all()

    # ---- the fused, compiled path (CUDA graphs only) ----------------------------------------------
    def _fuse_projections(self) -> None:
        """q/k/v and gate/up as one matrix each; the separate Linears become views of it (no copy),
        so the eager path and the checkpoint names are unchanged."""
        for layer in self.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            if getattr(attn, "qkv_weight", None) is None:
                qkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).detach()
                sizes = [attn.q_proj.weight.shape[0], attn.k_proj.weight.shape[0], attn.v_proj.weight.shape[0]]
                attn.qkv_weight = qkv
                for lin, part in zip((attn.q_proj, attn.k_proj, attn.v_proj), qkv.split(sizes)):
                    lin.weight = nn.Parameter(part, requires_grad=False)
                gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).detach()
                mlp.gate_up_weight = gate_up
                for lin, part in zip((mlp.gate_proj, mlp.up_proj), gate_up.chunk(2)):
                    lin.weight = nn.Parameter(part, requires_grad=False)

    def _fused_step(self, x: torch.Tensor, positions: torch.Tensor, key_cache: list[torch.Tensor],
                    value_cache: list[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor, do_sample: torch.Tensor,
                    temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, noise: torch.Tensor,
                    lm_weight: torch.Tensor, embed_weight: torch.Tensor,
                    small: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One predictor step for x [B, n, Hc] at `positions` [n] (the first step: n=2, positions 0,1).

        Writes the step's keys/values into the [B, kv, 16, d] caches and attends over all 16 slots
        with a position mask. Returns (code [B], its embedding [B, H_talker], next input [B, 1, Hc]).
        `small`: o_proj and the input projection through `small_linear` (see `small_gemv`); a compile of its own.
        Samples with `sample_top_k` when `fused_sampler` is on (switching it compiles the step again).
        """
        b, n, _ = x.shape
        d = self.shape.head_dim
        linear = small_linear if small else F.linear
        cos_n, sin_n = cos[positions], sin[positions]                 # [n, d]
        slots = torch.arange(key_cache[0].shape[2], device=x.device)
        mask = slots[None, :] <= positions[:, None]                   # [n, 16]
        for layer, keys, values in zip(self.model.layers, key_cache, value_cache):
            attn, mlp = layer.self_attn, layer.mlp
            qkv = F.linear(layer.input_layernorm(x), attn.qkv_weight)
            q, k, v = qkv.split([attn.q_proj.weight.shape[0], attn.k_proj.weight.shape[0],
                                 attn.v_proj.weight.shape[0]], dim=-1)
            q = apply_rope(attn.q_norm(q.reshape(b, n, -1, d)).transpose(1, 2), cos_n, sin_n)
            k = apply_rope(attn.k_norm(k.reshape(b, n, -1, d)).transpose(1, 2), cos_n, sin_n)
            keys.index_copy_(2, positions, k)
            values.index_copy_(2, positions, v.reshape(b, n, -1, d).transpose(1, 2))
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask,
                                                 enable_gqa=self.shape.num_heads != self.shape.num_kv_heads)
            x = x + linear(out.transpose(1, 2).reshape(b, n, -1), attn.o_proj.weight)
            gate, up = F.linear(layer.post_attention_layernorm(x), mlp.gate_up_weight).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, mlp.down_proj.weight)
        logits = F.linear(self.model.norm(x[:, -1]), lm_weight)
        if self.fused_sampler:
            code = sample_top_k(logits, do_sample, temperature, top_k, noise)
        else:
            code = sample_rows(logits, do_sample, temperature, top_k, top_p, noise, True, False)
        code_embed = F.embedding(code, embed_weight)
        return code, code_embed, self._project(code_embed, linear).unsqueeze(1)

    def _project(self, x: torch.Tensor, linear) -> torch.Tensor:
        """`small_to_mtp_projection` (talker width to the predictor's) with `linear`; the identity at equal widths."""
        proj = self.small_to_mtp_projection
        return linear(x, proj.weight, proj.bias) if isinstance(proj, nn.Linear) else proj(x)

    def predict_fused(self, step_fn, hidden: torch.Tensor, c0_embed: torch.Tensor, params: BatchSampling,
                      noise: torch.Tensor, positions: list[torch.Tensor],
                      small: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """The sampled loop from `step_fn` (`_fused_step`, compiled); `noise` [B, 15, V]. `small`: the steps after the
        first with `small_gemv`'s products (the first step's two positions a row make 4 rows at one stream, where
        the kernel gains ~1.5 us a product, H200: not worth the ~14 s its own compile adds to start-up)."""
        batch = hidden.shape[0]
        steps = self.talker_config.num_code_groups - 1
        cos, sin = self._rope_tables(hidden.device, hidden.dtype)
        shape = (batch, self.shape.num_kv_heads, steps + 1, self.shape.head_dim)
        key_cache = [hidden.new_zeros(shape) for _ in self.model.layers]
        value_cache = [hidden.new_zeros(shape) for _ in self.model.layers]
        x = self.small_to_mtp_projection(torch.stack((hidden, c0_embed), dim=1))
        codes, embeds = [], [c0_embed]
        for step in range(steps):
            step_noise = noise[:, step]
            batched = (x, step_noise, *key_cache, *value_cache, params.do_sample, params.temperature,
                       params.top_k, params.top_p)
            for t in batched:   # one compiled step serves every batch bucket
                torch._dynamo.maybe_mark_dynamic(t, 0)
            code, code_embed, x = step_fn(x, positions[step], key_cache, value_cache, cos, sin, params.do_sample,
                                          params.temperature, params.top_k, params.top_p, step_noise,
                                          self.lm_head[step].weight, self.model.codec_embedding[step].weight,
                                          small and step > 0)
            codes.append(code)
            embeds.append(code_embed)
        return torch.stack(codes, dim=1), torch.stack(embeds, dim=1).sum(1)

    @torch.inference_mode()
    def predict(self, hidden: torch.Tensor, c0_embed: torch.Tensor,
                params: BatchSampling) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [B, H] (talker's post-norm state that produced c0), c0_embed [B, H] = E0(c0).

        Returns (codes [B, 15] for codebooks 1..15, the frame's summed embedding E0(c0)+...+E15(c15)
        [B, H_talker], reduced in one stacked sum as the official code does).
        """
        graphs = self.graphs
        if graphs is not None and self.use_graphs and hidden.is_cuda and hidden.shape[0] <= graphs.max_batch:
            return graphs.run(hidden, c0_embed, params)
        return self.predict_eager(hidden, c0_embed, params)

    def predict_eager(self, hidden: torch.Tensor, c0_embed: torch.Tensor, params: BatchSampling,
                      noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The loop itself; `noise` [B, 15, V] (pre-drawn Exp(1)) makes it capturable."""
        batch = hidden.shape[0]
        steps = self.talker_config.num_code_groups - 1
        dtype, device = hidden.dtype, hidden.device
        cos, sin = self._rope_tables(device, dtype)
        cache = torch.empty(len(self.model.layers), 2, batch, self.shape.num_kv_heads, steps + 1,
                            self.shape.head_dim, device=device, dtype=dtype)
        x = self.small_to_mtp_projection(torch.stack((hidden, c0_embed), dim=1))
        codes = torch.empty(batch, steps, dtype=torch.long, device=device)
        embeds = [c0_embed]
        start = 0
        for step in range(steps):
            n = x.shape[1]
            for layer, layer_cache in zip(self.model.layers, cache):
                x = layer(x, cos[start:start + n], sin[start:start + n], layer_cache, start)
            logits = self.lm_head[step](self.model.norm(x[:, -1]))
            code = sample(logits, params, None if noise is None else noise[:, step])
            codes[:, step] = code
            code_embed = self.model.codec_embedding[step](code)
            embeds.append(code_embed)
            start += n
            x = self.small_to_mtp_projection(code_embed).unsqueeze(1)
        return codes, torch.stack(embeds, dim=1).sum(1)


class PredictorGraphs:
    """CUDA graphs of `CodePredictor.predict_eager`, one per (batch bucket, sampling variant).

    Static inputs (hidden, E0(c0), per-row sampling settings, pre-drawn noise) live in buffers sized
    for the largest bucket; a call copies its rows in, replays the bucket's graph and copies the
    outputs out (the graph overwrites them on the next replay). All graphs share one memory pool.
    """

    BUCKETS = (2, 4, 8, 12, 16, 24, 32, 48, 64)   # no 1: a compiled step is dynamic in batch from 2 up

    def __init__(self, predictor: CodePredictor, max_batch: int, device: torch.device, dtype: torch.dtype,
                 compile: bool = True, compile_mode: str | None = None):
        self.predictor = predictor
        self.device = device
        max_batch = max(max_batch, 2)
        self.buckets = [b for b in self.BUCKETS if b < max_batch]
        top = self.buckets[-1] if self.buckets else 0
        while top < max_batch:                   # past 64: steps of 32
            top = min(max_batch, top + 32 if top >= 64 else max_batch)
            self.buckets.append(top)
        self.max_batch = self.buckets[-1]
        talker = predictor.talker_config
        steps, vocab = talker.num_code_groups - 1, talker.codebook_size
        b, h = self.max_batch, talker.shape.hidden_size
        with torch.inference_mode():
            self.hidden = torch.zeros(b, h, device=device, dtype=dtype)
            self.c0_embed = torch.zeros(b, h, device=device, dtype=dtype)
            self.noise = torch.ones(b, steps, vocab, device=device)
            self.do_sample = torch.zeros(b, dtype=torch.bool, device=device)
            self.temperature = torch.ones(b, device=device)
            self.top_k = torch.zeros(b, dtype=torch.long, device=device)
            self.top_p = torch.ones(b, device=device)
            # One position tensor per step (step 0 covers positions 0 and 1).
            self.positions = [torch.arange(2, device=device)] + [
                torch.tensor([s + 1], device=device) for s in range(1, steps)]
        self.pool = torch.cuda.graph_pool_handle()
        self._graphs: dict[tuple[int, bool, bool], tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        self.step_fn = None
        self.compiled = False
        # every bucket's graph with `small_gemv`'s products, not the smallest's only (gpu_microbench variant
        # `gemv-everywhere`: one compile for all buckets instead of two)
        self.small_everywhere = False
        if compile:
            try:
                predictor._fuse_projections()
                self.step_fn = torch.compile(predictor._fused_step, fullgraph=True, mode=compile_mode)
            except Exception:  # pragma: no cover - depends on the local compiler toolchain
                log.exception("code predictor: torch.compile unavailable; using the plain captured loop")

    def _params(self, b: int, any_sample: bool, any_top_p: bool) -> BatchSampling:
        return BatchSampling(do_sample=self.do_sample[:b], temperature=self.temperature[:b], top_k=self.top_k[:b],
                             top_p=self.top_p[:b], generators=[None] * b, any_sample=any_sample, any_top_p=any_top_p)

    @torch.inference_mode()
    def capture(self, b: int, any_sample: bool, any_top_p: bool) -> None:
        params = self._params(b, any_sample, any_top_p)
        args = (self.hidden[:b], self.c0_embed[:b], params, self.noise[:b])
        fused = self.step_fn is not None and any_sample and not any_top_p
        small = self.predictor.small_gemv and b in self._small_buckets()
        if fused:
            def run():
                return self.predictor.predict_fused(self.step_fn, *args, self.positions, small)
        else:
            def run():
                return self.predictor.predict_eager(*args)
        try:
            graph, codes, embed = self._capture(run)
        except Exception:
            if not fused:
                raise
            if small:      # the matrix-vector kernel (Triton on this GPU) must not cost the compiled step
                log.exception("code predictor: the step with the matrix-vector kernel failed for batch %d; "
                              "capturing it with cuBLAS", b)
                self.predictor.small_gemv = False
                return self.capture(b, any_sample, any_top_p)
            if self.predictor.fused_sampler:
                log.exception("code predictor: the step with the sampling kernel failed for batch %d; "
                              "capturing it with PyTorch's sampling", b)
                self.predictor.fused_sampler = False
                return self.capture(b, any_sample, any_top_p)
            log.exception("code predictor: compiled step failed for batch %d; using the plain captured loop", b)
            self.step_fn = None
            return self.capture(b, any_sample, any_top_p)
        self.compiled = self.compiled or fused
        self._graphs[(b, any_sample, any_top_p)] = (graph, codes, embed)

    def _capture(self, run):
        try:
            graph, (codes, embed) = capture_on_device(run, self.device, self.pool)
        except Exception:
            self.pool = torch.cuda.graph_pool_handle()   # a failed capture can leave its pool recording
            raise
        return graph, codes, embed

    def _small_buckets(self) -> list[int]:
        """The buckets whose compiled graph has `small_gemv`'s products (when it is on)."""
        return self.buckets if self.small_everywhere else self.buckets[:1]

    def capture_small(self) -> None:
        """Capture again the graphs `small_gemv` changes (after it is switched): the compiled, sampled ones of
        `_small_buckets`."""
        if self.step_fn is not None:
            for b in self._small_buckets():
                self.capture(b, True, False)

    def capture_sampled(self) -> None:
        """Capture again every compiled graph (after `fused_sampler` is switched): the sampled ones, every bucket."""
        if self.step_fn is not None:
            for b in reversed(self.buckets):
                self.capture(b, True, False)

    def capture_all(self) -> None:
        """The variants every engine meets: greedy and sampled (top-p off), every bucket, largest
        first so smaller graphs reuse the pool's blocks."""
        started = time.perf_counter()
        seconds = {}
        for b in reversed(self.buckets):
            began = time.perf_counter()
            for any_sample in (True, False):
                self.capture(b, any_sample, False)
            seconds[b] = time.perf_counter() - began
        # the first bucket captured compiles the step, the smallest (with `small_gemv`) compiles its own
        log.info("code predictor: %d CUDA graphs captured in %.1f s (batch buckets, largest first: %s s)", len(self._graphs),
                 time.perf_counter() - started, ", ".join(f"{b}: {seconds[b]:.1f}" for b in reversed(self.buckets)))

    def bucket(self, batch: int) -> int:
        return next(b for b in self.buckets if b >= batch)

    def run(self, hidden: torch.Tensor, c0_embed: torch.Tensor,
            params: BatchSampling) -> tuple[torch.Tensor, torch.Tensor]:
        batch = hidden.shape[0]
        b = self.bucket(batch)
        key = (b, params.any_sample, params.any_top_p)
        if key not in self._graphs:
            self.capture(*key)
        graph, codes, embed = self._graphs[key]
        self.hidden[:batch].copy_(hidden)
        self.c0_embed[:batch].copy_(c0_embed)
        if params.any_sample:
            self.do_sample[:batch].copy_(params.do_sample)
            self.temperature[:batch].copy_(params.temperature)
            self.top_k[:batch].copy_(params.top_k)
            self.top_p[:batch].copy_(params.top_p)
            draw_noise(self.noise[:batch].shape, params.generators, self.device, out=self.noise[:batch])
        graph.replay()
        return codes[:batch].clone(), embed[:batch].clone()
