"""The benchmark tool (`python -m tts_engine.tools.bench`): its metrics, and one short run on a tiny model.

The end-to-end run uses fixed frame counts (random weights rarely stop on their own), two concurrency
levels and writes JSON + Markdown, as the GPU and CPU benchmark runs do.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tts_engine.tools.bench import (
    SAMPLE_RATE,
    RequestResult,
    first_audible_sample,
    first_chunk_path,
    late_chunks,
    main,
    markdown_table,
    peer_comparison,
    player_underruns,
    split_evenly,
    summarize,
)


def test_first_audible_window():
    quiet = np.full(SAMPLE_RATE // 2, 1e-4, np.float32)          # -80 dBFS
    loud = np.full(SAMPLE_RATE // 2, 0.1, np.float32)            # -20 dBFS
    idx = first_audible_sample(np.concatenate([quiet, loud]))
    # the first 20 ms window (10 ms hop) whose RMS reaches -45 dBFS starts within one hop of the edge
    assert quiet.size - 480 <= idx <= quiet.size
    assert first_audible_sample(quiet) is None
    assert first_audible_sample(loud) == 0


def test_player_underruns():
    sr = SAMPLE_RATE
    frame = 1920                                                  # 80 ms
    # 1 frame, then 2 frames 50 ms later, then 4 frames 100 ms after that: never runs dry
    assert player_underruns([(0.0, frame), (0.05, 2 * frame), (0.15, 4 * frame)], sr) == (0, 0.0)
    # the second chunk comes 200 ms after an 80 ms first chunk: one 120 ms stall
    count, stall = player_underruns([(0.0, frame), (0.2, 25 * frame)], sr)
    assert count == 1 and stall == pytest.approx(0.12)
    # a 100 ms pre-buffer waits for the second chunk and then plays through
    assert player_underruns([(0.0, frame), (0.2, 25 * frame)], sr, prebuffer_s=0.1) == (0, 0.0)


def test_summary_and_table():
    results = [RequestResult("a", 0.0, frames=10, audio_s=0.8, first_chunk_s=0.03, first_audible_s=0.03,
                             finished_s=0.2, frame_intervals_s=[0.01, 0.02]),
               RequestResult("b", 0.0, error="boom")]
    row = summarize("ours", 1, "closed", results, wall_s=0.5, frames=10)
    assert row["errors"] == 1 and row["requests"] == 2
    assert row["first_chunk_ms_p50"] == 30.0 and row["rtf_p50"] == 0.25 and row["audio_s_per_s"] == 1.6
    assert row["frame_ms_p50"] == 15.0
    table = markdown_table([row])
    assert table.splitlines()[0].startswith("| run |") and "| ours | 1 |" in table


def test_end_to_end_tiny_fixed_frames(tmp_path):
    out = tmp_path / "bench.json"
    md = tmp_path / "bench.md"
    rc = main(["--demo", "tiny", "--demo-dir", str(tmp_path), "--concurrency", "1,2", "--frames", "12",
               "--requests", "2", "--warmup", "0", "--cold", "--keep-requests", "--json", str(out), "--markdown", str(md),
               "--variants", "default,decoder-calls-100-frames", "--variant-levels", "1", "--burst-profile", "1x2"])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["environment"]["torch"] and doc["checkpoint"]["demo"] == "tiny"
    burst = [r for r in doc["results"] if r["name"] == "burst profile"]
    rows = [r for r in doc["results"] if r["name"] != "burst profile"]
    # the burst profile: both joining requests streamed beside the running one, and the profiler saw the stepping
    # thread's steps (not only the caller's thread), the burst's prefill among them (more tokens than one a row)
    assert len(burst) == 1 and burst[0]["errors"] == [] and burst[0]["running_streaming"] == 1
    assert burst[0]["burst_first_chunks"] == 2
    assert burst[0]["steps"] and max(s["tokens"] for s in burst[0]["steps"]) > 3
    assert all(s["wall_ms"] > 0 and s["host_top"] for s in burst[0]["steps"])
    assert "burst of 2 requests beside 1 streaming" in md.read_text()
    assert [(r["name"], r["level"]) for r in rows] == [
        ("ours/cold", 1), ("ours", 1), ("ours", 2), ("ours/decoder-calls-100-frames", 1)]
    assert rows[0]["startup_warmup"] == "full" and rows[0]["startup_warmup_s"] > 0
    assert rows[0]["max_batched_tokens"] >= 512      # what vLLM settled on, as the rows report it
    for row in rows:
        assert row["errors"] == 0 and row["requests"] == 2
        for key in ("first_chunk_ms_p50", "first_audible_ms_p50", "frame_ms_p50", "rtf_p50", "audio_s_per_s"):
            assert row[key] is not None and row[key] > 0, key
        # Stage 1's calls of this level: at least one per request (12 frames: first chunk, then the rest)
        assert row["stage1_calls"] >= 2 and 0 <= row["stage1_calls_by_pass_over"] <= row["stage1_calls"]
        assert 0 <= row["stage1_calls_overdue"] <= row["stage1_calls"]
        for request in row["requests_detail"]:
            assert request["frames"] == 12                        # fixed frame count honoured
            assert request["audio_s"] == pytest.approx(12 * 0.08)
            assert sum(n for _, n in request["chunks"]) == 12 * 1920
    assert md.read_text().count("| ours |") == 2
    assert rows[-1]["variant"] == "decoder-calls-100-frames"   # applied to the running engine and undone
    for row in rows:          # every leg of the first chunk's path was timed, in order, by the engine itself
        path = row["first_chunk_path_ms"]
        legs = ("queue", "prompt", "admit", "first_frame", "decode", "decode_wait", "decode_call", "delivery")
        assert sorted(path) == sorted(f"{leg}_{q}" for leg in legs for q in (50, 95))
        assert all(v >= 0 for v in path.values()) and path["prompt_50"] > 0 and path["first_frame_50"] > 0
        assert path["decode_call_50"] > 0 and path["decode_wait_50"] <= path["decode_50"]


def test_url_mode_measures_a_running_server(live_app, tmp_path):
    out = tmp_path / "url.json"
    rc = main(["--url", live_app, "--voice", "sample", "--concurrency", "2", "--frames", "10", "--requests", "2",
               "--keep-requests", "--json", str(out)])
    assert rc == 0
    (row,) = json.loads(out.read_text())["results"]
    assert row["name"] == "http client" and row["errors"] == 0 and row["requests"] == 2, row
    for key in ("first_chunk_ms_p50", "first_audible_ms_p50", "rtf_p50", "audio_s_per_s"):
        assert row[key] is not None and row[key] > 0, key
    for request in row["requests_detail"]:
        assert 0 < request["audio_s"] <= 10 * 0.08 + 1e-6 and request["chunks"]


def test_url_mode_shares_a_level_among_client_processes(live_app, tmp_path):
    out = tmp_path / "url.json"
    assert main(["--url", live_app, "--voice", "sample", "--concurrency", "2", "--frames", "6", "--requests", "3",
                 "--client-processes", "2", "--keep-requests", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["results"]
    assert row["client_processes"] == 2 and row["requests"] == 3 and row["errors"] == 0, row
    assert 0 < row["client_cpu_share"] and row["audio_s_per_s"] > 0
    assert len({r["request_id"] for r in row["requests_detail"]}) == 3
    assert split_evenly(5, 2) == [3, 2] and split_evenly(2, 3) == [1, 1, 0]


def _doc(gpu: bool, *rows: dict) -> dict:
    return {"environment": {"gpu": "NVIDIA H200"} if gpu else {}, "results": list(rows)}


def test_peer_comparison_and_combine(tmp_path):
    """`--combine`: ours and each peer at one stream in one table, ratios = peer / ours."""
    ours = {"name": "ours", "level": 1, "variant": "default", "first_chunk_ms_p50": 25.0, "first_chunk_ms_p95": 30.0,
            "first_audible_ms_p50": 25.0, "frame_ms_p50": 8.0, "rtf_p50": 0.1}
    ref = {"name": "official qwen-tts", "level": 1, "variant": "reference", "device": "cuda", "dtype": "bfloat16",
           "first_chunk_ms_p50": 8000.0, "first_chunk_ms_p95": 9000.0, "first_audible_ms_p50": 8000.0,
           "frame_ms_p50": 160.0, "rtf_p50": 2.0}
    fast = {"name": "faster-qwen3-tts chunk 8", "level": 1, "variant": "faster-qwen3-tts", "first_chunk_ms_p50": 250.0,
            "first_chunk_ms_p95": 260.0, "first_audible_ms_p50": 250.0, "frame_ms_p50": 24.0, "rtf_p50": 0.3,
            "gen_ms_per_frame_p50": 20.0}
    files = []
    for name, doc in (("fast", _doc(True, fast, {"name": "component", "level": 1})),
                      ("ours", _doc(True, ours, {**ours, "level": 16})), ("ref", _doc(True, ref))):
        files.append(tmp_path / f"{name}.json")
        files[-1].write_text(json.dumps(doc))
    comparison = peer_comparison([json.loads(f.read_text()) for f in files])
    assert [r["name"] for r in comparison["rows"]] == ["ours", "faster-qwen3-tts chunk 8", "official qwen-tts"]
    assert all(r["device"] == "cuda" for r in comparison["rows"])
    by_peer = {r["peer"]: r for r in comparison["ratios"]}
    assert by_peer["official qwen-tts"] == {"peer": "official qwen-tts", "first_chunk": 320.0, "first_chunk_p95": 300.0,
                                            "first_audible": 320.0, "per_frame": 20.0, "rtf": 20.0}
    assert by_peer["faster-qwen3-tts chunk 8"]["first_chunk"] == 10.0 and by_peer["faster-qwen3-tts chunk 8"]["rtf"] == 3.0
    out, md = tmp_path / "peers.json", tmp_path / "peers.md"
    assert main(["--combine", *map(str, files), "--json", str(out), "--markdown", str(md)]) == 0
    assert json.loads(out.read_text())["ratios"] == comparison["ratios"]
    text = md.read_text()
    assert "| ours | cuda |" in text and "peer / ours" in text and "| 20.0 |" in text


def test_faster_rope_shim_falls_back_to_rope_parameters(monkeypatch):
    """The bench-only shim for faster-qwen3-tts under transformers >= 5.17: configs with `rope_theta` keep
    the registered initializer; a config with only `rope_parameters` (MimiConfig in 5.x) gets the plain
    RoPE frequencies instead of an AttributeError."""
    from types import SimpleNamespace

    import torch

    pytest.importorskip("qwen_tts")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from tts_engine.tools.bench import _faster_rope_shim

    if "default" not in ROPE_INIT_FUNCTIONS:
        ROPE_INIT_FUNCTIONS["default"] = lambda config, *a, **k: (torch.zeros(1), 1.0)
        monkeypatch.delitem(ROPE_INIT_FUNCTIONS, "default")
    monkeypatch.setitem(ROPE_INIT_FUNCTIONS, "default", ROPE_INIT_FUNCTIONS["default"])   # restored afterwards
    original = ROPE_INIT_FUNCTIONS["default"]
    assert _faster_rope_shim() is not None and _faster_rope_shim() is None            # once
    shimmed = ROPE_INIT_FUNCTIONS["default"]
    legacy = SimpleNamespace(rope_theta=1000.0, hidden_size=64, num_attention_heads=4, head_dim=16)
    assert torch.equal(shimmed(legacy)[0], original(legacy)[0])
    mimi_5x = SimpleNamespace(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, hidden_size=32,
                              num_attention_heads=4, head_dim=8)
    inv_freq, scale = shimmed(mimi_5x)
    assert scale == 1.0 and torch.allclose(inv_freq, torch.tensor([1.0, 0.1, 0.01, 0.001]))


def test_client_side_modes_against_the_live_app(live_app, tmp_path):
    """`--url` (HTTP streaming clients) and `--webrtc` (aiortc agents) against the running app: every request
    answered, and over WebRTC the first RTP packet arrives no later than the first audible decoded frame."""
    out = tmp_path / "url.json"
    assert main(["--url", live_app, "--voice", "sample", "--concurrency", "2", "--requests", "2", "--frames", "6",
                 "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["results"]
    assert row["name"] == "http client" and row["errors"] == 0 and row["first_chunk_ms_p50"] > 0

    out = tmp_path / "webrtc.json"
    assert main(["--webrtc", live_app, "--voice", "sample", "--concurrency", "1", "--requests", "1",
                 "--frames", "6", "--webrtc-timeout", "30", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["results"]
    assert row["name"] == "webrtc client" and row["errors"] == 0, row["error_messages"]
    assert 0 < row["first_chunk_ms_p50"] <= row["first_audible_ms_p50"]


def test_first_chunk_path_splits_the_wait_into_legs():
    r = RequestResult("a", 0.0, submit_s=0.030, engine_first_frame_s=0.045, engine_first_chunk_s=0.060,
                      first_chunk_s=0.100,
                      engine_legs={"prompt": 0.002, "admit": 0.005, "first_frame": 0.040, "decode": 0.015})
    path = first_chunk_path([r, RequestResult("failed", 0.0)])    # a request without timings is left out
    assert path == {"queue_50": 28.0, "queue_95": 28.0, "prompt_50": 2.0, "prompt_95": 2.0, "admit_50": 5.0,
                    "admit_95": 5.0, "first_frame_50": 40.0, "first_frame_95": 40.0, "decode_50": 15.0,
                    "decode_95": 15.0, "delivery_50": 10.0, "delivery_95": 10.0}
    assert first_chunk_path([]) == {}


def test_the_engine_times_its_legs_from_its_own_metrics():
    from tts_engine.request import RequestMetrics

    m = RequestMetrics("a", 0.0, prompt_s=0.002, admitted_s=0.005, first_frame_s=0.045, first_decode_s=0.051,
                       first_chunk_s=0.060)
    assert m.first_audio_legs() == pytest.approx({"prompt": 0.002, "admit": 0.005, "first_frame": 0.040,
                                                  "decode": 0.015, "decode_wait": 0.006, "decode_call": 0.009})
    early = RequestMetrics("b", 0.0, prompt_s=0.002, admitted_s=0.005)      # failed before its first frame
    assert early.first_audio_legs() == pytest.approx({"prompt": 0.002, "admit": 0.005})


def test_late_chunks_name_the_chunk_that_missed_its_deadline():
    sr, frame = 24000, 1920                      # 80 ms frames
    # chunk 2 on time (before 80 ms), chunk 3 late by 40 ms (the 2 frames played out at 160 ms), chunk 4 late
    chunks = [(0.0, frame), (0.07, frame), (0.2, 2 * frame), (0.5, 4 * frame)]
    late = late_chunks(chunks, sr)
    assert [i for i, _ in late] == [3, 4]
    assert late[0][1] == pytest.approx(0.04) and late[1][1] == pytest.approx(0.5 - (0.2 + 0.16))
    assert player_underruns(chunks, sr) == (2, pytest.approx(0.04 + 0.14))
    assert late_chunks(chunks, sr, prebuffer_s=0.5) == []


def test_late_chunks_carry_their_time_in_stage1():
    """A chunk that came after the player ran dry is matched to the engine's chunk of the same audio (chunks the
    trim emptied never reached the player) and reports how long it waited for Stage 1's call and the call."""
    from tts_engine.tools.bench import late_chunk_legs, late_chunk_summary

    sr, frame = 24000, 1920
    r = RequestResult("a", 0.0, chunks=[(0.0, frame), (0.07, frame), (0.2, 2 * frame), (0.5, 4 * frame)],
                      chunk_indexes=[1, 2, 3, 4],        # the engine's chunk 0 was all leading silence
                      engine_chunk_times=[(0.01, 0.01, 0.02), (0.02, 0.03, 0.04), (0.05, 0.06, 0.07),
                                          (0.10, 0.15, 0.19), (0.30, 0.45, 0.49)])
    legs = late_chunk_legs(r, late_chunks(r.chunks, sr))
    assert legs == [pytest.approx({"stall": 0.04, "stage1_wait": 0.05, "stage1_call": 0.04}),
                    pytest.approx({"stall": 0.14, "stage1_wait": 0.15, "stage1_call": 0.04})]
    summary = late_chunk_summary(legs)["late_chunk_legs_ms"]
    assert summary["stage1_wait_max"] == 150.0 and summary["stall_50"] == pytest.approx(90.0)
    assert late_chunk_summary([]) == {}


