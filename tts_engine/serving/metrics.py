"""Prometheus metrics of the serving layer (`GET /metrics`, text exposition format).

Process-wide series live in prometheus_client's default registry (so vLLM's own series, if any, show
too); the engine's stage queues are read when scraped by a collector bound to the app's engine.

| series | kind | labels | what |
|---|---|---|---|
| `tts_time_to_first_audio_seconds` | histogram | transport | engine request start -> first audio chunk |
| `tts_real_time_factor` | histogram | transport | synthesis time / audio duration, per finished request |
| `tts_first_audio_leg_seconds` | histogram | leg | the engine's time to first audio by leg, per finished request (below) |
| `tts_active_streams` | gauge | transport | engine requests being streamed now |
| `tts_requests_total` | counter | transport, outcome | finished engine requests: completed, aborted, failed |
| `tts_frames_total` | counter | transport | codec frames produced (12.5 per second of audio) |
| `tts_audio_seconds_total` | counter | transport | audio produced |
| `tts_playback_underruns_total` | counter | | WebRTC: the track ran dry in the middle of an utterance |
| `tts_playback_underrun_seconds_total` | counter | | ... and for how long (the listener heard a gap) |
| `tts_errors_total` | counter | code | errors answered (HTTP bodies, SSE and WebSocket error events), by code |
| `tts_websocket_connections` | gauge | | open `/v1/audio/speech/stream` sockets |
| `tts_stage_queue_depth` | gauge | stage | commands waiting in each stage's queue (talker, decoder) |
| `tts_stage_active_requests` | gauge | stage | requests each stage holds (talker, decoder) |

`transport` is `http` (file or byte stream), `sse`, `websocket` or `webrtc`. The legs: `prompt` (building the
prompt), `admit` (until Stage 0 gave the request to vLLM), `first_frame` (prefill and steps), `decode` (Stage 1,
until the first chunk: with the leading-silence trim, the first chunk that keeps audio, so silent frames before it
count here), and `decode` in two: `decode_wait` (until Stage 1 began the first chunk's call) and `decode_call`
(that call, with its wait for the GPU work that made the frames, until the first chunk); waiting for an executor
thread and the transport's own delivery are not in them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SAMPLE_RATE = 24000

TTFA = Histogram("tts_time_to_first_audio_seconds", "Time from an engine request's start to its first audio chunk.",
                 ["transport"], buckets=(0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10))
RTF = Histogram("tts_real_time_factor", "Synthesis time divided by audio duration, per finished request.",
                ["transport"], buckets=(0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10))
LEGS = Histogram("tts_first_audio_leg_seconds", "Where the engine's time to first audio went, per finished request.",
                 ["leg"], buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5))
ACTIVE = Gauge("tts_active_streams", "Engine requests being streamed now.", ["transport"])
REQUESTS = Counter("tts_requests", "Finished engine requests by outcome.", ["transport", "outcome"])
FRAMES = Counter("tts_frames", "Codec frames produced.", ["transport"])
AUDIO_SECONDS = Counter("tts_audio_seconds", "Seconds of audio produced.", ["transport"])
UNDERRUNS = Counter("tts_playback_underruns", "WebRTC: times a track ran dry in the middle of an utterance.")
UNDERRUN_SECONDS = Counter("tts_playback_underrun_seconds", "WebRTC: silence heard in the middle of utterances.")
ERRORS = Counter("tts_errors", "Errors answered, by code.", ["code"])
WEBSOCKETS = Gauge("tts_websocket_connections", "Open /v1/audio/speech/stream sockets.")


def count_error(code: str) -> None:
    ERRORS.labels(code).inc()


class InstrumentedStream:
    """`engine.generate(...)` with its numbers recorded: use it exactly like the stream it wraps."""

    def __init__(self, stream: AsyncIterator, transport: str):
        self.stream, self.transport = stream, transport
        self.start = time.perf_counter()
        self.first_audio: float | None = None
        self._open = True
        ACTIVE.labels(transport).inc()

    def __aiter__(self) -> InstrumentedStream:
        return self

    async def __anext__(self):
        try:
            chunk = await self.stream.__anext__()
        except StopAsyncIteration:
            self._end("completed")
            raise
        except (asyncio.CancelledError, GeneratorExit):
            self._end("aborted")
            raise
        except BaseException:
            self._end("failed")
            raise
        if chunk.audio.size:
            if self.first_audio is None:
                self.first_audio = time.perf_counter() - self.start
                TTFA.labels(self.transport).observe(self.first_audio)
            AUDIO_SECONDS.labels(self.transport).inc(chunk.audio.shape[0] / SAMPLE_RATE)
        if chunk.codec_codes is not None:
            FRAMES.labels(self.transport).inc(len(chunk.codec_codes))
        if chunk.is_finished:
            if chunk.metrics is not None:
                if chunk.metrics.real_time_factor:
                    RTF.labels(self.transport).observe(chunk.metrics.real_time_factor)
                for leg, seconds in chunk.metrics.first_audio_legs().items():
                    LEGS.labels(leg).observe(seconds)
            self._end("completed")
        return chunk

    async def aclose(self) -> None:
        self._end("aborted")
        await self.stream.aclose()

    def _end(self, outcome: str) -> None:
        if self._open:
            self._open = False
            ACTIVE.labels(self.transport).dec()
            REQUESTS.labels(self.transport, outcome).inc()


def instrument(stream: AsyncIterator, transport: str) -> InstrumentedStream:
    return InstrumentedStream(stream, transport)


class EngineCollector:
    """Reads the engine's stage queues when scraped (no polling thread)."""

    def __init__(self, engine):
        self.engine = engine

    def collect(self):
        talker, decoder = getattr(self.engine, "talker", None), getattr(self.engine, "pipeline", None)
        depth = GaugeMetricFamily("tts_stage_queue_depth", "Commands waiting in each stage's queue.", labels=["stage"])
        active = GaugeMetricFamily("tts_stage_active_requests", "Requests each stage holds.", labels=["stage"])
        for stage, obj, queue_name in (("talker", talker, "_commands"), ("decoder", decoder, "_inbox")):
            queue = getattr(obj, queue_name, None)
            if queue is not None:
                depth.add_metric([stage], queue.qsize())
            ids = getattr(obj, "active_request_ids", None)
            if ids is not None:
                active.add_metric([stage], len(ids))
        yield depth
        yield active


def exposition(engine_registry: CollectorRegistry | None) -> bytes:
    """The process-wide series, then the engine's."""
    out = generate_latest(REGISTRY)
    return out + (generate_latest(engine_registry) if engine_registry is not None else b"")


def engine_registry(engine) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(engine))
    return registry
