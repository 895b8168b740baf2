"""Adapters for voice-agent frameworks over the speech WebSocket (`/v1/audio/speech/stream`).

* `client.SpeechStreamClient`: the protocol itself (no framework), used by both adapters.
* `pipecat.Qwen3TTSService`: a Pipecat `TTSService` (pipecat-ai 1.14).
* `livekit.Qwen3TTS`: a LiveKit Agents `tts.TTS` with streaming (livekit-agents 1.8).

The framework modules import their framework; `client` needs only `websockets`.
"""
