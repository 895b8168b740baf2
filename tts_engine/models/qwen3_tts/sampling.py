"""Per-row sampling for a batch of requests with different settings, without host syncs.

The code predictor samples 15 codes per frame for every request in the batch, each request with its
own temperature/top-k/top-p and, when seeded, its own generator (so a seeded request reproduces no
matter what else is batched with it). The filters follow transformers' warpers in order
(temperature -> top-k -> top-p) so sampled distributions match the official implementation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RowSampling:
    """Sampling settings of one request."""

    do_sample: bool = True
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    generator: torch.Generator | None = None


@dataclass
class BatchSampling:
    """RowSampling stacked into device tensors once per batch composition."""

    do_sample: torch.Tensor     # [B] bool
    temperature: torch.Tensor   # [B] float
    top_k: torch.Tensor         # [B] long (0 = off)
    top_p: torch.Tensor         # [B] float
    generators: list[torch.Generator | None]
    any_sample: bool
    any_top_p: bool

    @staticmethod
    def stack(rows: list[RowSampling], device: torch.device) -> "BatchSampling":
        sample = [r.do_sample for r in rows]
        return BatchSampling(
            do_sample=to_device(sample, torch.bool, device),
            temperature=to_device([r.temperature if r.do_sample else 1.0 for r in rows], torch.float32, device),
            top_k=to_device([max(0, r.top_k) for r in rows], torch.long, device),
            top_p=to_device([r.top_p for r in rows], torch.float32, device),
            generators=[r.generator if r.do_sample else None for r in rows],
            any_sample=any(sample),
            any_top_p=any(r.do_sample and r.top_p < 1.0 for r in rows),
        )


def to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small host list as a device tensor without a host sync: `torch.tensor(..., device="cuda")`
    copies synchronously (waits for all queued GPU work); a pinned staging copy does not."""
    host = torch.tensor(values, dtype=dtype)
    if torch.device(device).type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def _filter_top_k(scores: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    vocab = scores.shape[-1]
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
    kth = scores.sort(dim=-1, descending=True).values.gather(-1, (k - 1).unsqueeze(-1))
    return scores.masked_fill(scores < kth, float("-inf"))


def _filter_top_p(scores: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    sorted_scores, order = scores.sort(dim=-1)
    cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
    remove = cumulative <= (1 - top_p).unsqueeze(-1)
    remove[..., -1] = False
    return scores.masked_fill(remove.scatter(-1, order, remove), float("-inf"))


def _exponential_noise(shape: torch.Size, generators: list[torch.Generator | None],
                       device: torch.device) -> torch.Tensor:
    noise = torch.empty(shape, device=device).exponential_()
    for row, gen in enumerate(generators):
        if gen is not None:
            noise[row].exponential_(generator=gen)
    return noise


def draw_noise(shape: tuple[int, ...], generators: list[torch.Generator | None], device: torch.device,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """Exp(1) noise [B, ...] for `sample(..., noise=)`: rows with a generator draw from it (seeded
    requests reproduce whatever they are batched with), the rest from the default generator. `out`
    (a preallocated buffer, e.g. a CUDA graph's static input) is filled in place."""
    noise = out if out is not None else torch.empty(shape, device=device)
    noise.exponential_()
    for row, gen in enumerate(generators):
        if gen is not None:
            noise[row].exponential_(generator=gen)
    return noise


def sample(logits: torch.Tensor, params: BatchSampling, noise: torch.Tensor | None = None) -> torch.Tensor:
    """logits [B, V] -> token ids [B]; greedy rows take the argmax of the raw logits.

    `noise` [B, V] (Exp(1), see `draw_noise`) is drawn here when not given; passing it makes the
    function free of host-side work, so it can run inside a captured CUDA graph.
    """
    if noise is None and params.any_sample:
        noise = _exponential_noise(logits.shape, params.generators, logits.device)
    return sample_rows(logits, params.do_sample, params.temperature, params.top_k, params.top_p, noise,
                       params.any_sample, params.any_top_p)


def sample_rows(logits: torch.Tensor, do_sample: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                top_p: torch.Tensor, noise: torch.Tensor | None, any_sample: bool, any_top_p: bool) -> torch.Tensor:
    """`sample` on plain tensors (what a compiled function can take); `noise` is needed when sampling."""
    greedy = logits.argmax(dim=-1)
    if not any_sample:
        return greedy
    scores = logits.float() / temperature.unsqueeze(-1)
    scores = _filter_top_k(scores, top_k)
    if any_top_p:
        scores = _filter_top_p(scores, top_p)
    probs = scores.softmax(dim=-1)
    # Exponential race: argmax(p / E), E ~ Exp(1), draws exactly from p and lets each row use its own
    # generator without a per-row multinomial call.
    drawn = (probs / noise).argmax(dim=-1)
    return torch.where(do_sample, drawn, greedy)
