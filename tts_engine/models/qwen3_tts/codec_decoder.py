"""Code2Wav: the decoder of the Qwen3-TTS 12 Hz speech tokenizer (16 codes per 80 ms frame -> 24 kHz).

Our own implementation of the reference `Qwen3TTSTokenizerV2Decoder`, loading the official
`speech_tokenizer/` folder (`config.json` -> `decoder_config`, `model.safetensors` -> `decoder.*`).

Pipeline per frame (all strictly causal, no look-ahead):
  RVQ lookup (1 semantic + 15 acoustic codebooks) -> pre_conv (k3) -> sliding-window transformer
  -> 2 x [transposed conv x2 + ConvNeXt] (12.5 -> 50 Hz) -> conv k7 -> 4 x [SnakeBeta, transposed
  conv x r, 3 dilated residual units] (r = 8,5,4,3) -> SnakeBeta -> conv k7 -> clamp(-1, 1).

Design: ONE forward path, `_run(codes, state)`. Every layer that looks back in time (causal
convolutions, transposed convolutions, sliding-window attention) reads its left context from a
`DecoderStreamState` and writes back the context the next chunk will need. A fresh state holds zeros,
which is exactly the zero padding the reference applies at the start of a sequence (and masked-out
attention slots), so:
  * `decode_full`  = one step on a fresh state over the whole sequence;
  * `decode`       = the reference's offline `chunked_decode(300, 25)`: fresh state per window;
  * `decode_step`  = exact streaming: carried state, any chunking equals `decode_full`;
  * `chunked_decode_streaming` = the approximate "left context window" method (fresh state per window).
Every state tensor has a fixed shape (e.g. always `sliding_window - 1` cached keys, masked by position),
so states of different streams can be concatenated along the batch dimension and decoded together.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tts_engine.models.qwen3_tts.config import CheckpointError, read_json
from tts_engine.models.qwen3_tts.graph_capture import capture_on_device
from tts_engine.models.qwen3_tts.sampling import to_device
from tts_engine.models.qwen3_tts.weights import read_prefixed, weights_path

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHT_PREFIX = "decoder."
# Encoder-side projections of the split RVQ, stored in the checkpoint but never used when decoding.
UNUSED_WEIGHTS = ("quantizer.rvq_first.input_proj.weight", "quantizer.rvq_rest.input_proj.weight")


# --------------------------------------------------------------------------------------------------
# Folder reading (shared with codec_encoder.py)
# --------------------------------------------------------------------------------------------------


def read_tokenizer_config(folder: str | Path) -> tuple[dict[str, Any], Path]:
    """Read `folder/config.json` of an official speech-tokenizer folder; returns (dict, path)."""
    path = Path(folder) / CONFIG_FILE
    return read_json(path), path


def read_prefixed_weights(folder: str | Path, prefix: str) -> tuple[dict[str, Tensor], Path]:
    """Only the tensors named `prefix*` of `folder/model.safetensors` (prefix stripped), so the
    decoder does not read the encoder's weights and vice versa."""
    return read_prefixed(Path(folder), prefix), weights_path(Path(folder))


def check_weights(expected: dict[str, torch.Size], weights: dict[str, Tensor], prefix: str, source: str) -> None:
    """Raise one ValueError listing every missing, unexpected and shape-mismatched tensor."""
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    wrong = sorted(
        f"{k}: checkpoint {tuple(weights[k].shape)} vs model {tuple(expected[k])}"
        for k in set(weights) & set(expected)
        if weights[k].shape != expected[k]
    )
    report = "".join(
        f"\n  {len(items)} {title}: " + ", ".join(prefix + i for i in items[:12]) + (" ..." if len(items) > 12 else "")
        for title, items in (("missing", missing), ("unexpected", unexpected), ("shape-mismatched", wrong))
        if items
    )
    if report:
        raise CheckpointError(f"{source}: {prefix}* weights do not match the config{report}")


