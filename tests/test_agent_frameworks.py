"""Clients and frameworks against the live app (`app.py --demo`, the `sample` voice): the real `openai` SDK,
and the Pipecat and LiveKit Agents adapters of `tts_engine.integrations` driven through their frameworks'
own APIs. Utterances are capped at 40 frames by the live app's config."""

from __future__ import annotations

import asyncio
import io
import json

import av
import numpy as np
import pytest

HOP = 1920
WAIT_S = 240     # bound on one framework run (never reached unless something hangs)


def _ws_url(live_app: str) -> str:
    return live_app.replace("http://", "ws://") + "/v1/audio/speech/stream"


# ---------------------------------------------------------------------------------------------------
# The openai SDK
# ---------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def openai_client(live_app):
    from openai import OpenAI

    with OpenAI(base_url=live_app + "/v1", api_key="not-needed", max_retries=0, timeout=120) as client:
        yield client


def _decoded_rate(data: bytes) -> tuple[int, int]:
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        samples = sum(f.samples for f in container.decode(stream))
        return samples, stream.codec_context.sample_rate


def test_openai_speech_create_in_openai_formats(openai_client):
    default = openai_client.audio.speech.create(model="qwen3-tts", voice="sample", input="Hello from the SDK.")
    assert default.content[:4] == b"RIFF"                     # our default is wav (OpenAI's is mp3)
    for fmt, check in [("mp3", lambda b: b[:3] == b"ID3" or b[0] == 0xFF), ("opus", lambda b: b[:4] == b"OggS"),
                       ("aac", lambda b: b[0] == 0xFF and b[1] & 0xF0 == 0xF0), ("flac", lambda b: b[:4] == b"fLaC")]:
        audio = openai_client.audio.speech.create(model="qwen3-tts", voice="sample", input="Formats.",
                                                  response_format=fmt)
        assert check(audio.content), fmt
        samples, rate = _decoded_rate(audio.content)
        assert samples > 0 and rate in (24000, 48000), fmt
    by_object = openai_client.audio.speech.create(model="qwen3-tts", voice={"id": "sample"}, input="Object voice.",
                                                  response_format="pcm")
    assert len(by_object.content) % (2 * HOP) == 0 and by_object.content


def test_openai_with_streaming_response_streams_pcm(openai_client):
    with openai_client.audio.speech.with_streaming_response.create(
            model="qwen3-tts", voice="sample", input="Streaming through the SDK.", response_format="pcm") as response:
        assert response.headers["x-sample-rate"] == "24000"
        pieces = [p for p in response.iter_bytes() if p]
    assert len(pieces) >= 2
    assert len(b"".join(pieces)) % (2 * HOP) == 0


def test_openai_sse_events_are_named_as_openai_names_them(openai_client):
    with openai_client.audio.speech.with_streaming_response.create(
            model="qwen3-tts", voice="sample", input="Events.", response_format="pcm", stream_format="sse") as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[len("data: "):]) for line in response.iter_lines() if line.startswith("data: ")]
    assert {e["type"] for e in events[:-1]} == {"speech.audio.delta"} and events[-1]["type"] == "speech.audio.done"
    assert set(events[-1]["usage"]) >= {"input_tokens", "output_tokens", "total_tokens"}


def test_openai_errors_reach_the_sdk_as_typed_errors(openai_client):
    from openai import BadRequestError

    with pytest.raises(BadRequestError) as info:
        openai_client.audio.speech.create(model="qwen3-tts", voice="sample", input="Fast.", speed=1.5)
    assert info.value.code == "unsupported_speed" and "1.0" in info.value.message
    with pytest.raises(BadRequestError) as info:
        openai_client.audio.speech.create(model="qwen3-tts", voice="alloy", input="Who?")
    assert info.value.code == "unknown_voice" and "alias" in info.value.message


# ---------------------------------------------------------------------------------------------------
# Pipecat
# ---------------------------------------------------------------------------------------------------

def _pipecat_run(live_app, frames, **service_options):
    from pipecat.frames.frames import TTSAudioRawFrame
    from pipecat.tests.utils import run_test

    from tts_engine.integrations.pipecat import Qwen3TTSService

    service = Qwen3TTSService(url=_ws_url(live_app), voice="sample", sample_rate=16000, **service_options)
    down, _ = asyncio.run(asyncio.wait_for(run_test(service, frames_to_send=frames), WAIT_S))
    audio = [f for f in down if isinstance(f, TTSAudioRawFrame)]
    return down, audio


