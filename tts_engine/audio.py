"""PCM utilities shared by the whole engine: load, mix down, resample, validate, quantize, encode.

Conventions
-----------
* Waveforms are 1-D ``float32`` numpy arrays in [-1, 1] plus an ``int`` sample rate.
* Loading and resampling reproduce what the official ``qwen_tts`` package does to a reference clip
  (``Qwen3TTSModel.create_voice_clone_prompt`` and ``Qwen3TTSTokenizer.encode``), because the speaker
  embedding and the reference codes must come out the same as the reference implementation's:

  - a path goes through ``librosa.load(path, sr=None, mono=True)``: libsndfile decodes to float32 at
    the native rate (channels averaged in float32); files libsndfile cannot open (m4a/aac, ...) go
    through audioread, i.e. an ``ffmpeg`` subprocess that emits **int16** PCM scaled by 1/32768.
    We do the same with soundfile first and PyAV (in-process FFmpeg) converted to int16 second, so
    the result is identical for everything libsndfile reads and within 1 LSB (FFmpeg version
    rounding) for the rest, without needing an ``ffmpeg`` binary.
  - resampling is ``librosa.resample(y=wav.astype(float32), orig_sr, target_sr)`` with librosa's
    default ``res_type="soxr_hq"`` (pinned here explicitly so a librosa default change cannot
    silently drift from the checkpoints' behaviour).

* This module has no app/UI imports; librosa and PyAV are imported lazily (they are slow to import
  and only needed on some paths).
"""

from __future__ import annotations

import io
import math
import os
import struct
from pathlib import Path

import numpy as np
import soundfile as sf

__all__ = [
    "ENCODE_FORMATS",
    "MIME_TYPES",
    "AudioError",
    "AudioSource",
    "StreamEncoder",
    "StreamingResampler",
    "alaw_decode",
    "alaw_encode",
    "check_reference_clip",
    "duration_s",
    "encode_audio",
    "float_to_int16",
    "int16_to_float",
    "is_silent",
    "load_audio",
    "normalize_peak",
    "peak_dbfs",
    "resample",
    "to_mono",
    "ulaw_decode",
    "ulaw_encode",
    "validate_waveform",
]

#: Input accepted by :func:`load_audio`: a file path, encoded file bytes, or a decoded waveform as
#: ``(array, sr)`` (also ``(sr, array)``, the order Gradio's audio component uses).
AudioSource = str | os.PathLike | bytes | bytearray | tuple

#: Formats :func:`encode_audio` and :class:`StreamEncoder` produce. ``pcm`` is headerless int16
#: little-endian; ``ulaw`` / ``alaw`` are headerless G.711 bytes (one per sample); ``opus`` is Ogg Opus;
#: ``aac`` is AAC-LC in ADTS frames.
ENCODE_FORMATS: tuple[str, ...] = ("wav", "pcm", "flac", "mp3", "opus", "aac", "ulaw", "alaw")

#: Content types for HTTP responses, keyed like :data:`ENCODE_FORMATS`.
MIME_TYPES: dict[str, str] = {
    "wav": "audio/wav",
    "pcm": "audio/L16",
    "flac": "audio/flac",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "ulaw": "audio/basic",
    "alaw": "audio/x-alaw-basic",
}

#: Sample rates each codec can carry (None: any). Opus runs at 8/12/16/24/48 kHz only.
CODEC_RATES: dict[str, frozenset[int] | None] = {
    "opus": frozenset({8000, 12000, 16000, 24000, 48000}),
    "aac": frozenset({8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000}),
    "mp3": frozenset({8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000}),
}

# More channels than this along both axes means we cannot tell samples from channels.
_MAX_CHANNELS = 16
# Sample rates an MPEG-1/2/2.5 layer III stream can carry.
_MP3_RATES = CODEC_RATES["mp3"]