def test_stream_candidates_switch_on_and_back():
    """The candidates of the eighth pass are switched in a running engine and undone by their previous values."""
    from types import SimpleNamespace

    from tts_engine.tools.bench import VARIANTS, apply_variant

    switched = []
    pipeline = SimpleNamespace(first_chunk_stream=None, drain_pending=False, use_state_table=True)
    pipeline.first_chunk_priority = lambda on: (switched.append(on),
                                                setattr(pipeline, "first_chunk_stream", "stream" if on else None))
    engine = SimpleNamespace(talker=SimpleNamespace(early_handover=True), pipeline=pipeline,
                             talker_engine=SimpleNamespace(model=SimpleNamespace(code_predictor=None)))
    previous = apply_variant(engine, {**VARIANTS["late-handover"], **VARIANTS["stage1-first-chunk-priority"],
                                      **VARIANTS["stage1-drain-pending"], **VARIANTS["stage1-per-stream-states"]})
    assert engine.talker.early_handover is False and pipeline.first_chunk_stream == "stream" and pipeline.drain_pending
    assert pipeline.use_state_table is False
    apply_variant(engine, previous)
    assert engine.talker.early_handover is True and pipeline.first_chunk_stream is None and switched == [True, False]
    assert pipeline.drain_pending is False and pipeline.use_state_table is True


