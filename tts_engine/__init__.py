"""Embedded two-stage Qwen3-TTS engine on vLLM: `TTSEngine.from_pretrained(...)`, `SpeechRequest`."""

from tts_engine.models.qwen3_tts.config import CheckpointError
from tts_engine.request import RequestError, SpeechRequest, SynthesisResult, VoicePrompt


def __getattr__(name: str):
    # The engine imports torch/vLLM machinery; keep `import tts_engine` light for tools and tests.
    if name == "TTSEngine":
        from tts_engine import engine
        return getattr(engine, name)
    raise AttributeError(name)


__all__ = ["TTSEngine", "SpeechRequest", "SynthesisResult", "VoicePrompt", "RequestError",
           "CheckpointError"]
