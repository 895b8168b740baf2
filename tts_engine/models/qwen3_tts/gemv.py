"""A matrix-vector product for the few rows a code predictor step has at one or two streams.

Why: at one stream a frame is latency-bound on the code predictor's ~330 small matrix products (15 steps x 22), each
reading 4-12 MB of bf16 weights for 2-4 input rows. A product of so few rows is a weight read: every program here
reads a strip of `block_n` output rows of the weight once, in `block_k` pieces, and multiplies it by every input row in
registers (fp32 sums, as cuBLAS accumulates): one kernel, no split-K reduce pass, as many programs as strips.

Measured on the H200 against cuBLAS for every small product of the predictor and the talker (BENCHMARKS.md, sixteenth
pass), cuBLAS is faster for every weight but two: a codebook's head (2048 x 1024: 4.7 vs 4.4 us at 2 rows, too close
to matter, left to cuBLAS) and 1024 x 2048 (the predictor's o_proj and its input projection), which cuBLAS runs at 2-4
rows as split-K tiles plus a reduce, 13 us at 2 rows against this kernel's 6. So
`small_linear(x, weight, bias)` is `F.linear` except for the weights `TAKEN` names, on CUDA, at few rows. It is a
custom op, so `torch.compile` keeps it as one call inside the compiled predictor step and a CUDA graph captures its
launch; `CodePredictor.small_gemv` decides where the op is used at all. The sums run in another order than cuBLAS's,
so values differ in their last bits (the GPU path has no bit-exact reference: cuBLAS picks its kernel by shape too).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

MAX_ROWS = 8            # at most this many input rows take the kernel (when `TAKEN` is None: every weight)

try:  # pragma: no cover - depends on the install (torch's Linux wheels bring Triton, CPU ones included)
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None


if triton is not None:
    @triton.jit
    def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, rows, n, k, stride_x, stride_w, stride_y,
                     HAS_BIAS: tl.constexpr, ROWS_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        strip = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)        # this program's output features
        row = tl.arange(0, ROWS_PAD)
        acc = tl.zeros((ROWS_PAD, BLOCK_N), dtype=tl.float32)
        for start in range(0, k, BLOCK_K):
            cols = start + tl.arange(0, BLOCK_K)
            w = tl.load(w_ptr + strip[:, None] * stride_w + cols[None, :],
                        mask=(strip[:, None] < n) & (cols[None, :] < k), other=0.0).to(tl.float32)
            x = tl.load(x_ptr + row[:, None] * stride_x + cols[None, :],
                        mask=(row[:, None] < rows) & (cols[None, :] < k), other=0.0).to(tl.float32)
            acc += tl.sum(x[:, None, :] * w[None, :, :], axis=2)
        if HAS_BIAS:
            acc += tl.load(b_ptr + strip, mask=strip < n, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + row[:, None] * stride_y + strip[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=(row[:, None] < rows) & (strip[None, :] < n))


# (block_n, block_k, warps) by weight ("NxK"); the best of 18 tried on the H200 at 2 rows for every shape of the
# predictor and the talker was 4 x 512 with 2 warps (12288x2048: 8 x 512) (`gpu_microbench.py --gemv`)
CONFIGS: dict[str, tuple[int, int, int]] = {"default": (4, 512, 2)}


def config_for(n: int, k: int) -> tuple[int, int, int]:
    return CONFIGS.get(f"{n}x{k}", CONFIGS["default"])


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
         config: tuple[int, int, int] | None = None) -> torch.Tensor:
    """x [..., K] @ weight[N, K].T (+ bias) with the kernel, whatever the row count (tests, the microbench)."""
    if triton is None:
        raise RuntimeError("Triton is not installed")
    if weight.stride(-1) != 1:
        raise ValueError("the kernel reads the weight's rows as contiguous: pass weight.contiguous()")
    if bias is not None:
        bias = bias.contiguous()
    k = x.shape[-1]
    flat = x.reshape(-1, k)
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    rows, n = flat.shape[0], weight.shape[0]
    out = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    block_n, block_k, warps = config or config_for(n, k)
    pad = max(1, triton.next_power_of_2(rows))
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        flat, weight, bias if bias is not None else weight, out, rows, n, k, flat.stride(0), weight.stride(0),
        out.stride(0), HAS_BIAS=bias is not None, ROWS_PAD=pad, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps)
    return out.reshape(*x.shape[:-1], n)


# Which weights ("NxK") take the kernel, and up to how many rows; None: every weight, up to MAX_ROWS. Measured on the
# H200 (`gpu_microbench.py --gemv`, a product timed alone in a CUDA graph): cuBLAS reads the other shapes faster.
TAKEN: dict[str, int] | None = {"1024x2048": 4}


def row_limit(n: int, k: int) -> int:
    """The most input rows a product with an N x K weight may have to take the kernel (0: it never does)."""
    return MAX_ROWS if TAKEN is None else TAKEN.get(f"{n}x{k}", 0)


def takes_kernel(x: torch.Tensor, weight: torch.Tensor) -> bool:
    rows = x.numel() // max(1, x.shape[-1])
    return (triton is not None and x.is_cuda and rows <= row_limit(*weight.shape) and weight.stride(-1) == 1
            and weight.dtype == x.dtype)


@torch.library.custom_op("tts::small_linear", mutates_args=())
def small_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)`; by the kernel above on CUDA when x has at most `row_limit` rows for its weight."""
    if takes_kernel(x, weight):
        return gemv(x, weight, bias)
    return F.linear(x, weight, bias)


@small_linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], weight.shape[0])
