"""Async scheduling changes when vLLM reports a token, never which frames a request streams.

Runs the same requests on an engine with vLLM's async scheduling off and on and compares every request's
codec frames and audio bit for bit; then, on each engine, requests that overlap (join mid-batch, finish
while others decode, one aborted) must stream exactly the codebook-0 tokens vLLM reported for them, all but
the last. Exits 1 on any difference. Requests run one at a time (a batch's
composition differs between the two modes for one step after a request stops, and bf16 GEMMs of other
batch sizes need not round alike). The checkpoint's EOS row is made likely, so most requests end on their
stop token at different steps (the case async scheduling makes a frame for that has to be dropped); the rest
run to max_new_tokens. CPU vLLM always schedules synchronously, so there the two runs must match trivially;
the check means something on a GPU (run it there by hand after scripts/gpu_setup.sh; BENCHMARKS.md).

    python3 scripts/gpu_async_check.py [--shape tiny|0.6b|1.7b] [--requests 12] [--root /tmp/ckpt_eos]

`--switch handover` (or `--handover-only`) checks instead that frames handed to Stage 1 right after the code predictor
(`TalkerStage.early_handover`) stream bit for bit what handing them over after the whole talker step does;
`--switch prompt` that prompts put together from host pieces stream what prompts read back from the GPU do
(`switch_check`).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tts_engine import SpeechRequest, TTSEngine  # noqa: E402
from tts_engine.tools.demo_checkpoint import build_demo_checkpoint  # noqa: E402

EOS_BOOST = 6.0   # the EOS row of the codec head = EOS_BOOST x token 0's row: EOS wins often, not always


def eos_prone_checkpoint(root: Path, shape: str) -> Path:
    folder = root / f"eos_{shape}"
    if (folder / "config.json").exists():
        return folder
    build_demo_checkpoint(folder, "custom_voice", shape=shape, progress=False)
    eos = json.loads((folder / "config.json").read_text())["talker_config"]["codec_eos_token_id"]
    weights = load_file(folder / "model.safetensors")
    head = weights["talker.codec_head.weight"]
    head[eos] = EOS_BOOST * head[0]
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def overlapping_requests(engine, voice: dict, count: int) -> list[str]:
    """Requests that join, finish and (one) abort while others decode: each stream's codebook-0 codes must be
    the tokens vLLM reported for it, all but the last (the stop token, or the last one max_new_tokens allowed),
    whatever the batch's rounding. `voice`: the request's voice fields (`speaker=...`, or `voice=` a clone
    without reference text). Returns what did not hold. (tests/test_streaming_engine.py runs it on CPU.)"""
    reported: dict[str, list[int]] = defaultdict(list)
    llm = engine.talker_engine.engine
    step = llm.step

    def noting_step():
        outputs = step()
        for out in outputs:
            if out.outputs:
                reported[out.request_id].extend(out.outputs[0].token_ids)
        return outputs

    results: dict[str, np.ndarray | None] = {}

    def one(i: int) -> None:
        time.sleep(0.03 * i)                       # join a batch in flight
        request_id = f"overlap{i}"
        request = SpeechRequest(text=f"Overlapping request {i}.", **voice, seed=2000 + i,
                                do_sample=i % 3 != 2, max_new_tokens=20 + 9 * i)
        stream, codes = engine.stream(request, request_id=request_id), []
        for n, chunk in enumerate(stream):
            if chunk.codec_codes is not None and len(chunk.codec_codes):
                codes.append(chunk.codec_codes)
            if i == count // 2 and n == 2:         # a listener hangs up mid-stream: the request is aborted
                stream.close()
                results[request_id] = None
                return
        results[request_id] = np.concatenate(codes) if codes else np.zeros((0, 16), np.int64)

    llm.step = noting_step
    try:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
    finally:
        llm.step = step
    problems = []
    for request_id, codes in sorted(results.items()):
        if codes is None:
            continue
        want = reported[request_id][:-1]
        if codes[:, 0].tolist() != want:
            problems.append(f"{request_id}: {codes.shape[0]} frames, codebook 0 {codes[:, 0].tolist()[:8]}..., "
                            f"reported tokens but the last: {len(want)} {want[:8]}...")
    if len(results) != count:
        problems.append(f"only {len(results)} of {count} overlapping requests ended")
    return problems


def start_engine(folder: Path, async_scheduling: bool, on_gpu: bool) -> TTSEngine:
    config = REPO / "configs" / ("qwen3_tts.yaml" if on_gpu else "qwen3_tts_tiny_cpu.yaml")
    overrides = {"gpu_memory_utilization": 0.2} if on_gpu else {"kv_cache_gib": 0.5}
    return TTSEngine.from_pretrained(folder, stage_config=config, max_num_seqs=8, max_model_len=512,
                                     async_scheduling=async_scheduling, **overrides)


def one_by_one(engine: TTSEngine, requests: int, non_streaming_mode: bool | None = None
               ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each request's codec frames and audio, the requests run one at a time (`non_streaming_mode`: None, the
    mode's default; False feeds the text a step at a time, the prompts `PromptBuilder` puts together on the host)."""
    speaker = engine.config.supported_speakers[0]
    results = []
    for i in range(requests):
        greedy = i % 3 == 2
        text = f"Request number {i} checks the stream." if i % 2 else f"Stream {i} starts with another word."
        request = SpeechRequest(text=text, speaker=speaker, seed=1000 + i, do_sample=not greedy,
                                max_new_tokens=24 + 7 * i, non_streaming_mode=non_streaming_mode)
        out = engine.synthesize(request)
        results.append((out.codes, out.audio))
    return results


