"""Microbenchmarks of the two launch-heavy pieces outside vLLM: the code predictor (eager vs CUDA
graphs, per batch) and the Code2Wav decoder (per batch x chunk length, eager vs a captured graph).

Runs on random weights in the released shapes (no checkpoint, no vLLM). Prints a table and writes
JSON to --out. On CPU it runs tiny shapes only (a smoke test of the script itself).

    python scripts/gpu_microbench.py --out /tmp/micro.json
    python scripts/gpu_microbench.py --gemv --shapes 1.7b --batches 1,4,16 --predictor-variants compiled,gemv \
        --skip-decoder --out /tmp/gemv.json     # every small product, cuBLAS vs our matrix-vector kernel, then the graph
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tts_engine.models.qwen3_tts.code_predictor import CodePredictor  # noqa: E402
from tts_engine.models.qwen3_tts.codec_decoder import Code2WavConfig, Code2WavDecoder, DecoderStateTable, SnakeBeta  # noqa: E402
from tts_engine.models.qwen3_tts.config import _read_talker, _Reader  # noqa: E402
from tts_engine.models.qwen3_tts.sampling import BatchSampling, RowSampling  # noqa: E402
from tts_engine.tools.demo_checkpoint import _full_decoder_config, demo_config, full_config  # noqa: E402


def timed(fn, device, reps: int = 20, warmup: int = 3) -> float:
    """Median wall ms of fn() with a device sync after each call (what a caller waiting on it sees)."""
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


PREDICTOR_VARIANTS = ("graph", "compiled", "autotuned", "gemv", "gemv-everywhere", "fused-sampler")


def predictor_bench(shape: str, device, dtype, batches, results: list, variants=PREDICTOR_VARIANTS,
                    kernel_top: int = 12) -> None:
    cfg = full_config("custom_voice", shape) if shape != "tiny" else demo_config("custom_voice", "0b6")
    talker = _read_talker(_Reader(cfg["talker_config"], Path("talker_config")))
    torch.manual_seed(0)
    with torch.device(device):
        predictor = CodePredictor(talker).to(dtype).eval().requires_grad_(False)
    h = talker.shape.hidden_size
    inputs = {}
    for b in batches:
        hidden = torch.randn(b, h, device=device, dtype=dtype)
        c0 = torch.randn(b, h, device=device, dtype=dtype)
        sampled = BatchSampling.stack([RowSampling(True, 0.9, 50, 1.0) for _ in range(b)], device)
        greedy = BatchSampling.stack([RowSampling(False) for _ in range(b)], device)
        inputs[b] = (hidden, c0, sampled, greedy)
    rows = {b: {"what": "predictor", "shape": shape, "batch": b} for b in batches}
    predictor.graphs = None
    with torch.inference_mode():
        for b, (hidden, c0, sampled, greedy) in inputs.items():
            rows[b]["eager_ms"] = round(timed(lambda: predictor.predict(hidden, c0, sampled), device), 3)
            rows[b]["_greedy"] = predictor.predict(hidden, c0, greedy)[0]
    if device.type == "cuda":
        # Inductor's default vs autotuned kernels (Triton GEMM templates tried against cuBLAS for these
        # small-M shapes, whose cuBLAS kernels were 52% of a frame's GPU time, BENCHMARKS "fourth pass").
        # Tried and dropped after measuring here (BENCHMARKS "fifth pass"): the top-k by `torch.topk`
        # instead of a full sort, and the cache attention as products and sums instead of SDPA; (seventeenth pass)
        # the cache attention as one Triton kernel a layer (45b58a3, reverted: slower than cuDNN's at every batch).
        # `gemv`: compiled, with the small products by the Triton matrix-vector kernel (`gemv.py`), sampling by PyTorch's
        # sort and Inductor's kernels; `fused-sampler`: the engine's default, `gemv` with the one-kernel sampler
        # (`top_k_sampler.py`). The others sample as `gemv` does.
        drawn: dict[str, dict[int, torch.Tensor]] = defaultdict(dict)
        for label, compile, mode in (("graph_ms", False, None), ("compiled_graph_ms", True, None),
                                     ("autotuned_graph_ms", True, "max-autotune-no-cudagraphs"),
                                     ("gemv_graph_ms", True, None), ("gemv_everywhere_graph_ms", True, None),
                                     ("fused_sampler_graph_ms", True, None)):
            if label.removesuffix("_graph_ms").removesuffix("_ms").replace("_", "-") not in variants:
                continue
            torch._dynamo.reset()
            # `gemv`: the smallest bucket's o_proj and input projection by the kernel; `compiled` without it;
            # `gemv-everywhere`: every bucket's graph from the step with those products as the custom op
            predictor.small_gemv = label.startswith(("gemv", "fused_sampler"))
            predictor.fused_sampler = label.startswith("fused_sampler")
            t = time.perf_counter()
            predictor.enable_cuda_graphs(max(batches), warmup=False, compile=compile, compile_mode=mode)
            predictor.graphs.small_everywhere = label == "gemv_everywhere_graph_ms"
            predictor.graphs.capture_all()
            torch.cuda.synchronize()
            setup = round(time.perf_counter() - t, 2)
            with torch.inference_mode():
                for b, (hidden, c0, sampled, greedy) in inputs.items():
                    rows[b][label] = round(timed(lambda: predictor.predict(hidden, c0, sampled), device), 3)
                    rows[b].update(_kernel_split(label, lambda: predictor.predict(hidden, c0, sampled), top=kernel_top))
                    rows[b][label.replace("_ms", "_setup_s")] = setup
                    codes = predictor.predict(hidden, c0, greedy)[0]
                    rows[b][label.replace("_ms", "_greedy_equal")] = bool(torch.equal(codes, rows[b]["_greedy"]))
                    torch.manual_seed(1)           # the same noise for every variant: sampled codes to compare
                    drawn[label][b] = predictor.predict(hidden, c0, sampled)[0]
            if compile:
                rows[max(batches)][label.replace("_ms", "_compiled")] = predictor.graphs.compiled
            print(json.dumps({"shape": shape, "variant": label, "setup_s": setup,   # progress, in case of a timeout
                              "ms_by_batch": {b: rows[b][label] for b in batches}}), flush=True)
        if drawn["gemv_graph_ms"] and drawn["fused_sampler_graph_ms"]:
            # the two differ only in how they sample, so the same noise must draw the same codes
            for b in batches:
                same = drawn["gemv_graph_ms"][b] == drawn["fused_sampler_graph_ms"][b]
                rows[b]["fused_sampler_same_codes"] = round(float(same.float().mean()), 4)
    for b in batches:
        rows[b].pop("_greedy")
        results.append(rows[b])
        print(json.dumps(rows[b]), flush=True)


def _kernel_split(label: str, fn, reps: int = 10, top: int = 12) -> dict:
    """Kernels a call, their summed time and the GPU's busy time over the call's kernel window: the
    window minus busy is the time between kernels (graph hand-overs, launches), which no kernel fusion
    inside a kernel shortens."""
    from torch.profiler import ProfilerActivity, profile

    from tts_engine.tools.kernel_profile import kernels_of, summarize

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    summary = summarize([kernels_of(prof)], frames=reps, top=top)   # the reps as one span, per call
    if not summary["kernels"]:
        return {}
    base = label.replace("_ms", "")
    return {f"{base}_kernels": summary["kernels_per_frame"], f"{base}_kernel_ms": summary["kernel_ms_per_frame"],
            f"{base}_busy_ms": summary["busy_ms_per_frame"], f"{base}_window_ms": summary["window_ms_per_frame"],
            f"{base}_top": [(k["kernel"][:60], k["ms_per_frame"], k["per_frame"]) for k in summary["top"]]}


def full_decoder(device, shape: str = "full") -> Code2WavDecoder:
    """The released decoder's shapes (or a tiny one) on random weights, in eval mode on `device`."""
    cfg = Code2WavConfig.from_dict(_full_decoder_config() if shape != "tiny" else
                                   {**_full_decoder_config(), "codebook_dim": 16, "latent_dim": 32, "hidden_size": 32,
                                    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                                    "num_key_value_heads": 2, "head_dim": 16, "decoder_dim": 64})
    torch.manual_seed(0)
    decoder = Code2WavDecoder(cfg)
    with torch.no_grad():
        for name, p in decoder.named_parameters():
            if name.endswith("embedding_sum"):
                p.normal_()
            elif name.endswith(("alpha", "beta")):
                p.normal_(0, 0.3)
    decoder.quantizer.refresh_codebooks()
    return decoder.to(device).eval().requires_grad_(False)


