"""The burst profile's per-step accounting on synthetic profiler events (the GPU half cannot run on CI)."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

from tts_engine.tools.burst_profile import ROUND, STEP, host_events, markdown, summarize, sync_sites
from tts_engine.tools.kernel_profile import Kernel


def event(name: str, start: float, end: float, thread: int = 1):
    return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end), thread=thread)


def test_each_step_gets_the_kernels_and_host_calls_inside_it():
    events = [event(STEP, 0, 1000), event(STEP, 1000, 5000),
              event("cudaStreamSynchronize", 1100, 4000), event("aten::copy_", 100, 200),
              event("aten::copy_", 4100, 4300, thread=2),             # another thread: not this step's host time
              event(ROUND, 900, 1200, thread=3)]
    kernels = [Kernel("talker_gemm", 7, 0, 800), Kernel("decoder_conv", 9, 500, 3500),
               Kernel("talker_gemm", 7, 3000, 4000), Kernel("Memcpy HtoD", 7, 0, 5000),   # copies apart
               Kernel("Stream Sync", 14, 1100, 2900)]                             # the host waiting: apart too
    summary = summarize(events, kernels, [64, 640], running=48, burst=16, window_s=0.005)
    first, second = summary["steps"]
    assert first["wall_ms"] == 1.0 and first["tokens"] == 64
    assert first["gpu_busy_ms"] == 1.0                      # 0-800 and 500-1000 (clipped), overlapping
    assert first["kernel_ms_by_stream"] == {"7": 0.8, "9": 0.5}
    assert second["kernel_ms_by_stream"] == {"7": 1.0, "9": 2.5} and second["gpu_busy_ms"] == 3.0
    assert first["host_waits_gpu_ms"] == 0 and second["host_waits_gpu_ms"] == 1.8
    assert first["stage1_rounds"] == 1 and second["stage1_rounds"] == 1
    assert first["host_top"] == [("aten::copy_", 0.1)]
    assert second["host_top"] == [("cudaStreamSynchronize", 2.9)]
    assert summary["streams"]["9"]["top_kernel"] == "decoder_conv"
    table = markdown({**summary, "running_streaming": 48, "burst_first_chunks": 16, "errors": []})
    assert "| 1 | 4.0 | 640 | 3.0 | 1.8 |" in table and "16 first chunks" in table


def test_a_range_counts_once_though_the_gpu_timeline_repeats_it():
    from torch.autograd import DeviceType

    host = SimpleNamespace(name=STEP, device_type=DeviceType.CPU)
    on_gpu = SimpleNamespace(name=STEP, device_type=DeviceType.CUDA)    # the same range, a gpu_user_annotation
    assert host_events([host, on_gpu]) == [host]


def test_sync_sites_name_the_engine_lines_that_made_the_host_wait():
    def warned(message: str, filename: str, lineno: int):
        return warnings.WarningMessage(message, UserWarning, filename, lineno)

    caught = [warned("called a synchronizing CUDA operation", "/tmp/site/tts_engine/stages/talker.py", 294),
              warned("called a synchronizing CUDA operation", "/tmp/site/tts_engine/stages/talker.py", 294),
              warned("called a synchronizing CUDA operation", "/usr/lib/python3/vllm/v1/worker/runner.py", 12),
              warned("called a synchronizing CUDA operation", "/root/torch/.venv/site-packages/torch/cuda/sync.py", 7),
              warned("something else entirely", "/tmp/site/tts_engine/stages/decoder.py", 5)]
    assert sync_sites(caught) == [("tts_engine/stages/talker.py:294", 2), ("vllm/v1/worker/runner.py:12", 1),
                                  ("torch/cuda/sync.py:7", 1)]
