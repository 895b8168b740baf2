"""The code predictor's one-kernel top-k sampler (`top_k_sampler.py`), checked on the CPU through Triton's interpreter.

The kernel runs in a subprocess with TRITON_INTERPRET=1 (Triton reads it when a kernel is defined). It must draw what
`sample_rows` draws from the same noise: rows of float32 and bf16 logits, vocabularies that are not powers of two,
ties at the k-th value (integer logits), all-negative rows, k of 0 (off), 1, and above the vocabulary, greedy rows.
Drawing the same code from random noise could hide a wrong threshold, so every row without a tie there is also
drawn with noise that favours the k-th and, more, the (k+1)-th largest logits: the k-th must be drawn. In this
process: the op's CPU path, the predictor step that uses it under torch.compile, and the capture's fallbacks when
a kernel fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tts_engine.models.qwen3_tts import top_k_sampler
from tts_engine.models.qwen3_tts.sampling import sample_rows

pytestmark = pytest.mark.skipif(top_k_sampler.triton is None, reason="Triton is not installed")

KERNEL_CHECK = r"""
import torch
from tts_engine.models.qwen3_tts.top_k_sampler import launch
from tts_engine.models.qwen3_tts.sampling import sample_rows
torch.manual_seed(0)
checked = 0
for vocab in (2048, 100, 37):
    for dtype in (torch.float32, torch.bfloat16):
        for kind in ("normal", "ties", "negative"):
            rows = 8
            if kind == "ties":
                logits = torch.randint(-3, 4, (rows, vocab)).to(dtype)
            elif kind == "negative":
                logits = (-torch.rand(rows, vocab) * 5 - 1).to(dtype)
            else:
                logits = (torch.randn(rows, vocab) * 3).to(dtype)
            ks = [50, 0, 1, vocab + 7, 3, vocab, 17, 2]
            top_k = torch.tensor(ks)
            do_sample = torch.tensor([r != 6 for r in range(rows)])
            temperature = torch.tensor([0.5 + 0.2 * r for r in range(rows)])
            noise = torch.empty(rows, 3, vocab).exponential_()[:, 1]           # a strided view, as the step's
            got = launch(logits, do_sample, temperature, top_k, noise)
            want = sample_rows(logits, do_sample, temperature, top_k, None, noise, True, False)
            assert torch.equal(got, want), (vocab, dtype, kind, got, want)
            if kind != "ties":       # pin the threshold: tiny noise on the k-th and, tinier, the (k+1)-th
                order = logits.float().argsort(dim=-1, descending=True, stable=True)
                pinned = torch.ones(rows, vocab)
                split = [0 < k < vocab and logits[r, order[r, k - 1]] > logits[r, order[r, k]] for r, k in enumerate(ks)]
                for r, k in enumerate(ks):
                    if split[r]:
                        pinned[r, order[r, k - 1]] = 1e-20
                        pinned[r, order[r, k]] = 1e-30
                got = launch(logits, torch.ones(rows, dtype=torch.bool), temperature, top_k, pinned)
                assert torch.equal(got, sample_rows(logits, torch.ones(rows, dtype=torch.bool), temperature, top_k,
                                                    None, pinned, True, False)), (vocab, dtype, kind)
                for r, k in enumerate(ks):
                    if split[r]:       # (a tie at the k-th keeps both: sample_rows says which is drawn)
                        assert got[r] == order[r, k - 1], (vocab, dtype, kind, r, k)
            checked += 1
try:
    launch(torch.zeros(4, 2).T, torch.ones(2, dtype=torch.bool), torch.ones(2), torch.zeros(2, dtype=torch.long),
           torch.ones(2, 4))
    raise SystemExit("logits with strided rows were taken")
except ValueError:
    pass
print("ok", checked)
"""


def test_the_kernel_draws_what_sample_rows_draws():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-c", KERNEL_CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok 18", done.stderr[-3000:]


def test_the_op_on_the_cpu_is_sample_rows():
    torch.manual_seed(1)
    logits = torch.randn(4, 64)
    noise = torch.empty(4, 64).exponential_()
    args = (torch.tensor([True, True, False, True]), torch.tensor([0.9, 0.5, 1.0, 1.3]), torch.tensor([5, 0, 5, 1]))
    got = top_k_sampler.sample_top_k(logits, *args, noise)
    assert torch.equal(got, sample_rows(logits, *args, None, noise, True, False))


def test_the_compiled_step_with_the_sampler_computes_what_the_plain_step_does():
    """The predictor's step through `sample_top_k` under torch.compile gives the step without it bit for bit on the
    CPU (where the op is `sample_rows`): the op's plumbing (its fake for the compiler, its arguments) is right."""
    from tests.test_fast_paths import fused_predictor_inputs

    predictor, args, positions = fused_predictor_inputs("1b7")
    predictor._fuse_projections()
    with torch.inference_mode():
        predictor.fused_sampler = False
        plain = predictor.predict_fused(predictor._fused_step, *args, positions)
        predictor.fused_sampler = True
        step = torch.compile(predictor._fused_step, fullgraph=True, backend="aot_eager")
        fused = predictor.predict_fused(step, *args, positions)
    assert torch.equal(fused[0], plain[0]) and torch.equal(fused[1], plain[1])


def test_a_graph_whose_kernels_fail_is_captured_without_them(monkeypatch):
    """If the compiled step fails to capture with our Triton kernels (a GPU where Triton cannot build them), the
    predictor's graph is captured again without the matrix-vector kernel, then without the sampling kernel, and only
    then from the plain loop. A failure that is not a kernel's (the second case) also switches the sampler off on the
    way: the capture cannot tell which part failed."""
    from types import SimpleNamespace

    from tts_engine.models.qwen3_tts.code_predictor import PredictorGraphs

    def graphs_failing_while(failing):
        attempts = []
        predictor = SimpleNamespace(small_gemv=True, fused_sampler=True)
        graphs = object.__new__(PredictorGraphs)
        graphs.predictor, graphs.step_fn, graphs.compiled, graphs._graphs = predictor, object(), False, {}
        graphs.buckets, graphs.small_everywhere, graphs.positions = [2, 4], False, []
        graphs.hidden = graphs.c0_embed = graphs.noise = torch.zeros(4, 1)
        graphs.do_sample = graphs.temperature = graphs.top_k = graphs.top_p = torch.zeros(4)

        def capture(run):
            attempt = (predictor.small_gemv, predictor.fused_sampler, graphs.step_fn is not None)
            attempts.append(attempt)
            if failing(*attempt):
                raise RuntimeError("triton: out of resources")
            return "graph", "codes", "embed"
        monkeypatch.setattr(graphs, "_capture", capture)
        return graphs, attempts

    graphs, attempts = graphs_failing_while(lambda small, sampler, compiled: small or sampler)
    graphs.capture(2, True, False)
    assert attempts == [(True, True, True), (False, True, True), (False, False, True)]
    assert graphs.compiled and graphs.step_fn is not None and (2, True, False) in graphs._graphs

    graphs, attempts = graphs_failing_while(lambda small, sampler, compiled: compiled)
    graphs.capture(4, True, False)          # a bucket without the matrix-vector kernel: it is not switched off
    assert attempts == [(True, True, True), (True, False, True), (True, False, False)]
    assert not graphs.compiled and graphs.step_fn is None and (4, True, False) in graphs._graphs