def test_pipecat_service_speaks_a_tts_speak_frame(live_app):
    from pipecat.frames.frames import ErrorFrame, TTSSpeakFrame, TTSStartedFrame, TTSStoppedFrame

    down, audio = _pipecat_run(live_app, [TTSSpeakFrame("Hello from Pipecat. A second sentence follows.")])
    names = [type(f).__name__ for f in down]
    assert audio, names
    assert not [f for f in down if isinstance(f, ErrorFrame)]
    assert names.index("TTSStartedFrame") < names.index("TTSAudioRawFrame") < names.index("TTSStoppedFrame")
    assert isinstance(down[names.index("TTSStartedFrame")], TTSStartedFrame)
    assert isinstance(down[names.index("TTSStoppedFrame")], TTSStoppedFrame)
    assert {f.sample_rate for f in audio} == {16000} and {f.num_channels for f in audio} == {1}
    pcm = np.frombuffer(b"".join(f.audio for f in audio), "<i2")
    assert len(pcm) > 16000 * 0.08 and np.abs(pcm).max() > 0        # at least one 80 ms frame of sound
    assert len({f.context_id for f in audio}) == 1


def test_pipecat_service_speaks_llm_tokens_as_they_stream(live_app):
    from pipecat.frames.frames import LLMFullResponseEndFrame, LLMFullResponseStartFrame, LLMTextFrame

    tokens = ["Sure", ",", " here", " is", " the", " answer", ".", " It", " comes", " in", " pieces", "."]
    frames = [LLMFullResponseStartFrame(), *[LLMTextFrame(t) for t in tokens], LLMFullResponseEndFrame()]
    down, audio = _pipecat_run(live_app, frames)
    assert audio and {f.sample_rate for f in audio} == {16000}
    assert len(b"".join(f.audio for f in audio)) > 2 * 16000 * 0.08


# ---------------------------------------------------------------------------------------------------
# LiveKit Agents
# ---------------------------------------------------------------------------------------------------

def test_livekit_tts_streams_pushed_text(live_app):
    from tts_engine.integrations.livekit import Qwen3TTS

    async def main():
        tts = Qwen3TTS(url=_ws_url(live_app), voice="sample", sample_rate=16000)
        try:
            assert tts.capabilities.streaming
            async with tts.stream() as stream:
                for token in ["Hello", " from", " LiveKit", ".", " Tokens", " arrive", " one", " by", " one", "."]:
                    stream.push_text(token)
                stream.end_input()
                return [event async for event in stream]
        finally:
            await tts.aclose()

    events = asyncio.run(asyncio.wait_for(main(), WAIT_S))
    frames = [e.frame for e in events]
    assert frames and {f.sample_rate for f in frames} == {16000} and {f.num_channels for f in frames} == {1}
    assert events[-1].is_final
    pcm = np.concatenate([np.frombuffer(bytes(f.data), np.int16) for f in frames])
    assert len(pcm) > 16000 * 0.08 and np.abs(pcm).max() > 0


def _aborted_socket_requests(live_app) -> float:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(httpx.get(live_app + "/metrics", timeout=30).text):
        for sample in family.samples:
            if sample.name == "tts_requests_total" and sample.labels == {"transport": "websocket",
                                                                         "outcome": "aborted"}:
                return sample.value
    return 0.0


def test_livekit_tts_synthesize_and_early_close(live_app):
    from tts_engine.integrations.livekit import Qwen3TTS

    aborted_before = _aborted_socket_requests(live_app)

    async def main():
        tts = Qwen3TTS(url=_ws_url(live_app), voice="sample", sample_rate=24000)
        try:
            whole = await tts.synthesize("One short utterance.").collect()
            async with tts.stream() as stream:                   # barge-in: closed after the first audio
                stream.push_text("This is cut off by the listener. And more follows")
                first = await stream.__anext__()
            again = await tts.synthesize("Still working after the cut.").collect()   # the socket serves on
            return whole, first, again
        finally:
            await tts.aclose()

    whole, first, again = asyncio.run(asyncio.wait_for(main(), WAIT_S))
    assert whole.sample_rate == 24000 and whole.samples_per_channel > 0
    assert first.frame.samples_per_channel > 0
    assert again.samples_per_channel > 0
    assert _aborted_socket_requests(live_app) - aborted_before == 1     # the early close cancelled on the server