class AudioError(ValueError):
    """Bad or unusable audio input; the message says what is wrong and is safe to show to a user."""


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def load_audio(source: AudioSource) -> tuple[np.ndarray, int]:
    """Decode ``source`` to a mono float32 waveform at its native sample rate.

    ``source`` is a path (wav, flac, mp3, ogg/vorbis/opus, m4a/aac, anything FFmpeg reads), the bytes
    of such a file, or an already-decoded ``(array, sr)`` / ``(sr, array)`` pair. Integer arrays are
    treated as PCM and scaled to [-1, 1] (the official wrapper would only cast them, leaving values in
    the thousands); float arrays are only cast to float32, like the official wrapper does.

    No resampling happens here; call :func:`resample`. Raises :class:`AudioError` for a missing,
    empty, unreadable or corrupt file, for zero samples and for NaN/Inf samples. Silence is not an
    error here (see :func:`check_reference_clip`).
    """
    if isinstance(source, tuple):
        wav, sr = _split_array_pair(source)
        return validate_waveform(to_mono(_pcm_to_float(wav)), sr), sr
    if isinstance(source, (bytes, bytearray, memoryview)):
        if len(source) == 0:
            raise AudioError("audio data is empty (0 bytes)")
        wav, sr = _decode(bytes(source), name="audio data")
        return validate_waveform(wav, sr, name="audio data"), sr
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"unsupported audio source type {type(source).__name__}")

    path = Path(source).expanduser()
    if not path.exists():
        raise AudioError(f"audio file not found: {path}")
    if not path.is_file():
        raise AudioError(f"not a regular file: {path}")
    if path.stat().st_size == 0:
        raise AudioError(f"audio file is empty (0 bytes): {path}")
    wav, sr = _decode(str(path), name=str(path))
    return validate_waveform(wav, sr, name=str(path)), sr


def _decode(src: str | bytes, name: str) -> tuple[np.ndarray, int]:
    """soundfile first (bit-identical to librosa.load), then PyAV for what libsndfile cannot open."""
    try:
        # Same calls as librosa.load (SoundFile + read(frames=-1)); sf.read() seeks to frame 0 first,
        # which makes libsndfile's mp3 decoder return slightly different (1 ulp) samples.
        with sf.SoundFile(io.BytesIO(src) if isinstance(src, bytes) else src) as handle:
            sr = handle.samplerate
            data = handle.read(frames=-1, dtype="float32", always_2d=True)
    except Exception as sf_exc:  # noqa: BLE001 -- libsndfile: unknown container/codec, damaged header
        try:
            data, sr = _decode_pyav(io.BytesIO(src) if isinstance(src, bytes) else src)
        except AudioError as av_exc:
            raise AudioError(f"cannot read {name}: {av_exc}") from av_exc
        except Exception as av_exc:
            raise AudioError(
                f"cannot read {name}: not an audio file or corrupt "
                f"(soundfile: {_short(sf_exc)}; ffmpeg: {_short(av_exc)})"
            ) from av_exc
    if data.shape[0] == 0:
        raise AudioError(f"{name} contains no audio samples")
    # (frames, channels) -> mean over channels in float32, same arithmetic as librosa.to_mono.
    return to_mono(data, channel_axis=1), int(sr)


def _decode_pyav(src) -> tuple[np.ndarray, int]:
    """Decode the first audio stream to int16 then float32/32768, like audioread's ffmpeg backend."""
    import av  # lazy: only for formats libsndfile cannot read

    with av.open(src, mode="r") as container:
        if not container.streams.audio:
            raise AudioError("file has no audio stream")
        stream = container.streams.audio[0]
        to_s16 = av.AudioResampler(format="s16p")  # keep layout and rate, only change sample format
        chunks: list[np.ndarray] = []
        sr = 0
        for frame in container.decode(stream):
            for out in to_s16.resample(frame):
                sr = out.sample_rate
                chunks.append(out.to_ndarray())
        for out in to_s16.resample(None):
            chunks.append(out.to_ndarray())
    if not chunks:
        return np.zeros((0, 1), np.float32), sr or 1
    pcm = np.concatenate(chunks, axis=1)  # (channels, frames)
    return (pcm.T.astype(np.float32) * np.float32(1.0 / 32768.0)), int(sr)


