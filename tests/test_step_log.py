"""Stage 0's step log: which steps a joining request's prefill rode in, and the split summary."""

from __future__ import annotations

from tts_engine.stages.step_log import StepLog, StepRecord
from tts_engine.tools.bench import summarize_steps


def test_a_join_marks_the_call_after_it_and_the_one_after_that():
    log = StepLog()
    log.record(0.010)
    log.request_added()                 # scheduled by the next call, paid for there or in the call after
    log.record(0.030)
    log.record(0.025)
    log.record(0.011)
    assert [r.joined for r in log.take()] == [False, True, True, False]
    assert log.take() == []             # take empties it


def test_summary_splits_joined_steps_from_the_rest():
    records = [StepRecord(0.010, False)] * 18 + [StepRecord(0.050, True)] * 2
    summary = summarize_steps(records)
    assert summary["steps"] == 20 and summary["steps_joined_pct"] == 10.0
    assert summary["step_ms_p50"] == 10.0 and summary["step_ms_p95_joined"] == 50.0
    assert summary["step_ms_p95_not_joined"] == 10.0
    assert summarize_steps([])["step_ms_p50"] is None


def test_the_log_is_bounded():
    log = StepLog(capacity=3)
    for i in range(5):
        log.record(i / 1000)
    assert [r.seconds for r in log.take()] == [0.002, 0.003, 0.004]
