"""Graph capture names its own stream on the tensors' GPU (graph_capture.py).

Stages on two GPUs crashed at start-up because `torch.cuda.graph` without `stream=` reuses one
process-wide capture stream made on whichever GPU captured first. CUDA cannot run here, so the torch.cuda
calls are recorded by fakes: the capture must happen on a stream created for the given device, with
that device current, after the warm-up runs.
"""

from __future__ import annotations

import contextlib

import torch

from tts_engine.models.qwen3_tts import graph_capture


class _Recorder:
    def __init__(self):
        self.current = torch.device("cuda:0")     # the thread's current device (the talker's GPU)
        self.events: list[tuple] = []

    def install(self, monkeypatch):
        recorder = self

        class Stream:
            def __init__(self, device=None):
                self.device = torch.device(device) if device is not None else recorder.current

            def wait_stream(self, other):
                pass

        @contextlib.contextmanager
        def device(dev):
            before, recorder.current = recorder.current, torch.device(dev)
            try:
                yield
            finally:
                recorder.current = before

        @contextlib.contextmanager
        def stream(s):
            recorder.events.append(("stream", s.device, id(s)))
            yield

        @contextlib.contextmanager
        def graph(g, pool=None, stream=None, capture_error_mode="global"):
            recorder.events.append(("capture", stream.device if stream is not None else None,
                                    recorder.current, capture_error_mode))
            yield

        monkeypatch.setattr(torch.cuda, "Stream", Stream)
        monkeypatch.setattr(torch.cuda, "device", device)
        monkeypatch.setattr(torch.cuda, "stream", stream)
        monkeypatch.setattr(torch.cuda, "graph", graph)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream(device))
        monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: object())


def test_capture_runs_on_a_stream_of_the_tensors_gpu(monkeypatch):
    monkeypatch.setattr(graph_capture, "_CAPTURE_STREAMS", {})
    recorder = _Recorder()
    recorder.install(monkeypatch)
    calls = []
    stage1 = torch.device("cuda:1")

    def run():
        calls.append(recorder.current)
        return "out"

    _, out = graph_capture.capture_on_device(run, stage1, pool=None)
    assert out == "out"
    assert calls == [stage1] * (graph_capture.WARMUP_RUNS + 1)          # warm-ups, then the captured run
    assert ("capture", stage1, stage1, "thread_local") in recorder.events  # its own stream, its own GPU
    assert recorder.current == torch.device("cuda:0")                    # the caller's device restored
    graph_capture.capture_on_device(run, stage1, pool=None)
    streams = [e for e in recorder.events if e[0] == "stream"]
    # every capture of a device on the same stream, so graphs share their pool's freed blocks
    assert len({sid for _, _, sid in streams}) == 1 and len(streams) == 2
    assert all(device == stage1 for _, device, _ in streams)