# --------------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Code2WavConfig:
    """The fields of `decoder_config` the decoder uses.

    Defaults are the reference config class's defaults, so a file that omits a key is read the way the
    reference reads it. `codebook_dim` has no default there either (the reference would crash), so it
    is required here.
    """

    codebook_dim: int
    codebook_size: int = 2048
    num_quantizers: int = 16
    latent_dim: int = 1024
    hidden_size: int = 1024
    intermediate_size: int = 3072
    num_hidden_layers: int = 8
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int | None = None  # reference: hidden_size // num_attention_heads when absent
    attention_bias: bool = False
    sliding_window: int = 72
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    hidden_act: str = "silu"
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    upsampling_ratios: tuple[int, ...] = (2, 2)
    decoder_dim: int = 1536

    @property
    def attn_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def samples_per_frame(self) -> int:
        """Waveform samples per code frame (1920 = 24000 Hz / 12.5 Hz for the released model)."""
        return math.prod(self.upsample_rates) * math.prod(self.upsampling_ratios)

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "decoder_config") -> Code2WavConfig:
        """Build from a `decoder_config` dict, validating what would otherwise fail deep inside torch."""
        known = {f.name for f in fields(cls)}
        kwargs = {k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items() if k in known}
        if "codebook_dim" not in kwargs:
            raise ValueError(f"{source}: key 'codebook_dim' is missing")
        cfg = cls(**kwargs)
        rope = d.get("rope_scaling")
        if isinstance(rope, dict) and rope.get("rope_type", rope.get("type", "default")) != "default":
            raise ValueError(f"{source}: only default RoPE is supported, got rope_scaling={rope}")
        problems = []
        if cfg.num_quantizers < 2:
            problems.append(f"num_quantizers={cfg.num_quantizers} (needs 1 semantic + >=1 acoustic)")
        if cfg.codebook_dim % 2:
            problems.append(f"codebook_dim={cfg.codebook_dim} must be even (codebooks are codebook_dim/2 wide)")
        if cfg.decoder_dim % 2 ** len(cfg.upsample_rates):
            problems.append(f"decoder_dim={cfg.decoder_dim} must be divisible by 2**{len(cfg.upsample_rates)}")
        if cfg.num_attention_heads % cfg.num_key_value_heads:
            problems.append("num_attention_heads must be a multiple of num_key_value_heads")
        if cfg.sliding_window < 1:
            problems.append(f"sliding_window={cfg.sliding_window} must be >= 1")
        if problems:
            raise ValueError(f"{source}: " + "; ".join(problems))
        return cfg

    @classmethod
    def from_folder(cls, folder: str | Path) -> Code2WavConfig:
        """Read `folder/config.json` (official speech-tokenizer config) and parse its `decoder_config`."""
        data, path = read_tokenizer_config(folder)
        decoder = data.get("decoder_config")
        if not isinstance(decoder, dict):
            raise ValueError(f"{path}: key 'decoder_config' is missing or not an object")
        return cls.from_dict(decoder, source=f"{path}: decoder_config")


# --------------------------------------------------------------------------------------------------
# Streaming state
# --------------------------------------------------------------------------------------------------


@dataclass
class DecoderStreamState:
    """What the decoder remembers about a stream (or a batch of streams) between chunks.

    `buffers[i]` belongs to the i-th stateful layer (batch-first, fixed shape): a convolution's last
    input samples, a transposed convolution's last input frames, or an attention layer's RoPE-rotated
    keys/values of the last `sliding_window - 1` frames. `positions[b]` counts the frames stream b has
    decoded: the absolute RoPE position of its next frame (a device tensor, so no host sync is needed).
    """

    buffers: list[Tensor]
    positions: Tensor

    @property
    def batch_size(self) -> int:
        return self.positions.shape[0]

    @staticmethod
    def cat(states: Sequence[DecoderStreamState]) -> DecoderStreamState:
        """Stack several states along the batch dimension (for one batched `decode_step`)."""
        return DecoderStreamState(
            buffers=[torch.cat(group) for group in zip(*(s.buffers for s in states))],
            positions=torch.cat([s.positions for s in states]),
        )

    def assign_split(self, states: Sequence[DecoderStreamState]) -> None:
        """Write this batched state back into `states` (the inverse of `cat`), in place."""
        start = 0
        for s in states:
            rows = slice(start, start + s.batch_size)
            s.buffers = [b[rows] for b in self.buffers]
            s.positions = self.positions[rows]
            start += s.batch_size


