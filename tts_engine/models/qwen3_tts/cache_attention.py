"""Attention of a code predictor step over its 16-slot cache, as one Triton kernel.

Why: the compiled predictor step (`CodePredictor._fused_step`) attends with `F.scaled_dot_product_attention` and a
position mask. On the H200 that is three kernels a layer: the mask made additive, a copy into cuDNN's layout, and
cuDNN's flash kernel, about 6-8 us at one stream for what is a 16 x 128 key block per head (70 layer-steps a frame:
~0.5 ms of a 4 ms predictor frame; BENCHMARKS.md, seventeenth pass). Here one program per (row, key/value head,
query) loads that block once, scores the heads that share it (GQA), masks the slots past the query's position,
and writes the weighted values straight into o_proj's layout [B, n, heads * d]: one launch a layer.

Sums and the softmax run in fp32; the probabilities are not rounded to bf16 before the value product as a flash
kernel rounds them, so results differ from cuDNN's in their last bits (the GPU path has no bit-exact reference).
`cache_attention` is a custom op, so `torch.compile` keeps it as one call and a CUDA graph captures its launch; on
the CPU, or without Triton, it is the SDPA it replaces. `CodePredictor.fused_attention` decides whether the step
uses it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

try:  # pragma: no cover - depends on the install (torch's Linux wheels bring Triton, CPU ones included)
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None


if triton is not None:
    @triton.jit
    def _cache_attention_kernel(q_ptr, k_ptr, v_ptr, positions_ptr, out_ptr, scale, kv_heads, group, slots, dim,
                                sq_b, sq_h, sq_n, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, so_b, so_n,
                                GROUP_PAD: tl.constexpr, SLOTS_PAD: tl.constexpr, DIM_PAD: tl.constexpr):
        b = tl.program_id(0) // kv_heads
        kv = tl.program_id(0) % kv_heads
        query = tl.program_id(1)
        g = tl.arange(0, GROUP_PAD)
        s = tl.arange(0, SLOTS_PAD)
        d = tl.arange(0, DIM_PAD)
        heads = kv * group + g                       # the query heads that read this key/value head
        q_mask = (g[:, None] < group) & (d[None, :] < dim)
        q = tl.load(q_ptr + b * sq_b + heads[:, None] * sq_h + query * sq_n + d[None, :], mask=q_mask,
                    other=0.0).to(tl.float32)
        block = (s[:, None] < slots) & (d[None, :] < dim)
        k = tl.load(k_ptr + b * sk_b + kv * sk_h + s[:, None] * sk_s + d[None, :], mask=block, other=0.0).to(tl.float32)
        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale                 # [heads, slots]
        visible = (s <= tl.load(positions_ptr + query)) & (s < slots)
        scores = tl.where(visible[None, :], scores, float("-inf"))
        weights = tl.exp(scores - tl.max(scores, axis=1)[:, None])
        weights = weights / tl.sum(weights, axis=1)[:, None]
        v = tl.load(v_ptr + b * sv_b + kv * sv_h + s[:, None] * sv_s + d[None, :], mask=block, other=0.0).to(tl.float32)
        out = tl.sum(weights[:, :, None] * v[None, :, :], axis=1)                      # [heads, dim]
        tl.store(out_ptr + b * so_b + query * so_n + heads[:, None] * dim + d[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=q_mask)


def launch(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """q [B, H, n, d] (any strides but a contiguous last dimension) over keys/values [B, kv, S, d], query i seeing
    the slots up to positions[i]; returns [B, n, H * d] (o_proj's input). Whatever device Triton runs on."""
    if triton is None:
        raise RuntimeError("Triton is not installed")
    if q.stride(-1) != 1 or keys.stride(-1) != 1 or values.stride(-1) != 1:
        raise ValueError("the kernel reads each head's vector as contiguous")
    batch, heads, n, dim = q.shape
    kv_heads, slots = keys.shape[1], keys.shape[2]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads cannot share {kv_heads} key/value heads")
    group = heads // kv_heads
    out = torch.empty(batch, n, heads * dim, dtype=q.dtype, device=q.device)
    if batch and n:
        _cache_attention_kernel[(batch * kv_heads, n)](
            q, keys, values, positions.contiguous(), out, 1 / math.sqrt(dim), kv_heads, group, slots, dim,
            q.stride(0), q.stride(1), q.stride(2), keys.stride(0), keys.stride(1), keys.stride(2),
            values.stride(0), values.stride(1), values.stride(2), out.stride(0), out.stride(1),
            GROUP_PAD=triton.next_power_of_2(group), SLOTS_PAD=triton.next_power_of_2(slots),
            DIM_PAD=triton.next_power_of_2(dim), num_warps=4)
    return out


def reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """What the kernel computes, as the step computed it before: SDPA with a position mask, in o_proj's layout."""
    batch, heads, n, _ = q.shape
    slots = torch.arange(keys.shape[2], device=q.device)
    mask = slots[None, :] <= positions[:, None]
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=heads != keys.shape[1])
    return out.transpose(1, 2).reshape(batch, n, -1)


@torch.library.custom_op("tts::cache_attention", mutates_args=())
def cache_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """`reference(q, keys, values, positions)`; one kernel on CUDA."""
    if triton is not None and q.is_cuda:
        return launch(q, keys, values, positions)
    return reference(q, keys, values, positions)


@cache_attention.register_fake
def _(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    batch, heads, n, dim = q.shape
    return q.new_empty(batch, n, heads * dim)