def _short(exc: BaseException) -> str:
    msg = str(exc).strip() or type(exc).__name__
    return msg if len(msg) <= 160 else msg[:157] + "..."


def _split_array_pair(pair: tuple) -> tuple[np.ndarray, int]:
    """Accept ``(array, sr)`` and Gradio's ``(sr, array)``; the types make the order unambiguous."""
    if len(pair) != 2:
        raise AudioError("an audio tuple must be (array, sample_rate)")
    a, b = pair
    if isinstance(b, np.ndarray) and not isinstance(a, np.ndarray):
        a, b = b, a
    if not isinstance(a, np.ndarray):
        raise AudioError("an audio tuple must hold a numpy array and a sample rate")
    if isinstance(b, (bool, np.bool_)) or not isinstance(b, (int, np.integer, float, np.floating)):
        raise AudioError(f"invalid sample rate: {b!r}")
    if float(b) != int(b) or int(b) <= 0:
        raise AudioError(f"invalid sample rate: {b!r}")
    return a, int(b)


def _pcm_to_float(wav: np.ndarray) -> np.ndarray:
    """Scale integer PCM to [-1, 1]; cast floats to float32 unchanged."""
    if wav.dtype.kind == "f":
        return wav.astype(np.float32, copy=False)
    if wav.dtype.kind == "i":
        return (wav.astype(np.float32) / np.float32(2 ** (8 * wav.dtype.itemsize - 1))).astype(np.float32)
    if wav.dtype.kind == "u":  # unsigned PCM (e.g. 8-bit WAV) is offset by half the range
        half = 2 ** (8 * wav.dtype.itemsize - 1)
        return ((wav.astype(np.float64) - half) / half).astype(np.float32)
    raise AudioError(f"unsupported audio array dtype {wav.dtype}")


# --------------------------------------------------------------------------------------------
# Channels, rates, quantization
# --------------------------------------------------------------------------------------------


def to_mono(wav: np.ndarray, channel_axis: int | None = None) -> np.ndarray:
    """Average channels in float32 (what ``librosa.to_mono`` and the official wrapper do).

    1-D input is returned as float32. For 2-D input ``channel_axis`` defaults to the shorter axis
    (ties and the official ``np.mean(axis=-1)`` convention pick the last axis), so both the
    soundfile/Gradio ``(frames, channels)`` and torchaudio ``(channels, frames)`` layouts work.
    """
    wav = np.asarray(wav)
    if wav.dtype.kind != "f":
        wav = _pcm_to_float(wav)
    wav = wav.astype(np.float32, copy=False)
    if wav.ndim == 1:
        return wav
    if wav.ndim != 2:
        raise AudioError(f"audio array must be 1-D or 2-D, got shape {wav.shape}")
    if channel_axis is None:
        rows, cols = wav.shape
        if min(rows, cols) > _MAX_CHANNELS:
            raise AudioError(f"cannot tell channels from samples in an array of shape {wav.shape}")
        channel_axis = 0 if rows < cols else 1
    if wav.shape[channel_axis] == 1:
        return np.ascontiguousarray(wav.reshape(-1))
    return np.mean(wav, axis=channel_axis).astype(np.float32, copy=False)


def resample(wav: np.ndarray, sr_from: int, sr_to: int) -> np.ndarray:
    """Resample a mono waveform exactly as the official code does.

    Both official call sites (speaker embedding and tokenizer encode) run
    ``librosa.resample(y=wav.astype(np.float32), orig_sr=int(sr), target_sr=24000)`` with librosa's
    default ``res_type`` ``"soxr_hq"``, and skip the call when the rates already match. Output is
    float32 of length ``ceil(len * sr_to / sr_from)``.
    """
    wav = np.asarray(wav, dtype=np.float32)
    if int(sr_from) <= 0 or int(sr_to) <= 0:
        raise AudioError(f"invalid sample rates {sr_from} -> {sr_to}")
    if int(sr_from) == int(sr_to):
        return wav
    if not np.isfinite(wav).all():
        raise AudioError("audio contains NaN or Inf samples")
    import librosa  # lazy: slow import, only needed when rates differ

    return librosa.resample(y=wav, orig_sr=int(sr_from), target_sr=int(sr_to), res_type="soxr_hq")