def test_the_thirteenth_to_fifteenth_pass_variants_switch_on_and_back():
    """Stage 0's old loop, the bound on prompt builds, lazy Stage 1 opens, the interpreter's switch interval, the
    submit pool and the submits before batches are switched in a running engine and undone."""
    import sys
    from types import SimpleNamespace

    from tts_engine.tools.bench import VARIANTS, apply_variant

    table = SimpleNamespace(lazy_open=False)
    engine = SimpleNamespace(talker=SimpleNamespace(drain_commands=False), concurrent_prompt_builds=None,
                             submit_threads=1, batch_submits=True, pipeline=SimpleNamespace(table=table),
                             talker_engine=SimpleNamespace(model=SimpleNamespace(code_predictor=None)))
    interval = sys.getswitchinterval()
    previous = apply_variant(engine, {**VARIANTS["stage0-drain-commands"], **VARIANTS["prompt-builds-2"],
                                      **VARIANTS["stage1-lazy-open"], **VARIANTS["switch-interval-0.25ms"],
                                      **VARIANTS["submit-threads-2"]})
    try:
        assert engine.talker.drain_commands is True and engine.concurrent_prompt_builds == 2 and table.lazy_open
        assert engine.submit_threads == 2 and engine.batch_submits is False
        assert sys.getswitchinterval() == 0.00025
        apply_variant(engine, VARIANTS["prompt-builds-1"])
        assert engine.concurrent_prompt_builds == 1
        unbatched = apply_variant(engine, VARIANTS["unbatched-submits"])
        assert engine.batch_submits is False and engine.submit_threads is None
        apply_variant(engine, unbatched)
        assert engine.batch_submits is False and engine.submit_threads == 2
    finally:
        apply_variant(engine, previous)
    assert engine.talker.drain_commands is False and engine.concurrent_prompt_builds is None and not table.lazy_open
    assert sys.getswitchinterval() == interval and engine.submit_threads == 1 and engine.batch_submits is True


