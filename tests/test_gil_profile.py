"""The GIL profile summary (tools/gil_profile.py) on a synthetic py-spy raw profile."""

from tts_engine.tools.gil_profile import markdown, parse, summarize

STAGE0 = "thread (101): tts-stage0;OwnerThread._run (tts_engine/stages/owner_thread.py:35)"
EXECUTOR = "_worker (concurrent/futures/thread.py:83)"
RAW = "\n".join([
    f"{STAGE0};TalkerStage._run (tts_engine/stages/talker.py:141);TalkerEngine.step "
    "(tts_engine/stages/vllm_bridge.py:250);Scheduler.schedule (vllm/v1/core/sched/scheduler.py:300) 6",
    f"{STAGE0};TalkerStage.decode_embeddings (tts_engine/stages/talker.py:260) 2",
    "thread (102): tts-stage1;AsyncDecodingPipeline._loop (tts_engine/stages/decoder.py:120) 1",
    f"thread (103): asyncio_0;{EXECUTOR};PromptBuilder._build (tts_engine/models/qwen3_tts/prompt.py:140) 1",
    f"thread (104): asyncio_1;{EXECUTOR};Tokenizer.encode (tokenizers/x.py:10) 1",
    "not a sample line",
])


def test_samples_are_grouped_by_thread_with_where_in_our_code_they_were():
    samples = parse(RAW.splitlines())
    assert len(samples) == 5 and samples[0].count == 6 and samples[0].thread == "tts-stage0"
    summary = summarize(samples, rate=10, duration=2)
    assert summary["samples"] == 11 and summary["gil_busy"] == 0.55
    stage0, executor, stage1 = summary["threads"]
    assert (stage0["thread"], stage0["samples"], stage0["share"]) == ("tts-stage0", 8, round(8 / 11, 4))
    # innermost frame of our code, line numbers dropped: the vLLM scheduler's time counts for TalkerEngine.step
    assert stage0["top_ours"][0] == ("TalkerEngine.step (tts_engine/stages/vllm_bridge.py)", 6)
    assert stage0["top_self"][0] == ("Scheduler.schedule (vllm/v1/core/sched/scheduler.py)", 6)
    # the executor's numbered threads are one row; a sample outside our code says so
    assert executor["thread"] == "asyncio_*" and executor["samples"] == 2
    assert ("(not our code)", 1) in executor["top_ours"]
    assert stage1["samples"] == 1
    table = markdown(summary)
    assert "GIL held 55%" in table and "| tts-stage0 | 72.7% |" in table
