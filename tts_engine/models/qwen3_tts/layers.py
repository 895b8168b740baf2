"""Qwen3-style decoder layer in plain torch, for the code predictor (the talker runs on vLLM's layers).

Why not transformers' modules: the predictor runs 15 tiny steps per frame for a whole batch of requests,
so it wants a static per-batch KV cache it owns, without HF `generate` bookkeeping. Parameter names
match the official checkpoint (`layers.N.self_attn.q_proj`, `q_norm`, `mlp.gate_proj`, ...).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tts_engine.models.qwen3_tts.config import TransformerShape


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_tables(shape: TransformerShape, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [length, head_dim] for positions 0..length-1 (half-rotation layout)."""
    inv_freq = 1.0 / (shape.rope_theta ** (torch.arange(0, shape.head_dim, 2, dtype=torch.int64)
                                           .to(device=device, dtype=torch.float) / shape.head_dim))
    freqs = torch.outer(torch.arange(length, device=device, dtype=torch.float), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + _rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, shape: TransformerShape):
        super().__init__()
        self.shape = shape
        d, h, kv = shape.head_dim, shape.num_heads, shape.num_kv_heads
        self.q_proj = nn.Linear(shape.hidden_size, h * d, bias=False)
        self.k_proj = nn.Linear(shape.hidden_size, kv * d, bias=False)
        self.v_proj = nn.Linear(shape.hidden_size, kv * d, bias=False)
        self.o_proj = nn.Linear(h * d, shape.hidden_size, bias=False)
        self.q_norm = RMSNorm(d, shape.rms_norm_eps)
        self.k_norm = RMSNorm(d, shape.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: torch.Tensor,
                start: int) -> torch.Tensor:
        """x [B, n, H] at positions start..start+n-1; cache [2, B, kv, P, d] is written in place."""
        b, n, _ = x.shape
        d = self.shape.head_dim
        q = self.q_norm(self.q_proj(x).view(b, n, -1, d)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, n, -1, d)).transpose(1, 2)
        v = self.v_proj(x).view(b, n, -1, d).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        cache[0, :, :, start:start + n] = k
        cache[1, :, :, start:start + n] = v
        keys, values = cache[0, :, :, :start + n], cache[1, :, :, :start + n]
        out = F.scaled_dot_product_attention(q, keys, values, is_causal=n > 1 and start == 0,
                                             enable_gqa=self.shape.num_heads != self.shape.num_kv_heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


class MLP(nn.Module):
    def __init__(self, shape: TransformerShape):
        super().__init__()
        self.gate_proj = nn.Linear(shape.hidden_size, shape.intermediate_size, bias=False)
        self.up_proj = nn.Linear(shape.hidden_size, shape.intermediate_size, bias=False)
        self.down_proj = nn.Linear(shape.intermediate_size, shape.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, shape: TransformerShape):
        super().__init__()
        self.self_attn = Attention(shape)
        self.mlp = MLP(shape)
        self.input_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: torch.Tensor,
                start: int) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, start)
        return x + self.mlp(self.post_attention_layernorm(x))
