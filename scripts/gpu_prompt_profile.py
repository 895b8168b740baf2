"""Where a prompt build's host time goes on the GPU machine (issue "real time under load", closed 64).

At closed 64 a build takes 17-21 ms at the median and ~2 ms when builds run one at a time (BENCHMARKS.md, twelfth
pass), against ~0.3 ms of host work on a CPU machine. This times builds of the bench's texts on an idle engine: one
thread (p50, p95), under cProfile (the calls that took the host's time), and 64 at once on 20 threads (a burst's
builds alone, without the stages stepping). A tiny random checkpoint on the GPU, eager talker: the host calls of a
build are the same for every shape. Results: JSON and the profile text under --out.

    python3 scripts/gpu_prompt_profile.py --out $OUT
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tts_engine import TTSEngine
from tts_engine.tools.bench import TEXTS
from tts_engine.tools.demo_checkpoint import build_demo_checkpoint


def timed_builds(engine, inputs, count: int) -> list[float]:
    times = []
    for i in range(count):
        started = time.perf_counter()
        engine.prompts.build(inputs[i % len(inputs)]).wait_for_prefill()
        times.append(time.perf_counter() - started)
    return times


def ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(1000 * ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))], 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--checkpoint", type=Path, default=Path("/tmp/ckpt/tts_prompt_profile_tiny"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    folder = build_demo_checkpoint(args.checkpoint, "custom_voice", progress=False)
    started = time.perf_counter()
    engine = TTSEngine.from_pretrained(folder, "configs/qwen3_tts.yaml", enforce_eager=True, max_num_seqs=8,
                                       gpu_memory_utilization=0.1)
    result: dict = {"engine_start_s": round(time.perf_counter() - started, 1)}
    speaker = engine.config.supported_speakers[0]
    try:
        for streaming in (False, True):
            from tts_engine import SpeechRequest
            inputs = [engine._prompt_inputs(SpeechRequest(text=t, speaker=speaker, language="english",
                                                          non_streaming_mode=not streaming))[0] for t in TEXTS]
            mode = "streaming" if streaming else "non_streaming"
            timed_builds(engine, inputs, 60)                       # the caches and the host allocator warm
            alone = timed_builds(engine, inputs, 500)
            profile = cProfile.Profile()
            profile.enable()
            timed_builds(engine, inputs, 300)
            profile.disable()
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(30)
            (args.out / f"prompt_profile_{mode}.txt").write_text(text.getvalue())
            with ThreadPoolExecutor(20) as pool:
                burst = list(pool.map(lambda i: timed_builds(engine, [inputs[i % len(inputs)]], 1)[0], range(64)))
            result[mode] = {"alone_ms_p50": ms(alone, 50), "alone_ms_p95": ms(alone, 95),
                            "alone_ms_mean": round(1000 * statistics.fmean(alone), 3),
                            "burst_64_on_20_threads_ms_p50": ms(burst, 50), "burst_ms_p95": ms(burst, 95),
                            "prefill_rows": int(engine.prompts.build(inputs[0]).prefill.shape[0])}
            print(mode, json.dumps(result[mode]), flush=True)
            print("\n".join(text.getvalue().splitlines()[:45]), flush=True)
    finally:
        engine.close()
    (args.out / "prompt_profile.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
