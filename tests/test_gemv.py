"""The code predictor's matrix-vector kernel (`gemv.py`), checked on the CPU through Triton's interpreter.

The kernel itself runs in a subprocess with TRITON_INTERPRET=1 (Triton reads it when a kernel is defined, and this
process may have imported the module without it): every row count up to `MAX_ROWS`, widths that are not multiples
of its blocks, with and without a bias, against a float64 product. In this process: which products take the kernel,
and that the predictor's step with `small` computes what it computes without it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tts_engine.models.qwen3_tts import gemv

pytestmark = pytest.mark.skipif(gemv.triton is None, reason="Triton is not installed")

KERNEL_CHECK = r"""
import torch
from tts_engine.models.qwen3_tts.gemv import gemv
torch.manual_seed(0)
worst = 0.0
for rows, n, k, bias, config in [(1, 40, 70, False, (8, 64, 4)), (2, 64, 256, True, (4, 128, 2)),
                                 (3, 17, 300, True, (4, 64, 2)), (8, 33, 129, False, (16, 32, 4)),
                                 (5, 8, 16, True, (8, 64, 2))]:
    for dtype, tolerance in ((torch.float32, 1e-4), (torch.bfloat16, 1 / 64)):
        x, w = torch.randn(rows, k).to(dtype), torch.randn(n, k).to(dtype)
        b = torch.randn(n).to(dtype) if bias else None
        got = gemv(x, w, b, config=config)
        assert got.shape == (rows, n) and got.dtype == dtype, (got.shape, got.dtype)
        want = x.double() @ w.double().T + (b.double() if bias else 0)
        error = float(((got.double() - want).abs() / want.abs().clamp(min=1)).max())
        assert error <= tolerance, (rows, n, k, bias, dtype, error)
three = torch.randn(2, 3, 48)        # leading dimensions are kept
w = torch.randn(24, 48)
assert torch.allclose(gemv(three, w, config=(8, 16, 2)), three @ w.T, atol=1e-4)
try:
    gemv(three, torch.randn(48, 24).T)
    raise SystemExit("a weight with strided rows was taken")
except ValueError:
    pass
print("ok")
"""


def test_the_kernel_computes_the_product_for_every_row_count():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-c", KERNEL_CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_only_named_weights_and_few_rows_take_the_kernel(monkeypatch):
    assert gemv.row_limit(1024, 2048) == 4                  # o_proj's and the input projection's shape
    assert gemv.row_limit(4096, 2048) == 0                  # a shape cuBLAS reads faster
    assert not gemv.takes_kernel(torch.zeros(1, 2, 2048), torch.zeros(1024, 2048))     # the CPU: always F.linear
    monkeypatch.setattr(gemv, "TAKEN", None)
    assert gemv.row_limit(4096, 2048) == gemv.MAX_ROWS


def test_the_small_step_computes_what_the_plain_step_does():
    """The predictor's step with `small` (products through the custom op) under torch.compile gives the plain
    step's codes and embeddings bit for bit on the CPU, where the op is `F.linear`: the op's plumbing (its fake
    for the compiler, the bias of the input projection) is right."""
    from tests.test_fast_paths import fused_predictor_inputs

    predictor, args, positions = fused_predictor_inputs("1b7")
    predictor._fuse_projections()
    with torch.inference_mode():
        plain = predictor.predict_fused(predictor._fused_step, *args, positions)
        step = torch.compile(predictor._fused_step, fullgraph=True, backend="aot_eager")
        small = predictor.predict_fused(step, *args, positions, True)
    assert torch.equal(small[0], plain[0]) and torch.equal(small[1], plain[1])


def test_only_the_steps_after_the_first_run_small():
    """`predict_fused(..., small=True)` asks for the small step in its 14 steps after the first only (the first
    step's two positions a row gain little from the kernel and would cost a compile of their own)."""
    from tests.test_fast_paths import fused_predictor_inputs

    predictor, args, positions = fused_predictor_inputs("0b6")
    predictor._fuse_projections()
    asked = []

    def step(*step_args):
        asked.append(step_args[-1])
        return predictor._fused_step(*step_args)

    with torch.inference_mode():
        predictor.predict_fused(step, *args, positions, True)
        predictor.predict_fused(step, *args, positions)
    assert asked == [False] + [True] * 14 + [False] * 15
