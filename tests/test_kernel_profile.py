"""The kernel profile's arithmetic: busy time is the union of overlapping kernels, shares add up."""

from __future__ import annotations

import pytest

from tts_engine.tools.kernel_profile import Kernel, busy_us, idle_gaps_us, markdown, summarize


def test_busy_time_is_the_union_of_intervals_across_streams():
    kernels = [Kernel("a", 7, 0, 10), Kernel("b", 9, 5, 15),     # overlap on two streams: 0..15
               Kernel("c", 7, 20, 30), Kernel("d", 7, 22, 25),   # nested: 20..30
               Kernel("e", 7, 40, 41)]
    assert busy_us(kernels) == 15 + 10 + 1
    assert busy_us([]) == 0


def test_summary_per_frame_and_ranking():
    kernels = [Kernel("gemm", 7, i * 100, i * 100 + 60) for i in range(4)] + [
        Kernel("decode", 9, 10, 30), Kernel("decode", 9, 310, 330)]
    summary = summarize([kernels], frames=2, top=1)
    assert summary["kernels"] == 6 and summary["kernels_per_frame"] == 3.0
    assert summary["window_ms_per_frame"] == pytest.approx(0.36 / 2, abs=1e-3)     # 0..360 us
    assert summary["busy_ms_per_frame"] == pytest.approx(0.24 / 2, abs=1e-3)       # decodes overlap gemms
    assert summary["gpu_busy_pct"] == pytest.approx(100 * 240 / 360, abs=0.1)
    assert summary["streams"] == {"7": 0.12, "9": 0.02}
    assert summary["top"] == [{"kernel": "gemm", "ms_per_frame": 0.12, "per_frame": 2.0, "share_pct": 85.7}]
    assert "| `gemm` | 0.12 | 2.0 | 85.7% |" in markdown(summary)
    assert summarize([], frames=3) == {"frames": 3, "kernels": 0}


def test_pauses_between_requests_and_copies_do_not_count():
    first = [Kernel("gemm", 7, 0, 50), Kernel("Memcpy DtoH (Device -> Pinned)", 7, 50, 60)]
    second = [Kernel("gemm", 7, 1000, 1050)]                    # 940 us of host time in between
    summary = summarize([first, second], frames=1)
    assert summary["window_ms_per_frame"] == pytest.approx(0.1) and summary["gpu_busy_pct"] == 100.0
    assert summary["kernels"] == 2 and summary["copy_ms_per_frame"] == pytest.approx(0.01)


def test_idle_gaps_are_bucketed_by_length_and_overlaps_are_not_gaps():
    kernels = [Kernel("a", 7, 0, 10), Kernel("b", 9, 5, 20),      # overlap on two streams: no gap
               Kernel("c", 7, 25, 30),                             # 5 us gap
               Kernel("d", 7, 80, 90),                             # 50 us
               Kernel("e", 7, 590, 600),                           # 500 us
               Kernel("f", 7, 3600, 3610)]                         # 3 ms
    gaps = idle_gaps_us(kernels)
    assert gaps == {"under 10 us": 5, "10-100 us": 50, "0.1-1 ms": 500, "over 1 ms": 3000}
    assert sum(gaps.values()) + busy_us(kernels) == 3610            # busy + idle = the window
    summary = summarize([kernels], frames=2)
    assert summary["idle_ms_per_frame_by_gap"] == {"under 10 us": 0.0025, "10-100 us": 0.025, "0.1-1 ms": 0.25,
                                                   "over 1 ms": 1.5}
    assert "idle per frame by gap length" in markdown(summary)


def test_a_record_function_range_on_the_gpu_timeline_is_not_a_kernel():
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from tts_engine.tools.kernel_profile import kernels_of

    def gpu_event(name: str, start: float, end: float, annotation: bool):
        return SimpleNamespace(name=name, device_type=DeviceType.CUDA, device_resource_id=7, is_user_annotation=annotation,
                               time_range=SimpleNamespace(start=start, end=end))

    events = [gpu_event("tts::stage0_step", 0, 100, True), gpu_event("gemm", 10, 20, False)]
    assert kernels_of(SimpleNamespace(events=lambda: events)) == [Kernel("gemm", 7, 10.0, 20.0)]
