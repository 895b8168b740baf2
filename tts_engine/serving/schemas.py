"""The OpenAPI models of the HTTP API: request bodies, answers and the error shape."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import Path
from pydantic import BaseModel, ConfigDict, Field, StrictBool

VoiceName = Annotated[str, Path(description="Voice name (case-insensitive).")]


class ErrorDetail(BaseModel):
    message: str = Field(description="What is wrong, safe to show to a user.")
    type: str = Field(description="invalid_request_error (4xx) or server_error (5xx).")
    param: str | None = Field(None, description="The request field at fault, if any.")
    code: str | None = Field(None, description="Machine-readable reason, e.g. voice_not_found, input_too_long.")


class ErrorResponse(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{"error": {
        "message": "unknown voice 'nova'; available: alice, bob", "type": "invalid_request_error",
        "param": "voice", "code": "voice_not_found"}}]})
    error: ErrorDetail


class VoiceRef(BaseModel):
    """OpenAI's object form of a custom voice."""

    id: str = Field(description="A library voice name or preset speaker.")


class SpeechCreateRequest(BaseModel):
    """OpenAI `audio.speech.create` body, plus `language`, `stream` and `max_new_tokens`."""

    model_config = ConfigDict(extra="ignore", json_schema_extra={"examples": [
        {"model": "qwen3-tts", "input": "Hello! How can I help you today?", "voice": "alice",
         "response_format": "wav"}]})

    model: str | None = Field(None, description="Accepted for OpenAI compatibility and echoed back (X-Model "
                                 "header, SSE done event); the server always uses its loaded checkpoint.")
    input: str = Field(description="The text to speak (at most `max_input_chars`, default 5000).")
    voice: str | VoiceRef | None = Field(
        None, description="Base checkpoints: a library voice name (required; see GET /v1/audio/voices). "
                          "CustomVoice: one of the preset speakers (required). VoiceDesign: ignored "
                          "(describe the voice in `instructions`). Names match case-insensitively.")
    language: str = Field("auto", description="`auto` or a language the checkpoint supports (e.g. english, "
                          "chinese); ISO codes such as `en` are accepted.")
    instructions: str | None = Field(None, description="VoiceDesign: the voice description (required). "
                                        "CustomVoice 1.7B: style instructions. Ignored by Base checkpoints.")
    response_format: Literal["wav", "pcm", "flac", "mp3", "opus", "aac", "ulaw", "alaw"] = Field(
        "wav", description="Format of the answer (default wav; OpenAI's default is mp3). `pcm` is raw signed 16-bit "
                           "little-endian; `opus` is Ogg Opus; `aac` is ADTS; `ulaw` / `alaw` are raw G.711 bytes at "
                           "8 kHz (telephony). Every format streams.")
    sample_rate: int | None = Field(None, description="Output sample rate in Hz (resampled with soxr). pcm, wav, "
                                    "flac, mp3, aac: 8000, 16000, 22050, 24000 (default), 32000, 44100, 48000; opus: "
                                    "8000, 12000, 16000, 24000, 48000; ulaw/alaw: 8000 only.")
    speed: float | None = Field(None, description="Only 1.0 is supported (accepted for OpenAI compatibility); "
                                "anything else is refused with `unsupported_speed`.")
    stream: StrictBool = Field(False, description="Send audio while it is generated (chunked transfer) in "
                               "`response_format`: raw PCM16 for pcm, a WAV header of unknown length then PCM16 for "
                               "wav, Ogg pages for opus, MP3/ADTS frames, ... A JSON boolean: \"yes\" or 1 are "
                               "refused.")
    stream_format: Literal["audio", "sse"] = Field(
        "audio", description="`sse` streams server-sent events (implies `stream`): "
                             "`{\"type\":\"speech.audio.delta\",\"audio\":\"<base64>\"}` per chunk, then "
                             "`{\"type\":\"speech.audio.done\",\"usage\":{...},\"metrics\":{...}}`. The deltas "
                             "are pieces of the `response_format` byte stream; raw PCM16 when no format is given.")
    max_new_tokens: int | None = Field(None, ge=1, description="Cap on generated codec frames (12.5 per "
                                          "second of audio). Default: the server's setting / stage config.")
    seed: int | None = Field(None, ge=0, description="Sampling seed for reproducible output.")
    trim_leading_silence: StrictBool = Field(True, description="Drop audio below -60 dBFS from the start (at most "
                                       "200 ms), which listeners hear as latency. false: the model's output as is.")


class LibraryVoice(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "name": "alice", "type": "library", "mode": "icl", "created": "2025-01-01T12:00:00+00:00",
        "duration_s": 4.2, "transcript": "The quick brown fox.", "model_type": "base", "model_size": "0b6",
        "hidden_size": 1024, "compatible": True, "ref_frames": 53, "trimmed": False,
        "preview_url": "/v1/audio/voices/alice/preview"}]})

    name: str
    type: Literal["library"] = "library"
    mode: Literal["icl", "x_vector"] = Field(description="icl: speaker vector + reference codes + transcript; "
                                             "x_vector: speaker vector only.")
    created: str = Field(description="ISO 8601 time (UTC).")
    duration_s: float = Field(description="Length of the stored (possibly trimmed) reference clip.")
    transcript: str | None
    model_type: str
    model_size: str
    hidden_size: int
    compatible: bool = Field(description="False when the voice was cloned for another model; it cannot be used.")
    ref_frames: int
    trimmed: bool
    preview_url: str


class VoiceCreated(LibraryVoice):
    notice: str | None = Field(None, description="What the caller should know, e.g. that the clip was trimmed "
                                  "to 30 s, or that without a transcript only the speaker vector is kept.")


class PresetSpeaker(BaseModel):
    name: str
    type: Literal["preset"] = "preset"
    dialect: str | None = None


class ModelDescription(BaseModel):
    model_type: str
    model_size: str
    hidden_size: int
    supports_cloning: bool
    supports_instructions: bool
    languages: list[str]


class VoiceList(BaseModel):
    object: Literal["list"] = "list"
    model: ModelDescription
    voices: list[LibraryVoice]
    speakers: list[PresetSpeaker]


class VoiceDeleted(BaseModel):
    object: Literal["voice.deleted"] = "voice.deleted"
    name: str
    deleted: bool = True


ERRORS = {
    400: {"model": ErrorResponse, "description": "Invalid request (the body names the field and the problem)."},
    503: {"model": ErrorResponse, "description": "Too many requests running; retry after `Retry-After` seconds."},
    "4XX": {"model": ErrorResponse, "description": "Other client errors, same error shape."},
}
NOT_FOUND = {404: {"model": ErrorResponse, "description": "No such voice."},
              "4XX": {"model": ErrorResponse, "description": "Other client errors, same error shape."}}


class Say(BaseModel):
    webrtc_id: str = Field(description="the id used in POST /webrtc/offer")
    text: str = Field(description="text to speak; may be a piece of a longer utterance")
    voice: str | None = Field(None, description="library voice or preset speaker")
    language: str = Field("auto", description="`auto`, a language the checkpoint supports, or an ISO code (`en`)")
    instructions: str | None = None
    final: StrictBool = Field(True, description="false: more text follows; true: speak everything left")
    trim_leading_silence: StrictBool = Field(True, description="drop up to 200 ms of silence (< -60 dBFS) that "
                                             "opens each clause")


class Interrupt(BaseModel):
    webrtc_id: str