def decoder_bench(shape: str, device, cases, results: list, tf32: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    decoder = full_decoder(device, shape)
    for b, n in cases:
        codes = torch.randint(0, 2048, (b, n, 16), device=device)
        state = decoder.new_stream_state(b)
        ms = timed(lambda: decoder.decode_step(state, codes), device, reps=10)
        row = {"what": "decoder", "shape": shape, "batch": b, "frames": n, "tf32": tf32, "eager_ms": round(ms, 3),
               "ms_per_audio_s": round(ms / (b * n * 0.08), 3)}
        if device.type == "cuda":
            row["graph_ms"] = round(_decoder_graph_ms(decoder, b, n, device), 3)
            SnakeBeta.cache_scales = False      # the activations' weight-only math in every step, as before
            try:
                row["graph_ms_snake_uncached"] = round(_decoder_graph_ms(decoder, b, n, device), 3)
            finally:
                SnakeBeta.cache_scales = True
        results.append(row)
        print(json.dumps(row), flush=True)


def _decoder_graph_ms(decoder: Code2WavDecoder, b: int, n: int, device) -> float:
    """What a captured graph of one decode step would cost (static state in, new state out)."""
    codes = torch.randint(0, 2048, (b, n, 16), device=device)
    state = decoder.new_stream_state(b)
    with torch.inference_mode():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                decoder._run(codes, state)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            decoder._run(codes, state)
        return timed(graph.replay, device, reps=20)


# (N, K) of the code predictor's products at 1.7B (q/k/v, o, gate/up, down, a codebook's head, the input projection)
# and of the talker's (q/k/v, o, gate/up, down), for the matrix-vector kernel against cuBLAS
GEMV_SHAPES = {"predictor": [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072), (2048, 1024), (1024, 2048)],
               "talker": [(4096, 2048), (2048, 2048), (12288, 2048), (2048, 6144)]}


