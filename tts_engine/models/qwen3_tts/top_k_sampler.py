"""Top-k sampling of a code predictor step as one kernel: a row's whole vocabulary in one program.

Why: `sampling.sample_rows` finds each row's k-th largest score by sorting the whole row, since every row has its
own k. Inside the compiled predictor step that sort is not fused: it runs as PyTorch's radix sort, 21 us of the
H200's time per step at one stream (15 launches a frame, a tenth of the predictor's kernel time: the sixteenth
pass's kernel table in BENCHMARKS.md), plus the kernels around it (temperature, mask, softmax, the draw).
A codebook has 2048 entries, which fit in one program's registers, so here one program per row loads the row once,
finds its k-th largest logit by a radix select on the logits' bits (16 passes of a compare and a count for bf16:
a bitonic sort of the row in registers took 29 us, longer than the sort it replaced), and does the rest of the
filter chain and the exponential-race draw there: one launch of ~6 us for the whole sampling of a step (H200,
BENCHMARKS.md seventeenth pass; `sample_rows` unfused: 59-77 us).

The filters and the draw are `sample_rows`'s (temperature -> top-k -> softmax -> argmax(p / E)) with its
`any_sample=True, any_top_p=False` (the compiled step's variant). `sample_top_k` is a custom op, so
`torch.compile` keeps it as one call in the compiled step and a CUDA graph captures its launch; on the CPU, or
without Triton, it is `sample_rows` itself. `CodePredictor.fused_sampler` decides whether the step uses it.
"""

from __future__ import annotations

import torch

from tts_engine.models.qwen3_tts.sampling import sample_rows

try:  # pragma: no cover - depends on the install (torch's Linux wheels bring Triton, CPU ones included)
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None


if triton is not None:
    @triton.jit
    def _sample_top_k_kernel(logits_ptr, noise_ptr, do_sample_ptr, temperature_ptr, top_k_ptr, out_ptr, vocab,
                             stride_logits, stride_noise, VOCAB_PAD: tl.constexpr, KEY_BITS: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, VOCAB_PAD)
        inside = cols < vocab
        raw = tl.load(logits_ptr + row * stride_logits + cols, mask=inside, other=float("-inf")).to(tl.float32)
        greedy = tl.argmax(raw, axis=0)
        # Radix select of the k-th largest raw logit: each logit's bits as an unsigned key in the floats' order
        # (negatives: every bit flipped; the rest: the sign bit set), then the key's bits from the top, keeping a
        # bit where at least k keys are at or above. bf16 logits need their 16 bits only (KEY_BITS).
        bits = raw.to(tl.uint32, bitcast=True) >> (32 - KEY_BITS)
        top_bit: tl.constexpr = 1 << (KEY_BITS - 1)
        every_bit: tl.constexpr = (1 << KEY_BITS) - 1
        keys = tl.where((bits & top_bit) != 0, bits ^ every_bit, bits | top_bit)
        k = tl.load(top_k_ptr + row).to(tl.int32)
        k = tl.where(k > 0, tl.minimum(k, vocab), vocab)
        kth_key = tl.zeros((), dtype=tl.uint32)
        for i in tl.static_range(KEY_BITS):
            candidate = kth_key | (1 << (KEY_BITS - 1 - i))
            above = tl.sum(((keys >= candidate) & inside).to(tl.int32), axis=0)
            kth_key = tl.where(above >= k, candidate, kth_key)
        kth_raw = tl.max(tl.where((keys == kth_key) & inside, raw, float("-inf")), axis=0)
        # Temperature is monotone, so the k-th largest score is the k-th largest logit over it, as a sort finds.
        temperature = tl.load(temperature_ptr + row)
        scores = raw / temperature
        kept = tl.where(scores < kth_raw / temperature, float("-inf"), scores)
        exp = tl.exp(kept - tl.max(kept, axis=0))
        probs = exp / tl.sum(exp, axis=0)
        noise = tl.load(noise_ptr + row * stride_noise + cols, mask=inside, other=1.0)
        drawn = tl.argmax(probs / noise, axis=0)
        sampled = tl.load(do_sample_ptr + row) != 0
        tl.store(out_ptr + row, tl.where(sampled, drawn, greedy).to(tl.int64))


WARPS = 4   # per row's program (one row of 2048 codes: 16 values a thread)


def launch(logits: torch.Tensor, do_sample: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
           noise: torch.Tensor, warps: int | None = None) -> torch.Tensor:
    """The kernel on logits [B, V] whatever the device Triton runs on (tests use its interpreter on the CPU)."""
    if triton is None:
        raise RuntimeError("Triton is not installed")
    if logits.stride(-1) != 1 or noise.stride(-1) != 1:
        raise ValueError("the kernel reads each row of logits and noise as contiguous")
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.long, device=logits.device)
    if rows:
        _sample_top_k_kernel[(rows,)](logits, noise, do_sample.contiguous(), temperature.contiguous(),
                                      top_k.contiguous(), out, vocab, logits.stride(0), noise.stride(0),
                                      VOCAB_PAD=triton.next_power_of_2(vocab),
                                      KEY_BITS=16 if logits.dtype in (torch.bfloat16, torch.float16) else 32,
                                      num_warps=warps or WARPS)
    return out


@torch.library.custom_op("tts::sample_top_k", mutates_args=())
def sample_top_k(logits: torch.Tensor, do_sample: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                 noise: torch.Tensor) -> torch.Tensor:
    """`sample_rows(logits, ..., top_p=None, noise, any_sample=True, any_top_p=False)`; one kernel on CUDA."""
    if triton is not None and logits.is_cuda:
        return launch(logits, do_sample, temperature, top_k, noise)
    return sample_rows(logits, do_sample, temperature, top_k, None, noise, True, False)


@sample_top_k.register_fake
def _(logits: torch.Tensor, do_sample: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
      noise: torch.Tensor) -> torch.Tensor:
    return logits.new_empty(logits.shape[0], dtype=torch.long)
