"""Pipecat `TTSService` over the speech WebSocket (pipecat-ai 1.14).

    from tts_engine.integrations.pipecat import Qwen3TTSService

    tts = Qwen3TTSService(url="ws://127.0.0.1:7860/v1/audio/speech/stream", voice="alice")
    pipeline = Pipeline([transport.input(), stt, context_aggregator.user(), llm, tts, transport.output(), ...])

Each Pipecat turn (an LLM response, a `TTSSpeakFrame`) is one server context: the first text of the turn
opens it (`start`, raw PCM at the pipeline's output rate, resampled by the server), every sentence is
sent as `text` + `flush` (in `TextAggregationMode.TOKEN` tokens go as they come and the server finds the
clauses), the turn's end sends `end`, and the server's `done` closes the audio context. An interruption
sends `cancel`. Audio events become `TTSAudioRawFrame`s of the turn's audio context.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from pipecat.frames.frames import CancelFrame, EndFrame, ErrorFrame, Frame, StartFrame, TTSAudioRawFrame, TTSStoppedFrame
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TTSService
from pipecat.transcriptions.language import Language

from tts_engine.integrations.client import SpeechStreamClient, audio_bytes


class Qwen3TTSService(TTSService):
    """Speech from our server, streamed per turn. `language`: `auto`, a name (`english`) or an ISO code."""

    def __init__(self, *, url: str, voice: str | None = None, language: str | Language | None = None,
                 instructions: str | None = None, sample_rate: int | None = None, **kwargs):
        settings = TTSSettings(model="qwen3-tts", voice=voice, language=language)
        super().__init__(push_start_frame=True, sample_rate=sample_rate, settings=settings, **kwargs)
        self._url, self._instructions = url, instructions
        self._client: SpeechStreamClient | None = None
        self._open: set[str] = set()     # contexts started on the server and not done

    def can_generate_metrics(self) -> bool:
        return True

    def language_to_service_language(self, language: Language) -> str | None:
        return str(getattr(language, "value", language)).split("-")[0]

    # ---- lifecycle -------------------------------------------------------------------------------
    async def start(self, frame: StartFrame):
        await super().start(frame)
        self._client = SpeechStreamClient(self._url, on_event=self._on_event)
        await self._client.connect()

    async def stop(self, frame: EndFrame):
        await super().stop(frame)
        await self._close()

    async def cancel(self, frame: CancelFrame):
        await super().cancel(frame)
        await self._close()

    async def _close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
        self._open.clear()

    # ---- synthesis -------------------------------------------------------------------------------
    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        try:
            if context_id not in self._open:
                language = self._settings.language if isinstance(self._settings.language, str) else None
                await self._client.start(context_id, voice=self._settings.voice or None, language=language or "auto",
                                         instructions=self._instructions, response_format="pcm",
                                         sample_rate=self.sample_rate)
                self._open.add(context_id)
            await self.start_tts_usage_metrics(text)
            if self._is_streaming_tokens:
                await self._client.text(context_id, text)
            else:       # a whole sentence: speak it now
                await self._client.text(context_id, text + " ")
                await self._client.flush(context_id)
        except Exception as exc:  # noqa: BLE001 -- reported as a frame, like Pipecat's own services
            yield ErrorFrame(error=f"{self}: {exc}")
            yield TTSStoppedFrame(context_id=context_id)
            return
        yield None   # the audio arrives through `_on_event`

    async def flush_audio(self, context_id: str | None = None):
        """The turn is over: ask the server to finish the context (it answers `done` after the last audio)."""
        context_id = context_id or self.get_active_audio_context_id()
        if context_id in self._open and self._client is not None:
            await self._client.end(context_id)

    async def on_audio_context_interrupted(self, context_id: str):
        await self.stop_all_metrics()
        if context_id in self._open and self._client is not None:
            self._open.discard(context_id)
            await self._client.cancel(context_id)
        await super().on_audio_context_interrupted(context_id)

    async def _on_event(self, event: dict) -> None:
        context_id = event.get("context_id")
        kind = event.get("type")
        if kind == "error" and (context_id is None or not self.audio_context_available(context_id)):
            await self.push_error(error_msg=f"{self}: speech socket error {event.get('code')}: {event.get('message')}")
            return
        if context_id is None or not self.audio_context_available(context_id):
            return     # a context already interrupted: its late events are dropped
        if kind == "audio":
            await self.stop_ttfb_metrics()
            await self.append_to_audio_context(context_id, TTSAudioRawFrame(
                audio=audio_bytes(event), sample_rate=event["sample_rate"], num_channels=1, context_id=context_id))
        elif kind == "done":
            self._open.discard(context_id)
            await self.append_to_audio_context(context_id, TTSStoppedFrame(context_id=context_id))
            await self.remove_audio_context(context_id)
        elif kind == "error":
            self._open.discard(context_id)
            await self.push_error(error_msg=f"{self}: {event.get('code')}: {event.get('message')}")
            await self.append_to_audio_context(context_id, TTSStoppedFrame(context_id=context_id))
            await self.remove_audio_context(context_id)