def float_to_int16(wav: np.ndarray) -> np.ndarray:
    """Clip to [-1, 1] and scale by 32767 with rounding (symmetric, so -1.0 never wraps)."""
    wav = np.asarray(wav, dtype=np.float32)
    if not np.isfinite(wav).all():
        raise AudioError("audio contains NaN or Inf samples")
    return np.rint(np.clip(wav, -1.0, 1.0) * np.float32(32767.0)).astype(np.int16)


def int16_to_float(pcm: np.ndarray) -> np.ndarray:
    """Inverse of the usual PCM convention: int16 / 32768 as float32 (libsndfile's scale)."""
    return np.asarray(pcm, dtype=np.int16).astype(np.float32) / np.float32(32768.0)


# --------------------------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------------------------


def encode_audio(wav: np.ndarray, sr: int, fmt: str = "wav") -> bytes:
    """Encode a mono float waveform as one file in any of :data:`ENCODE_FORMATS`.

    All formats quantize with :func:`float_to_int16` first, so lossless outputs decode to exactly
    those int16 values. MP3 goes through libsndfile's LAME encoder when the bundled libsndfile has
    it (>= 1.1), otherwise through PyAV's libmp3lame; both write a gapless header so decoders return
    the original length. Opus (Ogg) and AAC (ADTS) go through PyAV, as :class:`StreamEncoder` does.
    No resampling happens here: `sr` must be one the codec carries (:data:`CODEC_RATES`).
    """
    fmt = _check_format(fmt, sr)
    wav = np.asarray(wav)
    if wav.ndim != 1:
        raise AudioError(f"encode_audio expects a mono 1-D waveform, got shape {wav.shape}")
    pcm = float_to_int16(wav)
    sr = int(sr)
    if fmt == "pcm":
        return pcm.astype("<i2").tobytes()
    if fmt == "ulaw":
        return ulaw_encode(pcm).tobytes()
    if fmt == "alaw":
        return alaw_encode(pcm).tobytes()
    if fmt == "mp3":
        if "MP3" in sf.available_formats():
            return _encode_soundfile(pcm, sr, "MP3", "MPEG_LAYER_III")
        return _encode_mp3_pyav(pcm, sr)
    if fmt in ("opus", "aac"):
        encoder = StreamEncoder(fmt, sr)
        return encoder.push(wav) + encoder.finish()
    return _encode_soundfile(pcm, sr, fmt.upper(), "PCM_16")


def _check_format(fmt: str, sr: int) -> str:
    fmt = fmt.lower().lstrip(".")
    if fmt not in ENCODE_FORMATS:
        raise AudioError(f"unsupported output format {fmt!r}; choose one of {', '.join(ENCODE_FORMATS)}")
    if int(sr) <= 0:
        raise AudioError(f"invalid sample rate: {sr}")
    rates = CODEC_RATES.get(fmt)
    if rates is not None and int(sr) not in rates:
        raise AudioError(f"{fmt} cannot carry {sr} Hz; resample to one of {sorted(rates)}")
    return fmt


def _encode_soundfile(pcm: np.ndarray, sr: int, container: str, subtype: str) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, pcm, sr, format=container, subtype=subtype)
    return buf.getvalue()


def _encode_mp3_pyav(pcm: np.ndarray, sr: int) -> bytes:
    """MP3 through PyAV's bundled libmp3lame (fallback when libsndfile was built without LAME)."""
    import av

    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp3") as out:
        stream = out.add_stream("libmp3lame", rate=sr, layout="mono")
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = sr
        for packet in stream.encode(frame):  # PyAV re-frames to the codec's 1152-sample frames
            out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


# --------------------------------------------------------------------------------------------
# G.711 (ITU-T): mu-law and A-law, the telephony codecs (8 kHz, one byte per sample)
# --------------------------------------------------------------------------------------------
# Bit-exact with the reference C code (Sun's g711.c, as in CPython's audioop): mu-law quantizes the
# top 14 bits of a 16-bit sample, A-law the top 13.