class DecoderStateTable:
    """Many streams' decoder states in one table per stateful layer, one row (slot) per stream.

    Why: a batched call on per-stream states concatenates every buffer of every stream in (a cat per buffer)
    and hands every stream a view of every buffer out: 29 buffers x 64 streams = 1,856 Python-level slices
    (~4 ms of host time, held under the GIL) for one 64-stream call. From a table a call gathers its streams'
    rows with one `index_select` per buffer and writes the next state back with one `index_copy_`, whatever the
    batch. The values are copied exactly, so a stream decodes the same samples either way.
    Rows of streams that stopped are reused; the table doubles when it is full (a stream's slot is kept) and never
    shrinks: it holds rows for the most streams that were open at once (up to twice that), ~5.2 MB a row for the
    released decoder in float32 (the engine's precision for it; 64 rows: 333 MB). Only Stage 1's thread uses it."""

    def __init__(self, decoder: "Code2WavDecoder", capacity: int = 8):
        self.decoder = decoder
        self._initial = decoder.new_stream_state(1)       # what a new stream's row starts as
        table = decoder.new_stream_state(capacity)
        self.buffers, self.positions = table.buffers, table.positions
        self._free = list(range(capacity - 1, -1, -1))
        # False (the default): `open` sets its row at once, a slice and a copy per buffer (the released decoder: 29
        # buffers, ~60 torch calls a stream). True (bench variant `stage1-lazy-open`, a candidate): `open` only takes
        # a slot; the rows of every slot opened since are set together, one `index_copy_` per buffer, before the
        # table is next read (`settle`). Lazy opens cost the host 40x less on the H200 (64 opens behind 32 ms of
        # queued GPU work: 0.8-1.2 vs 40-43 ms, the eager ones blocked in the full launch queue), yet closed 64's
        # first chunk p95 was worse with them in both runs of the fourteenth pass (226-316 vs 199-222 ms; Stage 0's
        # first frames came later), so they are off (BENCHMARKS.md).
        self.lazy_open = False
        self._fresh: list[int] = []

    @property
    def capacity(self) -> int:
        return self.positions.shape[0]

    @torch.inference_mode()       # the rows are inference tensors whether or not the table was made in that mode
    def open(self) -> int:
        """A slot for a new stream, its row a new stream's state by the time the table is read (see `lazy_open`)."""
        if not self._free:
            self._grow()
        slot = self._free.pop()
        if self.lazy_open:
            self._fresh.append(slot)
            return slot
        for row, initial in zip(self.buffers, self._initial.buffers):
            row[slot:slot + 1].copy_(initial)
        self.positions[slot:slot + 1].copy_(self._initial.positions)
        return slot

    @torch.inference_mode()
    def settle(self) -> None:
        """Set the rows of the slots opened since the last read to a new stream's state, all in one copy per buffer
        (the same values a copy per slot would write)."""
        if not self._fresh:
            return
        fresh, self._fresh = self._fresh, []
        slots = to_device(fresh, torch.long, self.positions.device)
        for row, initial in zip([*self.buffers, self.positions], [*self._initial.buffers, self._initial.positions]):
            row.index_copy_(0, slots, initial.expand(len(fresh), *initial.shape[1:]))

    def close(self, slot: int) -> None:
        if slot in self._free or not 0 <= slot < self.capacity:    # two streams on one row would corrupt both
            raise ValueError(f"slot {slot} is not in use")
        if slot in self._fresh:
            self._fresh.remove(slot)
        self._free.append(slot)

    @torch.inference_mode()
    def _grow(self) -> None:
        old = self.capacity
        bigger = self.decoder.new_stream_state(2 * old)
        for new, current in zip(bigger.buffers, self.buffers):
            new[:old].copy_(current)
        bigger.positions[:old].copy_(self.positions)
        self.buffers, self.positions = bigger.buffers, bigger.positions
        self._free.extend(range(2 * old - 1, old - 1, -1))

    def gather(self, slots: Tensor) -> DecoderStreamState:
        """The rows of `slots` (a device tensor of slot numbers) as one batched state (rows opened since the last
        `settle` are read as they are: `Code2WavDecoder.decode_rows`, the one reader, settles first)."""
        return DecoderStreamState(buffers=[b.index_select(0, slots) for b in self.buffers],
                                  positions=self.positions.index_select(0, slots))

    def scatter(self, slots: Tensor, state: DecoderStreamState) -> None:
        """Write a batched state (the first len(slots) rows of it) back into the rows of `slots`."""
        n = slots.shape[0]
        for row, new in zip(self.buffers, state.buffers):
            row.index_copy_(0, slots, new[:n])
        self.positions.index_copy_(0, slots, state.positions[:n])


class _StepState:
    """The state as seen during one forward pass: stateful layers `read` their context and `write` the
    context for the next chunk. Reads come from the old buffers, writes go to a new list, so a forward
    that raises leaves the caller's state untouched."""

    def __init__(self, state: DecoderStreamState):
        self.old = state.buffers
        self.new: list[Tensor | None] = [None] * len(state.buffers)
        self.positions = state.positions

    def read(self, slot: int) -> Tensor:
        return self.old[slot]

    def write(self, slot: int, value: Tensor) -> None:
        # A copy, not a view: the context is the tail of a layer's whole input, and a view would keep
        # that input (up to [B, C, 48000] at the last convolutions) alive as long as the state lives;
        # in a captured graph it pinned every graph's activations in the pool (the H200 ran out of memory).
        self.new[slot] = value.clone(memory_format=torch.contiguous_format)


# --------------------------------------------------------------------------------------------------
# Layers. Attribute names mirror the reference so the checkpoint's `decoder.*` keys load unchanged.
# --------------------------------------------------------------------------------------------------


