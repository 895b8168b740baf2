"""LiveKit Agents `tts.TTS` over the speech WebSocket, with streaming (livekit-agents 1.8).

    from tts_engine.integrations.livekit import Qwen3TTS

    session = AgentSession(stt=..., llm=..., tts=Qwen3TTS(url="ws://127.0.0.1:7860/v1/audio/speech/stream",
                                                          voice="alice", sample_rate=24000))

`stream()` is the streaming path LiveKit uses with an LLM: each `SynthesizeStream` is one server context,
`push_text` tokens go out as `text` as they come (speech starts at the first complete clause), `flush()` is
`flush`, `end_input()` is `end`, and closing the stream early (barge-in) sends `cancel`. `synthesize(text)`
is one context with all the text at once. One socket per TTS instance carries every stream's context.
"""

from __future__ import annotations

import asyncio

from livekit.agents import DEFAULT_API_CONNECT_OPTIONS, APIConnectionError, APIConnectOptions, APIError, tts, utils

from tts_engine.integrations.client import SpeechStreamClient, SpeechStreamError, audio_bytes


class Qwen3TTS(tts.TTS):
    def __init__(self, *, url: str, voice: str | None = None, language: str = "auto", instructions: str | None = None,
                 sample_rate: int = 24000):
        super().__init__(capabilities=tts.TTSCapabilities(streaming=True), sample_rate=sample_rate, num_channels=1)
        self.url, self.voice, self.language, self.instructions = url, voice, language, instructions
        self._client: SpeechStreamClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def model(self) -> str:
        return "qwen3-tts"

    @property
    def provider(self) -> str:
        return "qwen3-tts-server"

    def synthesize(self, text: str, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
                   ) -> tts.ChunkedStream:
        return _ChunkedStream(tts=self, input_text=text, conn_options=conn_options)

    def stream(self, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> tts.SynthesizeStream:
        return _SynthesizeStream(tts=self, conn_options=conn_options)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def _connected(self) -> SpeechStreamClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client, self._loop = SpeechStreamClient(self.url), loop
        try:
            await self._client.connect()
        except OSError as exc:
            raise APIConnectionError(f"cannot reach the speech socket {self.url}: {exc}") from exc
        return self._client

    async def _open(self, context_id: str) -> SpeechStreamClient:
        client = await self._connected()
        await client.start(context_id, voice=self.voice, language=self.language, instructions=self.instructions,
                           response_format="pcm", sample_rate=self.sample_rate)
        return client


async def _receive(client: SpeechStreamClient, context_id: str, emitter: tts.AudioEmitter) -> None:
    try:
        async for event in client.events(context_id):
            if event["type"] == "audio":
                emitter.push(audio_bytes(event))
    except SpeechStreamError as exc:
        raise APIError(f"speech server: {exc}", body=exc.event, retryable=False) from exc
    except ConnectionError as exc:
        raise APIConnectionError(str(exc)) from exc


class _ChunkedStream(tts.ChunkedStream):
    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        context_id = utils.shortuuid()
        output_emitter.initialize(request_id=context_id, sample_rate=self._tts.sample_rate, num_channels=1,
                                  mime_type="audio/pcm")
        client = await self._tts._open(context_id)
        await client.text(context_id, self.input_text)
        await client.end(context_id)
        await _receive(client, context_id, output_emitter)
        output_emitter.flush()


class _SynthesizeStream(tts.SynthesizeStream):
    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        context_id = utils.shortuuid()
        output_emitter.initialize(request_id=context_id, sample_rate=self._tts.sample_rate, num_channels=1,
                                  mime_type="audio/pcm", stream=True)
        output_emitter.start_segment(segment_id=context_id)
        client = await self._tts._open(context_id)
        finished = False

        async def send() -> None:
            async for item in self._input_ch:
                if isinstance(item, self._FlushSentinel):
                    await client.flush(context_id)
                else:
                    self._mark_started()
                    await client.text(context_id, item)
            await client.end(context_id)

        async def receive() -> None:
            nonlocal finished
            await _receive(client, context_id, output_emitter)
            finished = True
            output_emitter.end_segment()

        tasks = [asyncio.create_task(send()), asyncio.create_task(receive())]
        try:
            await asyncio.gather(*tasks)
        finally:
            await utils.aio.cancel_and_wait(*tasks)
            if not finished and client.connected:    # closed early (barge-in): stop the server at once
                await client.cancel(context_id)