def _graph_us(product, weights: list, reps: int) -> float:
    """Microseconds a `product(weight)` inside one CUDA graph of a product per weight, replayed `reps` times."""
    outs = [product(w) for w in weights[:2]]        # compiles and warms outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [product(w) for w in weights]
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    del outs, graph
    return round(1000 * start.elapsed_time(end) / reps / len(weights), 2)


def gemv_bench(device, results: list, rows_list=(2, 4, 8), reps: int = 20) -> None:
    """Each product of `GEMV_SHAPES` at 2-8 rows: cuBLAS (`F.linear`) against the Triton matrix-vector kernel in
    every (block_n, block_k, warps) tried, as microseconds a product inside a CUDA graph (how the predictor runs
    them), over enough distinct weights (>= 256 MB) that they are read from memory, not the 60 MB L2 cache; and each
    result's largest difference from a float32 product beside cuBLAS's."""
    from tts_engine.models.qwen3_tts import gemv as kernel
    from tts_engine.models.qwen3_tts.gemv import gemv

    configs = [(bn, bk, w) for bn in (4, 8, 16) for bk in (128, 256, 512) for w in (2, 4)]
    for model, shapes in GEMV_SHAPES.items():
        for n, k in dict.fromkeys(shapes):
            copies = max(8, (256 << 20) // (n * k * 2))
            weights = [torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
            for rows in rows_list:
                x = torch.randn(rows, k, device=device, dtype=torch.bfloat16)
                exact = x.float() @ weights[0].float().T
                row = {"what": "gemv", "model": model, "n": n, "k": k, "rows": rows, "weights_mb": n * k * 2 / 2**20}
                row["cublas_us"] = _graph_us(lambda w: F.linear(x, w), weights, reps)
                row["cublas_err"] = float((F.linear(x, weights[0]).float() - exact).abs().max())
                tried = {}
                for config in configs:
                    try:
                        tried["%dx%dx%d" % config] = _graph_us(lambda w: gemv(x, w, config=config), weights, reps)
                    except Exception as exc:      # a config Triton cannot build (registers, shared memory)
                        tried["%dx%dx%d" % config] = str(exc)[:80]
                timings = {c: t for c, t in tried.items() if isinstance(t, float)}
                best = min(timings, key=timings.get)
                row.update(gemv_best=best, gemv_us=timings[best], gemv_tried=tried,
                           gemv_err=float((gemv(x, weights[0], config=tuple(map(int, best.split("x")))).float()
                                           - exact).abs().max()))
                print(json.dumps({k: v for k, v in row.items() if k != "gemv_tried"}), flush=True)
                results.append(row)
                if rows == 2:      # one stream's rows: the config the predictor variant `gemv` then runs with
                    kernel.CONFIGS[f"{n}x{k}"] = tuple(map(int, best.split("x")))
    print(json.dumps({"gemv_configs": {c: list(v) for c, v in kernel.CONFIGS.items()}}), flush=True)


def sampler_bench(device, results: list, vocab: int = 2048, reps: int = 50) -> None:
    """The one-kernel top-k sampler (`top_k_sampler.py`) per launch at 1-64 rows and 1-8 warps a row, against
    `sample_rows` (PyTorch's sort and kernels, not fused), both inside a CUDA graph; and whether they draw the same."""
    from tts_engine.models.qwen3_tts import top_k_sampler
    from tts_engine.models.qwen3_tts.sampling import sample_rows

    for rows in (1, 2, 16, 64):
        logits = [torch.randn(rows, vocab, device=device, dtype=torch.bfloat16) * 4 for _ in range(8)]
        noise = torch.empty(rows, vocab, device=device).exponential_()
        do_sample = torch.ones(rows, dtype=torch.bool, device=device)
        temperature = torch.full((rows,), 0.9, device=device)
        top_k = torch.full((rows,), 50, dtype=torch.long, device=device)
        row = {"what": "sampler", "rows": rows, "vocab": vocab}
        row["sample_rows_us"] = _graph_us(lambda x: sample_rows(x, do_sample, temperature, top_k, None, noise, True,
                                                                False), logits, reps)
        for warps in (1, 2, 4, 8):
            row[f"kernel_w{warps}_us"] = _graph_us(
                lambda x: top_k_sampler.launch(x, do_sample, temperature, top_k, noise, warps), logits, reps)
        row["same_codes"] = all(torch.equal(top_k_sampler.launch(x, do_sample, temperature, top_k, noise),
                                            sample_rows(x, do_sample, temperature, top_k, None, noise, True, False))
                                for x in logits)
        results.append(row)
        print(json.dumps(row), flush=True)


def state_table_bench(decoder: Code2WavDecoder, device, results: list, streams: int = 64, reps: int = 5) -> None:
    """What opening a burst of streams on Stage 1's state table costs, with `open` setting each row at once (eager)
    and with rows set together at the next read (lazy, `DecoderStateTable.settle`): host ms of the opens and the
    settle while the GPU is still busy with earlier work (`busy_ms` of it: a host time near that means something
    waited for the GPU), ms until the GPU is idle, and how many new device segments (cudaMalloc calls) it took.
    Every row is dirtied first, so `rows_fresh` checks that the opened rows read as a new stream's state."""
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    segments = (lambda: torch.cuda.memory_stats().get("segment.all.allocated", 0)) if cuda else (lambda: 0)
    busy = torch.randn(4096 if cuda else 256, 4096 if cuda else 256, device=device)

    def occupy() -> None:                       # queue ~20 ms of GPU work (on CPU: do a little work)
        for _ in range(12):
            busy @ busy

    for lazy in (False, True):
        table = DecoderStateTable(decoder, capacity=2 * streams)
        table.lazy_open = lazy
        for rep in range(reps):
            with torch.inference_mode():
                for b in [*table.buffers, table.positions]:
                    b.fill_(1)
            sync()
            before = segments()
            t_busy = time.perf_counter()
            occupy()
            sync()
            busy_ms = (time.perf_counter() - t_busy) * 1e3
            occupy()
            t = time.perf_counter()
            slots = [table.open() for _ in range(streams)]
            table.settle()
            host_ms = (time.perf_counter() - t) * 1e3
            sync()
            idle_ms = (time.perf_counter() - t) * 1e3
            fresh = all(torch.equal(b[slots], init.expand(streams, *init.shape[1:]))
                        for b, init in zip([*table.buffers, table.positions],
                                           [*table._initial.buffers, table._initial.positions]))
            for slot in slots:
                table.close(slot)
            row = {"what": "state table opens", "lazy": lazy, "streams": streams, "rep": rep, "busy_ms": round(busy_ms, 2),
                   "host_ms": round(host_ms, 3), "to_idle_ms": round(idle_ms, 3), "new_segments": segments() - before,
                   "rows_fresh": fresh}
            results.append(row)
            print(json.dumps(row), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="micro.json")
    ap.add_argument("--skip-decoder", action="store_true")
    ap.add_argument("--state-table", action="store_true", help="only the state table's opens, eager vs lazy (GPU)")
    ap.add_argument("--gemv", action="store_true", help="only the small products: cuBLAS vs the Triton kernel (GPU)")
    ap.add_argument("--sampler", action="store_true", help="the one-kernel sampler first, per launch (GPU)")
    ap.add_argument("--kernel-top", type=int, default=12,
                    help="how many kinds of a predictor graph's kernels (by time) a row lists (100: all, to plan fusions)")
    ap.add_argument("--shapes", default="0.6b,1.7b", help="predictor shapes on the GPU")
    ap.add_argument("--batches", default="1,4,16,64", help="predictor batch sizes on the GPU")
    ap.add_argument("--predictor-variants", default=",".join(PREDICTOR_VARIANTS),
                    help=f"which of {', '.join(PREDICTOR_VARIANTS)}")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    results: list = []
    if device.type == "cuda":
        print(torch.cuda.get_device_name(), torch.__version__, flush=True)
        if args.state_table:
            state_table_bench(full_decoder(device), device, results)
            Path(args.out).write_text(json.dumps(results, indent=1))
            return
        if args.gemv:
            gemv_bench(device, results)
            Path(args.out).write_text(json.dumps(results, indent=1))
        if args.sampler:
            sampler_bench(device, results)
        batches = tuple(int(b) for b in args.batches.split(","))
        for shape in args.shapes.split(","):
            predictor_bench(shape, device, torch.bfloat16, batches, results, args.predictor_variants.split(","),
                            args.kernel_top)
        if not args.skip_decoder:
            cases = [(1, 1), (1, 4), (1, 25), (16, 1), (16, 25), (64, 25)]
            decoder_bench("full", device, cases, results, True)
    else:
        predictor_bench("tiny", device, torch.float32, (1, 4), results)
        decoder_bench("tiny", device, [(1, 1), (2, 4)], results, False)
        state_table_bench(full_decoder(device, "tiny"), device, results, streams=4, reps=1)
    Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