def run(folder: Path, async_scheduling: bool, requests: int, on_gpu: bool) -> tuple[bool, list, list[str]]:
    engine = start_engine(folder, async_scheduling, on_gpu)
    try:
        results = one_by_one(engine, requests)
        speaker = engine.config.supported_speakers[0]
        return engine.talker_engine.async_scheduling, results, overlapping_requests(engine, {"speaker": speaker}, requests)
    finally:
        engine.close()


def switch_check(folder: Path, requests: int, on_gpu: bool, name: str, switch) -> int:
    """With `switch(engine, False)` and then `switch(engine, True)`, the same requests must stream the same codes and
    audio bit for bit, and overlapping requests (switch on) must stream their reported tokens. One engine.
    `handover`: frames handed to Stage 1 as soon as the code predictor made them (`TalkerStage.early_handover`, the
    default) vs after the whole step; a missing wait shows as stale codes. `prompt`: prompts put together from host
    pieces (`PromptBuilder.cache_prefills`, the default; with the text a step at a time the steps wait for the
    trailing text's kernels on the GPU) vs built whole on the GPU and read back, requests with their text a step at
    a time and in the prefill (CustomVoice's default); a missing wait shows as other codes from the first step on.
    `copy`: prompts whose rows made on the GPU reach the host by an asynchronous copy that Stage 0 waits for before
    vLLM reads them (`PromptBuilder.wait_for_prefill` False, the default) vs the builder waiting for them; a missing
    wait shows as other codes from the first step on."""
    engine = start_engine(folder, True, on_gpu)
    try:
        modes = (False, None) if name in ("prompt", "copy") else (None,)   # text a step at a time, and the default
        switch(engine, False)
        off = [result for mode in modes for result in one_by_one(engine, requests, mode)]
        switch(engine, True)
        on = [result for mode in modes for result in one_by_one(engine, requests, mode)]
        problems = overlapping_requests(engine, {"speaker": engine.config.supported_speakers[0]}, requests)
    finally:
        engine.close()
    bad = sum(not (c1.shape == c2.shape and np.array_equal(c1, c2) and np.array_equal(a1, a2))
              for (c1, a1), (c2, a2) in zip(off, on))
    print(f"{name}: {len(on) - bad}/{len(on)} requests identical on vs off "
          f"({sum(c.shape[0] for c, _ in on)} frames); overlapping requests, on: "
          + ("every stream's codebook 0 = its reported tokens but the last" if not problems else "; ".join(problems)))
    return 1 if bad or problems else 0


def _early_handover(engine: TTSEngine, on: bool) -> None:
    engine.talker.early_handover = on


def _host_prompts(engine: TTSEngine, on: bool) -> None:
    engine.prompts.cache_prefills = on
    engine.prompts.leads.clear()            # the first request of the run computes its pieces, the others find them
    engine.prompts.first_rows.clear()


def _prefill_copy(engine: TTSEngine, on: bool) -> None:
    engine.prompts.wait_for_prefill = not on   # (the `prompt` check's off side copies whole prompts the same way)


SWITCHES = {"handover": _early_handover, "prompt": _host_prompts, "copy": _prefill_copy}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="tiny", choices=("tiny", "0.6b", "1.7b"))
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--root", default="/tmp/ckpt_eos")
    ap.add_argument("--handover-only", action="store_true", help="only the early vs late hand-over check")
    ap.add_argument("--switch", choices=sorted(SWITCHES), help="only this switch's on vs off check")
    args = ap.parse_args()
    on_gpu = torch.cuda.is_available()
    folder = eos_prone_checkpoint(Path(args.root), args.shape)
    switch = "handover" if args.handover_only else args.switch
    if switch:
        return switch_check(folder, args.requests, on_gpu, switch, SWITCHES[switch])
    t = time.perf_counter()
    sync_mode, sync, sync_problems = run(folder, False, args.requests, on_gpu)
    async_mode, lagged, async_problems = run(folder, True, args.requests, on_gpu)
    print(f"engines: sync run async_scheduling={sync_mode}, async run async_scheduling={async_mode} "
          f"({time.perf_counter() - t:.0f} s)")
    bad = 0
    for i, ((codes_s, audio_s), (codes_a, audio_a)) in enumerate(zip(sync, lagged)):
        limit = 24 + 7 * i
        same = codes_s.shape == codes_a.shape and np.array_equal(codes_s, codes_a) and np.array_equal(audio_s, audio_a)
        bad += not same
        print(f"request {i:2d}: frames sync {codes_s.shape[0]:3d} async {codes_a.shape[0]:3d} "
              f"({'stopped on EOS' if codes_s.shape[0] < limit - 1 else 'reached max_new_tokens'}) "
              f"{'same' if same else 'DIFFERENT'}")
    stopped = sum(c.shape[0] < 24 + 7 * i - 1 for i, (c, _) in enumerate(sync))
    print(f"{args.requests - bad}/{args.requests} identical; {stopped} ended on EOS")
    for mode, problems in (("sync", sync_problems), ("async", async_problems)):
        print(f"overlapping requests, {mode}: " + ("every stream's codebook 0 = its reported tokens but the last"
                                                   if not problems else "; ".join(problems)))
    return 1 if bad or not stopped or sync_problems or async_problems else 0


if __name__ == "__main__":
    sys.exit(main())