def test_the_lazy_open_priority_variant_switches_both_and_back():
    """`stage1-lazy-open-priority` sets Stage 1's opens lazy and its first-chunk calls to Stage 0's priority together,
    and undoing it restores both."""
    from types import SimpleNamespace

    from tts_engine.tools.bench import VARIANTS, apply_variant

    pipeline = SimpleNamespace(table=SimpleNamespace(lazy_open=False), first_chunk_stream=None)
    pipeline.first_chunk_priority = lambda on: setattr(pipeline, "first_chunk_stream", "stream" if on else None)
    engine = SimpleNamespace(pipeline=pipeline, talker_engine=SimpleNamespace(model=SimpleNamespace(code_predictor=None)))
    previous = apply_variant(engine, VARIANTS["stage1-lazy-open-priority"])
    assert pipeline.table.lazy_open and pipeline.first_chunk_stream == "stream"
    apply_variant(engine, previous)
    assert not pipeline.table.lazy_open and pipeline.first_chunk_stream is None


def test_the_small_gemv_variant_captures_the_smallest_bucket_again():
    """`no-small-gemv` switches the predictor's matrix-vector kernel off and captures again the one graph it is in
    (the smallest bucket's sampled one); undoing it switches it on and captures that graph again."""
    from types import MethodType, SimpleNamespace

    from tts_engine.models.qwen3_tts.code_predictor import PredictorGraphs
    from tts_engine.tools.bench import VARIANTS, apply_variant

    captured = []
    graphs = SimpleNamespace(step_fn=object(), buckets=[2, 4, 8], small_everywhere=False,
                             capture=lambda *key: captured.append(key))
    graphs._small_buckets = MethodType(PredictorGraphs._small_buckets, graphs)
    graphs.capture_small = MethodType(PredictorGraphs.capture_small, graphs)
    predictor = SimpleNamespace(small_gemv=True, graphs=graphs)
    engine = SimpleNamespace(talker_engine=SimpleNamespace(model=SimpleNamespace(code_predictor=predictor)))
    previous = apply_variant(engine, VARIANTS["no-small-gemv"])
    assert predictor.small_gemv is False and captured == [(2, True, False)]
    apply_variant(engine, previous)
    assert predictor.small_gemv is True and captured == [(2, True, False)] * 2