_ULAW_SEG_END = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF], np.int32)
_ALAW_SEG_END = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF], np.int32)


def ulaw_encode(pcm: np.ndarray) -> np.ndarray:
    """int16 PCM -> G.711 mu-law bytes (uint8)."""
    val = np.asarray(pcm, dtype=np.int16).astype(np.int32) >> 2
    mask = np.where(val < 0, 0x7F, 0xFF)
    val = np.minimum(np.abs(val), 8159) + (0x84 >> 2)
    seg = np.searchsorted(_ULAW_SEG_END, val, side="left")
    uval = (np.minimum(seg, 7) << 4) | ((val >> (np.minimum(seg, 7) + 1)) & 0xF)
    uval = np.where(seg >= 8, 0x7F, uval)
    return (uval ^ mask).astype(np.uint8)


def alaw_encode(pcm: np.ndarray) -> np.ndarray:
    """int16 PCM -> G.711 A-law bytes (uint8)."""
    val = np.asarray(pcm, dtype=np.int16).astype(np.int32) >> 3
    mask = np.where(val >= 0, 0xD5, 0x55)
    val = np.where(val >= 0, val, -val - 1)
    seg = np.searchsorted(_ALAW_SEG_END, val, side="left")
    shift = np.where(seg < 2, 1, np.minimum(seg, 7))
    aval = (np.minimum(seg, 7) << 4) | ((val >> shift) & 0xF)
    aval = np.where(seg >= 8, 0x7F, aval)
    return (aval ^ mask).astype(np.uint8)


def _ulaw_table() -> np.ndarray:
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    t = (((u & 0x0F) << 3) + 0x84) << ((u & 0x70) >> 4)
    return np.where(u & 0x80, 0x84 - t, t - 0x84).astype(np.int16)


def _alaw_table() -> np.ndarray:
    a = np.arange(256, dtype=np.int32) ^ 0x55
    t = (a & 0x0F) << 4
    seg = (a & 0x70) >> 4
    t = np.where(seg == 0, t + 8, t + 0x108)
    t = np.where(seg > 1, t << np.maximum(seg - 1, 0), t)
    return np.where(a & 0x80, t, -t).astype(np.int16)


_ULAW_TO_PCM = _ulaw_table()
_ALAW_TO_PCM = _alaw_table()


def ulaw_decode(data: bytes | np.ndarray) -> np.ndarray:
    """G.711 mu-law bytes -> int16 PCM."""
    return _ULAW_TO_PCM[np.frombuffer(bytes(data), np.uint8) if not isinstance(data, np.ndarray) else data]


def alaw_decode(data: bytes | np.ndarray) -> np.ndarray:
    """G.711 A-law bytes -> int16 PCM."""
    return _ALAW_TO_PCM[np.frombuffer(bytes(data), np.uint8) if not isinstance(data, np.ndarray) else data]


# --------------------------------------------------------------------------------------------
# Streaming: a resampler and an encoder that keep their state from chunk to chunk
# --------------------------------------------------------------------------------------------


class StreamingResampler:
    """soxr (the same "HQ" filter as :func:`resample`) fed chunk by chunk.

    The filter's history is carried across `push` calls, so the concatenated output equals one
    resampling of the concatenated input (chunk boundaries are seamless; measured identical to
    ``soxr.resample`` on the whole signal). The filter holds back a few milliseconds of output
    (its delay) until more input arrives or `flush` is called; `flush` ends the signal (emits the
    tail) and starts afresh, for the end of an utterance.
    """

    def __init__(self, sr_from: int, sr_to: int):
        if int(sr_from) <= 0 or int(sr_to) <= 0:
            raise AudioError(f"invalid sample rates {sr_from} -> {sr_to}")
        self.sr_from, self.sr_to = int(sr_from), int(sr_to)
        self._stream = None

    @property
    def passthrough(self) -> bool:
        return self.sr_from == self.sr_to

    def push(self, wav: np.ndarray) -> np.ndarray:
        wav = np.asarray(wav, dtype=np.float32).reshape(-1)
        if self.passthrough:
            return wav
        if not np.isfinite(wav).all():
            raise AudioError("audio contains NaN or Inf samples")
        if self._stream is None:
            import soxr  # lazy, like librosa

            self._stream = soxr.ResampleStream(self.sr_from, self.sr_to, 1, dtype="float32", quality="HQ")
        return self._stream.resample_chunk(wav) if wav.size else np.zeros(0, np.float32)

    def flush(self) -> np.ndarray:
        """The held-back tail; the next `push` starts a new signal."""
        if self._stream is None:
            return np.zeros(0, np.float32)
        tail = self._stream.resample_chunk(np.zeros(0, np.float32), last=True)
        self._stream = None
        return tail