class _Stateful(nn.Module):
    """A layer that needs left context. `slot` is assigned by `Code2WavDecoder` (its buffer index)."""

    slot: int = -1

    @property
    def has_state(self) -> bool:
        """False for layers that turn out to need no context (k=1 convs, k=stride transposed convs)."""
        return self.context > 0

    def initial_state(self, batch: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        raise NotImplementedError


class CausalConv1d(_Stateful):
    """Stride-1 Conv1d padded with (k-1)*dilation zeros on the left only.

    The reference computes a right "extra padding" too, which is always 0 at stride 1; the decoder uses
    no other stride. Streaming keeps the last (k-1)*dilation input samples.
    """

    def __init__(self, cin: int, cout: int, kernel_size: int, dilation: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel_size, dilation=dilation, groups=groups)
        self.context = (kernel_size - 1) * dilation

    def initial_state(self, batch: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        return torch.zeros(batch, self.conv.in_channels, self.context, device=device, dtype=dtype)

    def forward(self, x: Tensor, st: _StepState) -> Tensor:
        if self.context == 0:
            return self.conv(x)
        x = torch.cat([st.read(self.slot), x], dim=-1)
        st.write(self.slot, x[..., x.shape[-1] - self.context :])
        return self.conv(x)


class CausalConvTranspose1d(_Stateful):
    """ConvTranspose1d(k, stride s) trimmed to exactly s outputs per input frame (the reference cuts
    k - s samples on the right).

    Output frame t depends on input frames t-P..t with P = ceil((k-s)/s), so streaming keeps the last P
    input frames, runs the transposed conv over [history, new], and keeps the new frames' outputs.
    Zero history contributes nothing, matching the start of the reference's sequence.
    """

    def __init__(self, cin: int, cout: int, kernel_size: int, stride: int):
        super().__init__()
        self.conv = nn.ConvTranspose1d(cin, cout, kernel_size, stride=stride)
        self.stride = stride
        self.context = -(-(kernel_size - stride) // stride)

    def initial_state(self, batch: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        return torch.zeros(batch, self.conv.in_channels, self.context, device=device, dtype=dtype)

    def forward(self, x: Tensor, st: _StepState) -> Tensor:
        new_frames = x.shape[-1]
        if self.context:
            x = torch.cat([st.read(self.slot), x], dim=-1)
            st.write(self.slot, x[..., x.shape[-1] - self.context :])
        start = self.context * self.stride
        return self.conv(x)[..., start : start + new_frames * self.stride]


class SnakeBeta(nn.Module):
    """x + sin^2(x * e^alpha) / (e^beta + 1e-9): a periodic activation with per-channel log-scale
    frequency (alpha) and magnitude (beta)."""

    cache_scales = True     # False: compute them in every call, as before (scripts/gpu_microbench.py measures both)

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))
        self._constants: tuple[tuple, Tensor, Tensor] | None = None

    def _scales(self) -> tuple[Tensor, Tensor]:
        """e^alpha and 1 / (e^beta + 1e-9), computed once per weights instead of in every step: 5 of the 10
        kernels a call launched depended on the weights alone (29 activations a decode step: 145 launches, of
        ~520; aten calls a step 706 -> 445, tiny decoder, CPU profile). Recomputed when a weight is replaced
        or changed in place (its storage or version moves); the same operations on the same values, so the
        output is bit for bit what it was. Inference only: no gradient reaches alpha and beta this way."""
        key = (self.alpha.data_ptr(), self.alpha._version, self.beta.data_ptr(), self.beta._version)
        if self._constants is None or self._constants[0] != key or not self.cache_scales:
            with torch.no_grad():
                alpha = self.alpha.exp()[None, :, None]
                inverse = 1.0 / (self.beta.exp()[None, :, None] + 1e-9)
            self._constants = (key, alpha, inverse)
        return self._constants[1], self._constants[2]

    def forward(self, x: Tensor) -> Tensor:
        alpha, inverse = self._scales()
        return x + inverse * torch.sin(x * alpha).pow(2)


class ConvNeXtBlock(nn.Module):
    """Causal depthwise conv k7 -> LayerNorm -> MLP x4 (GELU) -> per-channel gamma, residual."""

    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: Tensor, st: _StepState) -> Tensor:
        h = self.dwconv(x, st).transpose(1, 2)
        h = self.pwconv2(F.gelu(self.pwconv1(self.norm(h))))
        return x + (self.gamma * h).transpose(1, 2)


class ResidualUnit(nn.Module):
    """SnakeBeta -> dilated causal conv k7 -> SnakeBeta -> conv k1, residual."""

    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv1d(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv1d(dim, dim, 1)

    def forward(self, x: Tensor, st: _StepState) -> Tensor:
        return x + self.conv2(self.act2(self.conv1(self.act1(x), st)), st)


class DecoderBlock(nn.Module):
    """One waveform upsampling stage: SnakeBeta, transposed conv (k=2r, stride r, halves channels),
    residual units with dilation 1, 3, 9. `block` indices match the checkpoint (block.0 ... block.4)."""

    def __init__(self, cin: int, cout: int, rate: int):
        super().__init__()
        self.block = nn.ModuleList(
            [SnakeBeta(cin), CausalConvTranspose1d(cin, cout, 2 * rate, rate)]
            + [ResidualUnit(cout, d) for d in (1, 3, 9)]
        )

    def forward(self, x: Tensor, st: _StepState) -> Tensor:
        x = self.block[0](x)
        for layer in self.block[1:]:
            x = layer(x, st)
        return x


class RMSNorm(nn.Module):
    """RMSNorm computed in float32, scaled in the input dtype (as the reference)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class LayerScale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), 0.01))

    def forward(self, x: Tensor) -> Tensor:
        return self.scale * x


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


class SlidingWindowAttention(_Stateful):
    """Causal self-attention over the last `sliding_window` frames (the query's own frame included).

    Keys are cached after RoPE at their absolute position, so a cached key never changes. The cache is
    always `sliding_window - 1` slots; slots before position 0 (a stream's start) are masked out.
    """

    def __init__(self, cfg: Code2WavConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.attn_head_dim
        self.cache_len = self.context = cfg.sliding_window - 1
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=bias)

    def initial_state(self, batch: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        # [B, 2 (key, value), kv_heads, cache_len, head_dim]
        return torch.zeros(batch, 2, self.kv_heads, self.cache_len, self.head_dim, device=device, dtype=dtype)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor], mask: Tensor, st: _StepState) -> Tensor:
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = rope
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        if self.cache_len:
            cache = st.read(self.slot)
            k = torch.cat([cache[:, 0], k], dim=2)
            v = torch.cat([cache[:, 1], v], dim=2)
            keep = k.shape[2] - self.cache_len
            st.write(self.slot, torch.stack([k[:, :, keep:], v[:, :, keep:]], dim=1))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.kv_heads != self.heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


class SwiGLU(nn.Module):
    def __init__(self, cfg: Code2WavConfig):
        super().__init__()
        if cfg.hidden_act != "silu":
            raise ValueError(f"decoder_config: hidden_act={cfg.hidden_act!r} is not supported (expected 'silu')")
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class TransformerLayer(nn.Module):
    """Pre-norm layer with LayerScale on both residual branches."""

    def __init__(self, cfg: Code2WavConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = SlidingWindowAttention(cfg)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor], mask: Tensor, st: _StepState) -> Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), rope, mask, st))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class PreTransformer(nn.Module):
    """latent -> hidden projection, sliding-window transformer, RMSNorm, hidden -> latent projection."""

    def __init__(self, cfg: Code2WavConfig):
        super().__init__()
        self.window = cfg.sliding_window
        self.input_proj = nn.Linear(cfg.latent_dim, cfg.hidden_size)
        self.layers = nn.ModuleList([TransformerLayer(cfg) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.output_proj = nn.Linear(cfg.hidden_size, cfg.latent_dim)
        self.rope_theta, self.rope_dim = cfg.rope_theta, cfg.attn_head_dim
        self.register_buffer("inv_freq", self._inv_freq(torch.device("cpu")), persistent=False)

    def _inv_freq(self, device: torch.device) -> Tensor:
        dim = self.rope_dim
        return 1.0 / (self.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim))

    def _apply(self, fn, recurse: bool = True):  # type: ignore[override]
        """Keep the RoPE frequencies in float32 when the model is cast (e.g. to bf16), as the reference
        does (its inv_freq is created in float32 and never cast)."""
        super()._apply(fn, recurse)
        self.inv_freq = self._inv_freq(self.inv_freq.device)
        return self

    def forward(self, x: Tensor, st: _StepState) -> Tensor:
        """x: [B, n, latent]; frame i of row b sits at absolute position st.positions[b] + i."""
        n = x.shape[1]
        steps = torch.arange(n, device=x.device)
        q_pos = st.positions[:, None] + steps  # [B, n]
        # RoPE tables in float32 (the reference forces fp32 here too), then cast to the model dtype.
        freqs = q_pos[..., None].float() * self.inv_freq
        emb = torch.cat([freqs, freqs], dim=-1)[:, None]  # [B, 1, n, head_dim]
        rope = (emb.cos().to(x.dtype), emb.sin().to(x.dtype))
        # Keys: window-1 cached slots, then the n new frames.
        cache_len = self.window - 1
        k_pos = st.positions[:, None] - cache_len + torch.arange(cache_len + n, device=x.device)  # [B, L]
        qp, kp = q_pos[:, :, None], k_pos[:, None, :]
        mask = ((kp >= 0) & (kp <= qp) & (kp > qp - self.window))[:, None]  # [B, 1, n, L]

        h = self.input_proj(x)
        for layer in self.layers:
            h = layer(h, rope, mask, st)
        return self.output_proj(self.norm(h))


class _Codebook(nn.Module):
    """EMA codebook as stored: vectors = embedding_sum / max(cluster_usage, 1e-5)."""

    def __init__(self, size: int, dim: int):
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))

    def vectors(self) -> Tensor:
        return self.embedding_sum / self.cluster_usage.clamp(min=1e-5)[:, None]


class _VectorQuantizer(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self._codebook = _Codebook(size, dim)


class _ResidualQuantizer(nn.Module):
    """`num` codebooks whose vectors are summed, then projected by a 1x1 conv (no bias)."""

    def __init__(self, num: int, size: int, dim: int, out_dim: int):
        super().__init__()
        self.vq = nn.Module()
        self.vq.layers = nn.ModuleList([_VectorQuantizer(size, dim) for _ in range(num)])
        self.output_proj = nn.Conv1d(dim, out_dim, 1, bias=False)


class SplitQuantizer(nn.Module):
    """Codebook 0 (semantic, `rvq_first`) and codebooks 1.. (acoustic, `rvq_rest`), each with its own
    output projection; the two projected sums are added."""

    def __init__(self, cfg: Code2WavConfig):
        super().__init__()
        dim = cfg.codebook_dim // 2
        self.rvq_first = _ResidualQuantizer(1, cfg.codebook_size, dim, cfg.codebook_dim)
        self.rvq_rest = _ResidualQuantizer(cfg.num_quantizers - 1, cfg.codebook_size, dim, cfg.codebook_dim)
        # All codebook vectors, [num_quantizers, size, dim], derived from the parameters by
        # `refresh_codebooks()` so the division is not repeated every step.
        self.register_buffer("tables", torch.zeros(cfg.num_quantizers, cfg.codebook_size, dim), persistent=False)

    @torch.no_grad()
    def refresh_codebooks(self) -> None:
        books = [vq._codebook.vectors() for r in (self.rvq_first, self.rvq_rest) for vq in r.vq.layers]
        self.tables = torch.stack(books).to(self.tables.dtype)

    def forward(self, codes: Tensor) -> Tensor:
        """codes [B, n, Q] -> [B, codebook_dim, n]."""
        q_index = torch.arange(codes.shape[-1], device=codes.device)
        vecs = self.tables[q_index, codes]  # [B, n, Q, dim]
        first = F.linear(vecs[:, :, 0], self.rvq_first.output_proj.weight[..., 0])
        rest = F.linear(vecs[:, :, 1:].sum(dim=2), self.rvq_rest.output_proj.weight[..., 0])
        return (first + rest).transpose(1, 2)


# --------------------------------------------------------------------------------------------------
# The decoder
# --------------------------------------------------------------------------------------------------


class Code2WavDecoder(nn.Module):
    """Codes [T, 16] (or [B, T, 16]) -> 24 kHz waveform [T * 1920] (or [B, T * 1920]), float32."""

    def __init__(self, cfg: Code2WavConfig):
        super().__init__()
        self.config = cfg
        self.samples_per_frame = cfg.samples_per_frame
        self.quantizer = SplitQuantizer(cfg)
        self.pre_conv = CausalConv1d(cfg.codebook_dim, cfg.latent_dim, 3)
        self.pre_transformer = PreTransformer(cfg)
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalConvTranspose1d(cfg.latent_dim, cfg.latent_dim, r, r), ConvNeXtBlock(cfg.latent_dim)])
            for r in cfg.upsampling_ratios
        )
        dims = [cfg.decoder_dim // 2**i for i in range(len(cfg.upsample_rates) + 1)]
        self.decoder = nn.ModuleList(
            [CausalConv1d(cfg.latent_dim, dims[0], 7)]
            + [DecoderBlock(dims[i], dims[i + 1], r) for i, r in enumerate(cfg.upsample_rates)]
            + [SnakeBeta(dims[-1]), CausalConv1d(dims[-1], 1, 7)]
        )
        self._stateful = [m for m in self.modules() if isinstance(m, _Stateful) and m.has_state]
        for slot, module in enumerate(self._stateful):
            module.slot = slot
        self._graphs: _DecoderGraphs | None = None
        self.use_graphs = True     # a switch for benchmarks (captured graphs stay valid)

    def enable_cuda_graphs(self, shapes: Sequence[tuple[int, int]]) -> None:
        """Replay CUDA graphs for `decode_step`s of these (batch bucket, new frames) shapes (the engine
        passes `DecoderStageConfig.graph_shapes()`: every chunk size and remainder, batches up to what a
        call of that size may hold); a batch is padded to the next bucket of its frame count. All are
        captured here, before serving; other shapes run eagerly. A one-frame step is ~400 small kernels:
        launch-bound eager (~10-20 ms on an H200), ~3 ms as a graph. CUDA only."""
        if self.quantizer.tables.is_cuda:
            self._graphs = _DecoderGraphs(self, shapes)

    # ---- loading --------------------------------------------------------------------------------

    @classmethod
    def from_folder(
        cls, path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
    ) -> Code2WavDecoder:
        """Load from an official `speech_tokenizer/` folder (config.json + model.safetensors).

        float32 is the supported precision (the parity target); bf16 runs but is audibly lossy, and
        then chunkings differ by rounding, not by 1e-4.
        """
        cfg = Code2WavConfig.from_folder(path)
        weights, weights_path = read_prefixed_weights(path, WEIGHT_PREFIX)
        model = cls(cfg)
        model.load_checkpoint_weights(weights, source=str(weights_path))
        return model.to(device=device, dtype=dtype).eval().requires_grad_(False)

    def load_checkpoint_weights(self, weights: dict[str, Tensor], source: str = "weights") -> None:
        """Load official `decoder.*` tensors (prefix stripped); every mismatch is listed in one error."""
        weights = {k: v for k, v in weights.items() if k not in UNUSED_WEIGHTS}
        check_weights({k: v.shape for k, v in self.state_dict().items()}, weights, WEIGHT_PREFIX, source)
        self.load_state_dict(weights, strict=True)
        self.quantizer.refresh_codebooks()

    # ---- streaming ------------------------------------------------------------------------------

    def new_stream_state(self, batch_size: int = 1) -> DecoderStreamState:
        """A state for a new stream (or `batch_size` streams decoded in lockstep)."""
        p = self.quantizer.tables
        return DecoderStreamState(
            buffers=[m.initial_state(batch_size, p.device, p.dtype) for m in self._stateful],
            positions=torch.zeros(batch_size, dtype=torch.long, device=p.device),
        )

    @torch.inference_mode()
    def decode_step(self, state: DecoderStreamState | Sequence[DecoderStreamState], new_codes: Tensor) -> Tensor:
        """Exact streaming: decode the next frames of one or more streams, updating their state in place.

        new_codes: [n, Q] for a single 1-stream state (returns [n * samples_per_frame]), or [B, n, Q]
        where B is the total batch size of `state` (a state, or a list of states that all get n new
        frames; returns [B, n * samples_per_frame]). Concatenating the outputs of any chunking equals
        `decode_full` of the whole sequence.
        """
        states = [state] if isinstance(state, DecoderStreamState) else list(state)
        squeeze = new_codes.dim() == 2
        codes = new_codes[None] if squeeze else new_codes
        total = sum(s.batch_size for s in states)
        if codes.shape[0] != total:
            raise ValueError(f"new_codes has batch {codes.shape[0]} but the state(s) hold {total} streams")
        graphs = self._graphs_for(codes)
        if graphs is not None:
            wav, merged = graphs.run(codes, states)
        else:
            merged = states[0] if len(states) == 1 else DecoderStreamState.cat(states)
            wav, merged = self._run(codes, merged)
        if len(states) == 1:
            states[0].buffers, states[0].positions = merged.buffers, merged.positions
        else:
            merged.assign_split(states)
        return wav[0] if squeeze else wav

    @torch.inference_mode()
    def decode_rows(self, table: DecoderStateTable, slots: Tensor, new_codes: Tensor) -> Tensor:
        """Exact streaming for streams whose states live in `table`: decode the next `n` frames of the streams
        in `slots` ([B] device tensor of their slots; new_codes [B, n, Q]) and write their next states back.
        The same samples as `decode_step` on the same states; the table is only written after a successful step."""
        if new_codes.dim() != 3 or new_codes.shape[0] != slots.shape[0]:
            raise ValueError(f"new_codes must be [B, n, Q] with B = {slots.shape[0]} slots, got {tuple(new_codes.shape)}")
        table.settle()                     # before either path reads the rows (the graphs' and `gather`)
        graphs = self._graphs_for(new_codes)
        if graphs is not None:
            return graphs.run_rows(new_codes, table, slots)
        wav, next_state = self._run(new_codes, table.gather(slots))
        table.scatter(slots, next_state)
        return wav

    def _graphs_for(self, codes: Tensor) -> "_DecoderGraphs | None":
        """The captured graphs, if they are on and hold a graph for this [B, n, Q] call (else it runs eagerly)."""
        graphs = self._graphs
        return graphs if graphs is not None and self.use_graphs and graphs.covers(codes.shape[0], codes.shape[1]) \
            else None

    # ---- offline --------------------------------------------------------------------------------

    @torch.inference_mode()
    def decode_full(self, codes: Tensor) -> Tensor:
        """One pass over the whole sequence (attention memory grows as T x T; see `decode`)."""
        squeeze = codes.dim() == 2
        batch = codes if not squeeze else codes[None]
        wav, _ = self._run(batch, self.new_stream_state(batch.shape[0]))
        return wav[0] if squeeze else wav

    @torch.inference_mode()
    def decode(self, codes: Tensor, chunk_size: int = 300, left_context_size: int = 25) -> Tensor:
        """Offline decode exactly as the reference `Qwen3TTSTokenizer.decode` does it: windows of
        `chunk_size` frames, each decoded from scratch with up to `left_context_size` preceding frames
        whose samples are dropped. Negative codes (the reference's batch padding, -1) are clamped to 0
        like the reference; trim such rows to their real length yourself.
        """
        chunks = list(self._windowed(codes.clamp(min=0), chunk_size, left_context_size))
        if not chunks:  # zero frames
            return torch.zeros(*codes.shape[:-2], 0, device=codes.device)
        return torch.cat(chunks, dim=-1)

    def chunked_decode_streaming(
        self,
        codes: Tensor,
        chunk_size: int = 25,
        left_context_size: int = 25,
        first_chunk_size: int | None = None,
    ) -> Iterator[Tensor]:
        """Approximate streaming (the seed method): yields each chunk's NEW samples, decoding every
        (left context + chunk) window from a fresh state. Output length is exact (T * 1920) but the
        samples differ from `decode_full` whenever the context is shorter than the decoder's reach
        (8 x 72-frame attention plus convolutions)."""
        # No inference_mode around the yield (it would leak into the caller while suspended);
        # each window's `decode_full` enters it itself.
        yield from self._windowed(codes, chunk_size, left_context_size, first_chunk_size)

    def _windowed(
        self, codes: Tensor, chunk_size: int, left_context_size: int, first_chunk_size: int | None = None
    ) -> Iterator[Tensor]:
        if chunk_size < 1 or left_context_size < 0 or (first_chunk_size is not None and first_chunk_size < 1):
            raise ValueError(
                "need chunk_size >= 1, left_context_size >= 0, first_chunk_size >= 1 or None; got "
                f"{chunk_size}, {left_context_size}, {first_chunk_size}"
            )
        self._check_codes(codes)
        total = codes.shape[-2]
        start = 0
        while start < total:
            end = min(start + (first_chunk_size if start == 0 and first_chunk_size else chunk_size), total)
            context = min(left_context_size, start)
            wav = self.decode_full(codes[..., start - context : end, :])
            yield wav[..., context * self.samples_per_frame :]
            start = end

    # ---- the one forward path -------------------------------------------------------------------

    def _check_codes(self, codes: Tensor) -> None:
        q = self.config.num_quantizers
        if codes.dim() not in (2, 3) or codes.shape[-1] != q:
            raise ValueError(f"codes must be [T, {q}] or [B, T, {q}], got {tuple(codes.shape)}")

    def _run(self, codes: Tensor, state: DecoderStreamState) -> tuple[Tensor, DecoderStreamState]:
        """codes [B, n, Q] + state -> (waveform [B, n * samples_per_frame] float32, next state)."""
        self._check_codes(codes)
        n = codes.shape[1]
        if n == 0:
            return codes.new_zeros(codes.shape[0], 0, dtype=torch.float32), state
        st = _StepState(state)
        h = self.pre_conv(self.quantizer(codes), st)  # [B, latent, n]
        h = self.pre_transformer(h.transpose(1, 2), st).transpose(1, 2)
        for trans_conv, convnext in self.upsample:
            h = convnext(trans_conv(h, st), st)
        for layer in self.decoder:
            h = layer(h, st) if not isinstance(layer, SnakeBeta) else layer(h)
        wav = h.clamp(-1.0, 1.0)[:, 0].float()
        next_state = DecoderStreamState(buffers=st.new, positions=state.positions + n)  # type: ignore[arg-type]
        return wav, next_state


class _DecoderGraphs:
    """CUDA graphs of `Code2WavDecoder._run`, one per (batch bucket, new-frame count).

    A replay reads static inputs (codes, the streams' states, rows beyond the real batch are padding)
    and writes static outputs. A call concatenates the streams' states straight into the static
    inputs (one copy per state buffer) and clones the outputs once; the caller then hands each
    stream its rows, exactly as the eager batched path does.
    """

    def __init__(self, decoder: Code2WavDecoder, shapes: Sequence[tuple[int, int]]):
        self.decoder = decoder
        self.buckets: dict[int, list[int]] = {}        # frames -> batch buckets captured for it
        for b, n in shapes:
            self.buckets.setdefault(n, []).append(b)
        for sizes in self.buckets.values():
            sizes.sort()
        self.max_batch = max(b for b, _ in shapes)    # lower it to keep larger batches eager (benchmarks)
        self.pool = self._new_pool()
        self._states: dict[int, DecoderStreamState] = {}
        self._graphs: dict[tuple[int, int], tuple] = {}
        start = time.perf_counter()
        device = decoder.quantizer.tables.device
        # On the decoder's own GPU (Stage 1 may have a GPU of its own; see graph_capture.py).
        on_device = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
        with torch.inference_mode(), on_device:
            for b, n in sorted(set(shapes), key=lambda s: (-s[0] * s[1], -s[0])):   # largest first: smaller reuse the pool
                self._capture(b, n)
        log.info("decoder: %d CUDA graphs captured in %.1f s (%.2f GiB allocated on %s)", len(self._graphs),
                 time.perf_counter() - start, torch.cuda.memory_allocated(device) / 2**30, device)

    def covers(self, batch: int, frames: int) -> bool:
        sizes = self.buckets.get(frames)
        return bool(sizes) and batch <= min(sizes[-1], self.max_batch)

    def _capture(self, b: int, n: int) -> None:
        decoder = self.decoder
        device = decoder.quantizer.tables.device
        codes = torch.zeros(b, n, decoder.config.num_quantizers, dtype=torch.long, device=device)
        if b not in self._states:   # one static input state per batch bucket, shared by its frame counts
            self._states[b] = decoder.new_stream_state(b)
        state = self._states[b]
        replay, wav, next_state = self._record(codes, state)
        self._graphs[(b, n)] = (replay, codes, state, wav, next_state)

    def _new_pool(self):
        return torch.cuda.graph_pool_handle()

    def _record(self, codes: Tensor, state: DecoderStreamState) -> tuple[Callable[[], None], Tensor,
                                                                         DecoderStreamState]:
        """Capture one `_run` on static inputs; returns (replay, static wav, static next state)."""
        decoder = self.decoder
        graph, (wav, next_state) = capture_on_device(lambda: decoder._run(codes, state), codes.device, self.pool)
        return graph.replay, wav, next_state

    def _graph(self, codes: Tensor) -> tuple:
        """The graph of the smallest batch bucket that holds this call, its codes copied into its static input:
        (replay, static state in, static wav, static next state)."""
        batch, n = codes.shape[0], codes.shape[1]
        b = next(size for size in self.buckets[n] if size >= batch)
        replay, codes_in, state_in, wav, next_state = self._graphs[(b, n)]
        codes_in[:batch].copy_(codes)
        return replay, state_in, wav, next_state

    def run(self, codes: Tensor, states: Sequence[DecoderStreamState]) -> tuple[Tensor, DecoderStreamState]:
        batch = codes.shape[0]
        replay, state_in, wav, next_state = self._graph(codes)
        for slot, dst in enumerate(state_in.buffers):
            torch.cat([s.buffers[slot] for s in states], out=dst[:batch])
        torch.cat([s.positions for s in states], out=state_in.positions[:batch])
        replay()
        return wav[:batch].clone(), DecoderStreamState(buffers=[t[:batch].clone() for t in next_state.buffers],
                                                       positions=next_state.positions[:batch].clone())

    def run_rows(self, codes: Tensor, table: DecoderStateTable, slots: Tensor) -> Tensor:
        """`run` for streams whose states live in `table`: their rows are gathered straight into the static
        inputs and the static next state is written straight back into their rows (no per-stream tensors)."""
        batch = codes.shape[0]
        replay, state_in, wav, next_state = self._graph(codes)
        for src, dst in zip(table.buffers, state_in.buffers):
            torch.index_select(src, 0, slots, out=dst[:batch])
        torch.index_select(table.positions, 0, slots, out=state_in.positions[:batch])
        replay()
        out = wav[:batch].clone()          # first: should it fail, the streams' rows are still the ones before
        table.scatter(slots, next_state)
        return out