def test_the_fused_sampler_variant_captures_every_compiled_graph_again():
    """`no-fused-sampler` switches the one-kernel sampler off and captures again every graph it is in (each bucket's
    sampled one, largest first); undoing it switches it on and captures them again."""
    from types import MethodType, SimpleNamespace

    from tts_engine.models.qwen3_tts.code_predictor import PredictorGraphs
    from tts_engine.tools.bench import VARIANTS, apply_variant

    captured = []
    graphs = SimpleNamespace(step_fn=object(), buckets=[2, 4, 8], capture=lambda *key: captured.append(key))
    graphs.capture_sampled = MethodType(PredictorGraphs.capture_sampled, graphs)
    predictor = SimpleNamespace(fused_sampler=True, graphs=graphs)
    engine = SimpleNamespace(talker_engine=SimpleNamespace(model=SimpleNamespace(code_predictor=predictor)))
    previous = apply_variant(engine, VARIANTS["no-fused-sampler"])
    every = [(8, True, False), (4, True, False), (2, True, False)]
    assert predictor.fused_sampler is False and captured == every
    apply_variant(engine, previous)
    assert predictor.fused_sampler is True and captured == every * 2


def test_a_variant_freezes_what_it_built_when_start_up_had_frozen(monkeypatch):
    """Switching a variant on or off refreezes the collector's heap when start-up froze it (what a recompile built
    must not be walked by a full collection during the next level), and leaves an unfrozen heap alone."""
    from types import SimpleNamespace

    from tts_engine.tools import bench

    frozen, calls = [1], []
    monkeypatch.setattr(bench.gc, "get_freeze_count", lambda: frozen[0])
    monkeypatch.setattr(bench.gc, "collect", lambda: calls.append("collect"))
    monkeypatch.setattr(bench.gc, "freeze", lambda: calls.append("freeze"))
    pipeline = SimpleNamespace(order="due")
    engine = SimpleNamespace(pipeline=pipeline, talker_engine=SimpleNamespace(model=SimpleNamespace(code_predictor=None)))
    previous = bench.apply_variant(engine, {"stage1_order": "smallest"})
    assert pipeline.order == "smallest" and calls == ["collect", "freeze"]
    bench.apply_variant(engine, previous)
    assert pipeline.order == "due" and calls == ["collect", "freeze"] * 2
    bench.apply_variant(engine, {})                      # the default variant switches nothing
    frozen[0] = 0
    bench.apply_variant(engine, {"stage1_order": "smallest"})
    assert calls == ["collect", "freeze"] * 2