class _Sink:
    """A write-only file for PyAV: collects what the muxer writes until it is taken."""

    def __init__(self):
        self.parts: list[bytes] = []

    def write(self, data) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out, self.parts = b"".join(self.parts), []
        return out


# format -> (PyAV container, codec, muxer options). Streams written to a non-seekable sink: headers
# that would be patched at the end (mp3's Xing frame, FLAC's sample count) say "unknown length".
_AV_FORMATS = {
    "opus": ("ogg", "libopus", {"page_duration": "20000"}),   # one Ogg page per 20 ms: low latency
    "aac": ("adts", "aac", {}),
    "mp3": ("mp3", "libmp3lame", {"write_xing": "0", "id3v2_version": "0"}),
    "flac": ("flac", "flac", {}),
}


class StreamEncoder:
    """Encode a mono stream chunk by chunk: ``push(float32) -> bytes`` ready now, ``finish()`` the rest.

    The concatenation of everything returned is one valid file/stream of `fmt` at `sr` (no
    resampling here). ``pcm``/``ulaw``/``alaw`` are returned sample for sample; ``wav`` starts with a
    header of unknown length (0xFFFFFFFF sizes, as streaming servers send); ``opus`` (Ogg), ``aac``
    (ADTS), ``mp3`` and ``flac`` go through PyAV's encoders, which hold back up to one codec frame
    (20 ms for Opus, 1152 samples for MP3) until more audio or `finish`.
    """

    def __init__(self, fmt: str, sr: int):
        self.fmt, self.sr = _check_format(fmt, sr), int(sr)
        self._started = False
        self._finished = False
        self._container = self._stream = self._sink = None
        self._pts = 0

    @property
    def started(self) -> bool:
        return self._started

    def push(self, wav: np.ndarray) -> bytes:
        if self._finished:
            raise AudioError("the stream is finished")
        pcm = float_to_int16(np.asarray(wav, dtype=np.float32).reshape(-1))
        head = b"" if self._started else self._header()
        self._started = True
        if self.fmt in _AV_FORMATS:
            return head + self._av_push(pcm)
        if self.fmt == "ulaw":
            return head + ulaw_encode(pcm).tobytes()
        if self.fmt == "alaw":
            return head + alaw_encode(pcm).tobytes()
        return head + pcm.astype("<i2", copy=False).tobytes()   # pcm, wav

    def finish(self) -> bytes:
        if self._finished:
            return b""
        out = b"" if self._started else self._header()
        self._started = self._finished = True
        if self.fmt in _AV_FORMATS:
            if self._container is None:
                self._av_open()
            for packet in self._stream.encode(None):
                self._container.mux(packet)
            self._container.close()
            out += self._sink.take()
        return out

    def close(self) -> None:
        """Drop the encoder without finishing the stream (the client went away)."""
        self._finished = True
        if self._container is not None:
            try:
                self._container.close()
            except Exception:  # noqa: BLE001 -- best effort: nothing will read this stream
                pass

    def _header(self) -> bytes:
        if self.fmt != "wav":
            return b""
        unknown = 0xFFFFFFFF
        return (b"RIFF" + struct.pack("<I", unknown) + b"WAVE" + b"fmt " +
                struct.pack("<IHHIIHH", 16, 1, 1, self.sr, self.sr * 2, 2, 16) + b"data" + struct.pack("<I", unknown))

    def _av_open(self) -> None:
        import av  # lazy: only for compressed formats

        container, codec, options = _AV_FORMATS[self.fmt]
        self._sink = _Sink()
        self._container = av.open(self._sink, mode="w", format=container, options=dict(options))
        self._stream = self._container.add_stream(codec, rate=self.sr, layout="mono")

    def _av_push(self, pcm: np.ndarray) -> bytes:
        import av

        if self._container is None:
            self._av_open()
        if pcm.size:
            frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
            frame.sample_rate, frame.pts = self.sr, self._pts
            self._pts += pcm.size
            for packet in self._stream.encode(frame):
                self._container.mux(packet)
        return self._sink.take()


