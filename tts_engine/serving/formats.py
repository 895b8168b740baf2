"""Output formats of every transport (HTTP file and stream, SSE, WebSocket): name + sample rate.

The engine makes float32 mono audio at 24 kHz. A client asks for a `response_format` and, optionally,
a `sample_rate`; `output_format` checks the pair (one error per mistake, naming the field) and
`AudioEncoder` turns engine chunks into the bytes of that format as they come: resampled with soxr
(a real band-limited resampler, state kept across chunks so chunk boundaries are seamless), then
encoded (`tts_engine.audio.StreamEncoder`).

| format | what | sample rates (Hz) | default |
|---|---|---|---|
| `pcm`  | raw signed 16-bit little-endian | 8000, 16000, 22050, 24000, 32000, 44100, 48000 | 24000 |
| `wav`  | 16-bit PCM in RIFF/WAVE | same as pcm | 24000 |
| `flac` | lossless | same as pcm | 24000 |
| `mp3`  | MPEG layer III (LAME) | same as pcm | 24000 |
| `opus` | Opus in Ogg | 8000, 12000, 16000, 24000, 48000 | 24000 |
| `aac`  | AAC-LC in ADTS | same as pcm | 24000 |
| `ulaw` | G.711 mu-law, raw bytes | 8000 | 8000 |
| `alaw` | G.711 A-law, raw bytes | 8000 | 8000 |
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tts_engine.audio import CODEC_RATES, StreamEncoder, StreamingResampler, encode_audio, resample
from tts_engine.serving.errors import ApiError

ENGINE_RATE = 24000
PCM_RATES = (8000, 16000, 22050, 24000, 32000, 44100, 48000)
FORMAT_RATES: dict[str, tuple[int, ...]] = {
    "pcm": PCM_RATES, "wav": PCM_RATES, "flac": PCM_RATES, "mp3": PCM_RATES, "aac": PCM_RATES,
    "opus": tuple(sorted(CODEC_RATES["opus"])), "ulaw": (8000,), "alaw": (8000,),
}
FORMATS = tuple(FORMAT_RATES)
CONTENT_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm", "flac": "audio/flac", "mp3": "audio/mpeg",
                 "opus": "audio/ogg", "aac": "audio/aac", "ulaw": "audio/basic", "alaw": "audio/x-alaw-basic"}
SAMPLE_FORMATS = {"pcm": "s16le", "wav": "s16le", "ulaw": "mulaw", "alaw": "alaw"}


@dataclass(frozen=True)
class OutputFormat:
    name: str
    sample_rate: int

    @property
    def content_type(self) -> str:
        return CONTENT_TYPES[self.name]

    @property
    def headers(self) -> dict[str, str]:
        """What the HTTP answer says about the audio (X-Sample-Format only for raw samples)."""
        out = {"X-Sample-Rate": str(self.sample_rate), "X-Channels": "1"}
        if self.name in SAMPLE_FORMATS:
            out["X-Sample-Format"] = SAMPLE_FORMATS[self.name]
        return out


def output_format(name: str | None, sample_rate: int | None = None, *, format_param: str = "response_format",
                  rate_param: str = "sample_rate") -> OutputFormat:
    """Check a requested (format, rate) pair; `sample_rate` None means the format's default."""
    if not isinstance(name, str) or name.lower() not in FORMAT_RATES:
        raise ApiError("unsupported_response_format", f"unsupported {format_param} {name!r}; choose one of "
                       f"{', '.join(FORMATS)}", format_param)
    name = name.lower()
    rates = FORMAT_RATES[name]
    if sample_rate is None:
        return OutputFormat(name, ENGINE_RATE if ENGINE_RATE in rates else rates[0])
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, int) or sample_rate not in rates:
        raise ApiError("unsupported_sample_rate", f"{name} cannot be sent at {sample_rate!r} Hz; choose one of "
                       f"{', '.join(map(str, rates))}", rate_param)
    return OutputFormat(name, sample_rate)


class AudioEncoder:
    """Engine audio (float32, 24 kHz) in, bytes of `fmt` out, chunk by chunk.

    `push` returns what is ready now. `end_utterance` drains the resampler's few milliseconds of
    held-back output (call it where the speaker falls silent: raw formats then have delivered every
    sample said so far). `finish` ends the stream (trailers of containers); concatenating everything
    returned is one valid stream of the format.
    """

    def __init__(self, fmt: OutputFormat, source_rate: int = ENGINE_RATE):
        self.format = fmt
        self.resampler = StreamingResampler(source_rate, fmt.sample_rate)
        self.encoder = StreamEncoder(fmt.name, fmt.sample_rate)
        self.samples_out = 0

    def push(self, audio: np.ndarray) -> bytes:
        return self._encode(self.resampler.push(audio))

    def end_utterance(self) -> bytes:
        return self._encode(self.resampler.flush())

    def finish(self) -> bytes:
        return self.end_utterance() + self.encoder.finish()

    def close(self) -> None:
        self.encoder.close()

    def _encode(self, audio: np.ndarray) -> bytes:
        if not audio.size and self.encoder.started:
            return b""
        self.samples_out += audio.shape[0]
        return self.encoder.push(audio)


def encode_file(audio: np.ndarray, fmt: OutputFormat, source_rate: int = ENGINE_RATE) -> bytes:
    """A whole utterance as one file (wav/flac/mp3 with their real length in the header)."""
    return encode_audio(resample(audio, source_rate, fmt.sample_rate), fmt.sample_rate, fmt.name)