def test_the_worktree_id_names_the_commit_whose_files_ran(tmp_path):
    """Results from a copy of the tree without its history can be traced to the commit with the same tree."""
    import subprocess

    from tts_engine.tools.bench import worktree_id

    def git(*args):
        return subprocess.run(["git", *args], cwd=tmp_path, capture_output=True, text=True, check=True).stdout.strip()
    git("init", "-q")
    (tmp_path / ".gitignore").write_text("ignored/\n")
    (tmp_path / "a.py").write_text("one\n")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    (tmp_path / "ignored").mkdir()
    (tmp_path / "ignored" / "big.bin").write_text("not code\n")
    assert worktree_id(tmp_path) == git("rev-parse", "HEAD^{tree}")      # ignored files do not count
    (tmp_path / "a.py").write_text("two\n")
    changed = worktree_id(tmp_path)
    assert changed != git("rev-parse", "HEAD^{tree}")
    assert git("diff", "--cached", "--name-only") == ""      # the real index was left alone
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "second")
    assert changed == git("rev-parse", "HEAD^{tree}")


def test_engine_counters_are_counted_per_level():
    """A level's row carries Stage 1's calls made during it, how many began overdue and how many the pass-over
    bound chose, and the prompt
    pieces found on the host or computed."""
    from types import SimpleNamespace

    from tts_engine.tools.bench import LevelCounters, engine_counters

    engine = SimpleNamespace(pipeline=SimpleNamespace(calls=10, calls_overdue=2, calls_by_pass_over=1),
                             prompts=SimpleNamespace(first_rows=SimpleNamespace(hits=4, misses=2),
                                                     leads=SimpleNamespace(hits=5, misses=1)))
    counter = LevelCounters()
    assert counter.take() == {}                      # no engine in process: nothing to say
    counter.read = lambda: engine_counters(engine)
    counter.reset()                                  # a level starts
    engine.pipeline.calls, engine.pipeline.calls_overdue, engine.pipeline.calls_by_pass_over = 25, 6, 3
    engine.prompts.first_rows.hits, engine.prompts.leads.misses = 10, 2
    assert counter.take() == {"stage1_calls": 15, "stage1_calls_overdue": 4, "stage1_calls_by_pass_over": 2,
                              "prompt_rows_cached": 6, "prompt_rows_computed": 1}     # first rows 4 -> 10, leads 5
    engine.pipeline.calls = 30
    assert counter.take() == {"stage1_calls": 5, "stage1_calls_overdue": 0, "stage1_calls_by_pass_over": 0,
                              "prompt_rows_cached": 0, "prompt_rows_computed": 0}
