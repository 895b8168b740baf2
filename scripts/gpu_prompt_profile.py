"""Where the host time of a burst goes on the GPU machine (issue "real time under load", closed 64).

1. Prompt builds. At closed 64 a build takes 17-21 ms at the median and ~2 ms when builds run one at a time
(BENCHMARKS.md, twelfth pass). This times builds of the bench's texts on an idle engine: one thread (p50, p95), under
cProfile (the calls that took the host's time), 64 at once on 20 threads (a burst's builds alone, without the
stages stepping), and 64 in one `build_many` call (what batched submits do).
2. Stage 0's steps (`--burst N`): N requests of the bench's texts at once, with every `engine.step()` of the Stage 0
thread under cProfile (vLLM's scheduling and input preparation, our step hooks, the graphs' replays), so the
host-paced steps of a burst (31-41 ms of wall time for 10-19 ms of GPU work in the twelfth pass's burst profile) can
be read function by function. Needs the engine as served: `--shape 1.7b` (graphs, start-up warm-up; ~2.5 min to
start on the H200); the default tiny checkpoint with an eager talker serves part 1 (its build is the same host calls
for every shape).
3. The same burst with no profiler (`--burst N`, run before part 2, once per `--timeline-variants` entry): each Stage 0
step's and Stage 1 call's wall time beside its thread's CPU time, Stage 1's opens of the burst's streams (when, and
their wall and CPU time), and every thread's CPU time over the burst: whether the stages wait (for the interpreter,
the GPU) or work.

    python3 scripts/gpu_prompt_profile.py --out $OUT                       # part 1, ~1 min
    python3 scripts/gpu_prompt_profile.py --out $OUT --shape 1.7b --burst 64   # all three parts
Results: JSON and the profiles' text under --out.
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

import torch

from tts_engine import SpeechRequest, TTSEngine
from tts_engine.tools.bench import TEXTS, VARIANTS, apply_variant
from tts_engine.tools.demo_checkpoint import build_demo_checkpoint


def timed_builds(engine, inputs, count: int) -> list[float]:
    times = []
    for i in range(count):
        started = time.perf_counter()
        engine.prompts.build(inputs[i % len(inputs)]).wait_for_prefill()
        times.append(time.perf_counter() - started)
    return times


def stage0_burst(engine, speaker: str, burst: int, out: Path) -> dict:
    """Profile the Stage 0 thread's steps while `burst` requests of 8 frames start together (after a burst of 8
    unprofiled: the first shapes met)."""
    import asyncio

    profile, steps, on = cProfile.Profile(), [], [False]
    talker_engine = engine.talker.engine
    real_step = talker_engine.step

    def step():                       # runs on the Stage 0 thread: cProfile follows the thread that enables it
        if not on[0]:
            return real_step()
        started = time.perf_counter()
        profile.enable()
        try:
            return real_step()
        finally:
            profile.disable()
            steps.append(time.perf_counter() - started)

    async def run(n: int) -> None:
        async def one(i: int) -> None:
            request = SpeechRequest(text=TEXTS[i % len(TEXTS)], speaker=speaker, language="english",
                                    max_new_tokens=9, min_new_tokens=9)
            async for _ in engine.generate(request):
                pass
        await asyncio.gather(*(one(i) for i in range(n)))

    talker_engine.step = step
    try:
        asyncio.run(run(8))
        on[0] = True
        started = time.perf_counter()
        asyncio.run(run(burst))
        wall = time.perf_counter() - started
    finally:
        talker_engine.step = real_step
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(40)
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(40)
    (out / "stage0_burst_profile.txt").write_text(text.getvalue())
    print("\n".join(text.getvalue().splitlines()[:55]), flush=True)
    return {"burst": burst, "wall_s": round(wall, 3), "steps": len(steps),
            "step_ms_p50": ms(steps, 50), "step_ms_p95": ms(steps, 95), "step_ms_total": round(1000 * sum(steps), 1)}


def thread_cpu_s() -> dict[str, float]:
    """CPU seconds each live thread of this process has used, by name (ns resolution: the thread's CPU clock)."""
    import threading
    used: dict[str, float] = {}
    for thread in threading.enumerate():
        try:
            clock = time.pthread_getcpuclockid(thread.ident)
            name = "executor" if thread.name.startswith(("ThreadPoolExecutor", "asyncio_")) else thread.name
            used[name] = used.get(name, 0.0) + time.clock_gettime(clock)
        except (OSError, TypeError):     # a thread that ended meanwhile
            continue
    return used


def stage0_timeline(engine, speaker: str, burst: int) -> dict:
    """A burst of `burst` requests (8 frames) with no profiler: every Stage 0 step's wall time beside the CPU time
    of the Stage 0 thread in it (wall >> CPU: the thread waited for the interpreter or the GPU; wall ~ CPU: its own
    Python), the requests vLLM had waiting and running, when prompts were built and first chunks came, and each
    thread's CPU time over the burst (who held the interpreter)."""
    import asyncio

    talker_engine = engine.talker.engine
    scheduler = talker_engine.engine.engine_core.engine_core.scheduler
    pipeline = engine.pipeline
    real_step, real_build, real_round = talker_engine.step, engine.prompts.build_many, pipeline._decode_round
    real_take = pipeline._take
    steps, built, first_chunks, rounds, opens, t0 = [], [], [], [], [], [0.0]
    chunk_in: dict[str, float] = {}

    def step():
        waiting, running = len(scheduler.waiting), len(scheduler.running)
        began, cpu = time.perf_counter(), time.thread_time()
        try:
            return real_step()
        finally:
            steps.append((began - t0[0], time.perf_counter() - began, time.thread_time() - cpu, waiting, running))

    def decode_round():               # on the Stage 1 thread: one call's wall time beside the thread's CPU time
        began, cpu = time.perf_counter(), time.thread_time()
        try:
            return real_round()
        finally:
            rounds.append((began - t0[0], time.perf_counter() - began, time.thread_time() - cpu))

    def take(message):                # on the Stage 1 thread: a new stream's open (its state row set), timed;
        if message[0] == "chunk" and message[1] not in chunk_in:     # and when each stream's first chunk came in
            chunk_in[message[1]] = time.perf_counter() - t0[0]
        if message[0] != "open":
            return real_take(message)
        began, cpu = time.perf_counter(), time.thread_time()
        try:
            return real_take(message)
        finally:
            opens.append((began - t0[0], time.perf_counter() - began, time.thread_time() - cpu))

    def build(inputs):               # a call builds one prompt, or a batch of them (`batch_submits`)
        prompts = real_build(inputs)
        built.extend([time.perf_counter() - t0[0]] * len(inputs))
        return prompts

    async def run(n: int) -> dict[str, float]:
        """The burst; returns the threads' CPU times before the loop's executor threads are shut down."""
        async def one(i: int) -> None:
            request = SpeechRequest(text=TEXTS[i % len(TEXTS)], speaker=speaker, language="english",
                                    max_new_tokens=9, min_new_tokens=9)
            first = True
            async for _ in engine.generate(request):
                if first:
                    first_chunks.append(time.perf_counter() - t0[0])
                    first = False
        await asyncio.gather(*(one(i) for i in range(n)))
        return thread_cpu_s()

    talker_engine.step, engine.prompts.build_many, pipeline._decode_round = step, build, decode_round
    pipeline._take = take
    try:
        asyncio.run(run(8))
        for _ in range(2):                              # the second burst is the one kept (the first warms threads)
            steps.clear(), built.clear(), first_chunks.clear(), rounds.clear(), opens.clear(), chunk_in.clear()
            cpu_before = thread_cpu_s()             # the loop's executor threads are new in each run: 0 before
            t0[0] = time.perf_counter()
            cpu_after = asyncio.run(run(burst))
            wall = time.perf_counter() - t0[0]
    finally:
        talker_engine.step, engine.prompts.build_many, pipeline._decode_round = real_step, real_build, real_round
        pipeline._take = real_take
    first_chunks.sort()
    built.sort()
    in_window = [s for s in steps if s[0] <= first_chunks[-1]]
    calls = [r for r in rounds if r[0] <= first_chunks[-1] and r[1] > 0.0005]   # rounds that made a call
    return {
        "burst": burst, "wall_ms": round(1000 * wall, 1),
        "prompts_built_ms": [round(1000 * built[0], 1), round(1000 * built[-1], 1)],
        "first_chunk_ms_p50": round(1000 * first_chunks[len(first_chunks) // 2], 1),
        "first_chunk_ms_last": round(1000 * first_chunks[-1], 1),
        "stage0_steps_to_last_first_chunk": len(in_window),
        "stage0_step_wall_ms": round(1000 * sum(s[1] for s in in_window), 1),
        "stage0_step_cpu_ms": round(1000 * sum(s[2] for s in in_window), 1),
        "stage1_opens": len(opens),
        "stage1_opens_ms": [round(1000 * opens[0][0], 1), round(1000 * (opens[-1][0] + opens[-1][1]), 1)] if opens else None,
        "stage1_open_wall_ms": round(1000 * sum(o[1] for o in opens), 1),
        "stage1_open_cpu_ms": round(1000 * sum(o[2] for o in opens), 1),
        "stage1_first_chunks_in_ms": [round(1000 * min(chunk_in.values()), 1), round(1000 * max(chunk_in.values()), 1)]
        if chunk_in else None,
        "stage1_calls_to_last_first_chunk": len(calls),
        "stage1_call_wall_ms": round(1000 * sum(r[1] for r in calls), 1),
        "stage1_call_cpu_ms": round(1000 * sum(r[2] for r in calls), 1),
        "thread_cpu_ms": {name: round(1000 * (cpu_after.get(name, 0.0) - cpu_before.get(name, 0.0)), 1)
                          for name in sorted(cpu_after)},
        "steps": [{"at_ms": round(1000 * a, 1), "wall_ms": round(1000 * w, 2), "cpu_ms": round(1000 * c, 2),
                   "waiting": wt, "running": rn} for a, w, c, wt, rn in steps],
        "stage1_calls": [{"at_ms": round(1000 * a, 1), "wall_ms": round(1000 * w, 2), "cpu_ms": round(1000 * c, 2)}
                         for a, w, c in calls],
    }


def ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(1000 * ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))], 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shape", default="tiny", choices=("tiny", "1.7b"))
    ap.add_argument("--burst", type=int, default=0, help="part 2: requests at once under the Stage 0 profile")
    ap.add_argument("--config", default="configs/qwen3_tts.yaml", help="stage config (a CPU one for a dry run)")
    ap.add_argument("--timeline-variants",
                    default="default,unbatched-submits,submit-threads-1",
                    help="part 3: the bench variants (tools/bench.py VARIANTS) a burst's timeline is taken with")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    folder = Path(f"/tmp/ckpt/tts_bench_{args.shape}_custom_voice")     # the one gpu_env.sh's demo_checkpoint makes
    if not (folder / "config.json").exists():
        build_demo_checkpoint(folder, "custom_voice", shape=args.shape, progress=False)
    started = time.perf_counter()
    served = args.shape != "tiny"       # tiny: an eager talker that starts in seconds, for part 1
    overrides = {} if served or "cpu" in args.config else dict(enforce_eager=True, max_num_seqs=8,
                                                                 gpu_memory_utilization=0.1)
    engine = TTSEngine.from_pretrained(folder, args.config, **overrides)
    if served:
        engine.warmup()
    result: dict = {"shape": args.shape, "engine_start_s": round(time.perf_counter() - started, 1)}
    speaker = engine.config.supported_speakers[0]
    try:
        for streaming in (False, True):
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
                list(pool.map(lambda i: timed_builds(engine, inputs, 1), range(20)))    # the threads exist
                begun = time.perf_counter()
                burst = list(pool.map(lambda i: timed_builds(engine, [inputs[i % len(inputs)]], 1)[0], range(64)))
                makespan = time.perf_counter() - begun
            together = []
            for _ in range(5):                                     # all 64 in one `build_many` (batched submits)
                begun = time.perf_counter()
                for prompt in engine.prompts.build_many([inputs[i % len(inputs)] for i in range(64)]):
                    prompt.wait_for_prefill()
                together.append(time.perf_counter() - begun)
            batch = engine.prompts.build_many(inputs)              # bit for bit what each prompt is alone
            alone_built = [engine.prompts.build(x) for x in inputs]
            for prompt in [*batch, *alone_built]:
                if prompt.ready is not None:
                    prompt.ready.synchronize()
            same = all(torch.equal(getattr(a, f), getattr(b, f)) for a, b in zip(batch, alone_built)
                       for f in ("prefill", "trailing", "tts_pad"))
            result[mode] = {"alone_ms_p50": ms(alone, 50), "alone_ms_p95": ms(alone, 95),
                            "build_many_64_ms_p50": ms(together[1:], 50), "build_many_bits_equal_build": same,
                            "alone_ms_mean": round(1000 * statistics.fmean(alone), 3),
                            "burst_64_on_20_threads_ms_p50": ms(burst, 50), "burst_ms_p95": ms(burst, 95),
                            "burst_all_64_built_ms": round(1000 * makespan, 1),
                            "prefill_rows": int(engine.prompts.build(inputs[0]).prefill.shape[0])}
            print(mode, json.dumps(result[mode]), flush=True)
            print("\n".join(text.getvalue().splitlines()[:45]), flush=True)
        if args.burst:
            for variant in args.timeline_variants.split(","):     # each a bench variant, switched on and back
                previous = apply_variant(engine, VARIANTS[variant])
                try:
                    key = "stage0_timeline" + ("" if variant == "default" else "_" + variant.replace("-", "_"))
                    result[key] = timeline = stage0_timeline(engine, speaker, args.burst)
                finally:
                    apply_variant(engine, previous)
                print(key, json.dumps({k: v for k, v in timeline.items() if k not in ("steps", "stage1_calls")}),
                      flush=True)
                for row in timeline["steps"]:
                    print("  step", json.dumps(row), flush=True)
                for row in timeline["stage1_calls"]:
                    print("  stage1 call", json.dumps(row), flush=True)
            result["stage0_burst"] = stage0_burst(engine, speaker, args.burst, args.out)
            print("stage0_burst", json.dumps(result["stage0_burst"]), flush=True)
    finally:
        engine.close()
    (args.out / "prompt_profile.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