# --------------------------------------------------------------------------------------------
# Validation helpers (pure functions with parameters; the app picks the limits)
# --------------------------------------------------------------------------------------------


def duration_s(wav: np.ndarray, sr: int) -> float:
    """Length in seconds."""
    return len(wav) / float(sr)


def peak_dbfs(wav: np.ndarray) -> float:
    """Peak level in dBFS (``-inf`` for digital silence)."""
    peak = float(np.max(np.abs(wav))) if len(wav) else 0.0
    return 20.0 * math.log10(peak) if peak > 0 else -math.inf


def is_silent(wav: np.ndarray, threshold_dbfs: float = -60.0) -> bool:
    """True when the peak never reaches ``threshold_dbfs`` (-60 dBFS = 0.001 full scale)."""
    return peak_dbfs(wav) < threshold_dbfs


def normalize_peak(wav: np.ndarray, peak: float = 0.95) -> np.ndarray:
    """Scale so the absolute peak equals ``peak``; silence is returned unchanged.

    Not applied to reference clips: the official pipeline feeds them unnormalized.
    """
    wav = np.asarray(wav, dtype=np.float32)
    current = float(np.max(np.abs(wav))) if len(wav) else 0.0
    return wav if current == 0.0 else (wav * np.float32(peak / current)).astype(np.float32)


def validate_waveform(wav: np.ndarray, sr: int, name: str = "audio") -> np.ndarray:
    """Check a decoded waveform is usable: 1-D float32, non-empty, finite, positive ``sr``."""
    wav = np.asarray(wav)
    if wav.ndim != 1:
        raise AudioError(f"{name} must be mono 1-D, got shape {wav.shape}")
    if int(sr) <= 0:
        raise AudioError(f"{name} has an invalid sample rate: {sr}")
    if wav.size == 0:
        raise AudioError(f"{name} contains no audio samples")
    if not np.isfinite(wav).all():
        raise AudioError(f"{name} contains NaN or Inf samples")
    return wav.astype(np.float32, copy=False)


def check_reference_clip(
    wav: np.ndarray,
    sr: int,
    min_s: float = 1.0,
    max_s: float = 30.0,
    silence_dbfs: float = -60.0,
) -> tuple[np.ndarray, str]:
    """Validate a voice-clone reference clip; return ``(clip, notice)``.

    Raises :class:`AudioError` for empty, NaN/Inf, silent (peak below ``silence_dbfs``) or clips
    shorter than ``min_s``. A clip longer than ``max_s`` is cut to its first ``max_s`` seconds
    (the reference is prefilled into the talker, so its length is prompt length and latency) and
    ``notice`` says so; otherwise ``notice`` is ``""``.
    """
    wav = validate_waveform(wav, sr, name="reference audio")
    if is_silent(wav, silence_dbfs):
        raise AudioError(f"reference audio is silent (peak {peak_dbfs(wav):.1f} dBFS, below {silence_dbfs:g} dBFS)")
    length = duration_s(wav, sr)
    if length < min_s:
        raise AudioError(f"reference audio is too short: {length:.2f} s (minimum {min_s:g} s)")
    if length > max_s:
        keep = round(max_s * sr)
        notice = (
            f"Reference audio is {length:.1f} s long; only the first {max_s:g} s are used "
            "(a transcript should cover only that part)."
        )
        return wav[:keep], notice
    return wav, ""
