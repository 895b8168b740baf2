"""Output formats on synthetic audio: the resampler keeps frequencies, resamples chunk by chunk exactly as
in one piece, G.711 is bit-exact with the reference C code, every encoder's stream decodes. No engine."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest
import soundfile as sf

from tts_engine.audio import (
    StreamEncoder,
    StreamingResampler,
    alaw_decode,
    alaw_encode,
    encode_audio,
    ulaw_decode,
    ulaw_encode,
)
from tts_engine.serving.errors import ApiError
from tts_engine.serving.formats import FORMAT_RATES, AudioEncoder, encode_file, output_format

SR = 24000


def _sine(freq: float, seconds: float = 1.0, sr: int = SR, amp: float = 0.5) -> np.ndarray:
    t = np.arange(int(seconds * sr)) / sr
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def _peak_hz(x: np.ndarray, sr: int) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.argmax(spectrum) * sr / len(x))


def _chunked(resampler: StreamingResampler, x: np.ndarray, sizes) -> np.ndarray:
    out, i, k = [], 0, 0
    while i < len(x):
        n = sizes[k % len(sizes)]
        out.append(resampler.push(x[i:i + n]))
        i, k = i + n, k + 1
    out.append(resampler.flush())
    return np.concatenate(out)


# ---- resampling ------------------------------------------------------------------------------------

@pytest.mark.parametrize("rate", [8000, 16000, 22050, 44100, 48000])
def test_a_resampled_sine_keeps_its_frequency_and_level(rate):
    freq = 1000.0
    y = _chunked(StreamingResampler(SR, rate), _sine(freq), [1920])
    assert len(y) == rate                                  # one second in, one second out
    assert abs(_peak_hz(y, rate) - freq) <= 2.0            # 1 Hz bins
    mid = y[rate // 10: -rate // 10]
    assert abs(np.sqrt(np.mean(mid ** 2)) - 0.5 / np.sqrt(2)) < 0.01


def test_a_real_resampler_removes_what_the_new_rate_cannot_carry():
    """Decimation would fold a 10 kHz tone to 2 kHz at 8 kHz; a band-limited resampler removes it."""
    y = _chunked(StreamingResampler(SR, 8000), _sine(10000.0), [1920])
    assert np.sqrt(np.mean(y[800:-800] ** 2)) < 1e-3
    aliased = _sine(10000.0)[::3]                          # what decimation gives
    assert np.sqrt(np.mean(aliased ** 2)) > 0.3


@pytest.mark.parametrize("rate", [8000, 16000, 48000])
def test_chunked_resampling_equals_resampling_the_whole(rate):
    import soxr

    rng = np.random.default_rng(0)
    x = (0.3 * rng.standard_normal(SR * 2)).astype(np.float32) + _sine(300.0, 2.0)
    whole = soxr.resample(x, SR, rate, quality="HQ")
    for sizes in ([1920], [1, 480, 37, 3840, 1920 * 5], [24000]):
        chunked = _chunked(StreamingResampler(SR, rate), x, sizes)
        assert len(chunked) == len(whole)
        assert np.abs(chunked - whole).max() < 1e-5, sizes


def test_no_resampling_at_the_engine_rate():
    x = _sine(440.0)
    r = StreamingResampler(SR, SR)
    assert np.array_equal(np.concatenate([r.push(x[:100]), r.push(x[100:]), r.flush()]), x)


# ---- G.711 -----------------------------------------------------------------------------------------

def test_g711_is_bit_exact_with_the_reference_implementation():
    audioop = pytest.importorskip("audioop")   # CPython's C port of the reference g711.c (Python <= 3.12)
    every = np.arange(-32768, 32768, dtype=np.int16)
    assert ulaw_encode(every).tobytes() == audioop.lin2ulaw(every.tobytes(), 2)
    assert alaw_encode(every).tobytes() == audioop.lin2alaw(every.tobytes(), 2)
    codes = bytes(range(256))
    assert ulaw_decode(codes).tobytes() == audioop.ulaw2lin(codes, 2)
    assert alaw_decode(codes).tobytes() == audioop.alaw2lin(codes, 2)


@pytest.mark.parametrize("encode, decode", [(ulaw_encode, ulaw_decode), (alaw_encode, alaw_decode)],
                         ids=["ulaw", "alaw"])
def test_g711_round_trip_is_within_its_quantization(encode, decode):
    x = (_sine(440.0, sr=8000) * 32767).astype(np.int16)
    y = decode(encode(x)).astype(np.int32)
    err = np.abs(y - x)
    # logarithmic steps: at most 1/32 of the magnitude (plus the smallest step near zero)
    assert (err <= np.abs(x) / 32 + 16).all()
    snr = 10 * np.log10(np.sum(x.astype(float) ** 2) / np.sum(err.astype(float) ** 2))
    assert snr > 30, snr


# ---- encoders --------------------------------------------------------------------------------------

def _decode_any(data: bytes) -> tuple[np.ndarray, int]:
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        frames = [f.to_ndarray().reshape(-1) for f in container.decode(stream)]
        rate = stream.codec_context.sample_rate
    out = np.concatenate(frames)
    return (out.astype(np.float32) / 32768 if out.dtype == np.int16 else out.astype(np.float32)), rate


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "opus", "aac"])
@pytest.mark.parametrize("rate", [16000, 24000, 48000])
def test_streamed_containers_decode_to_the_same_sound(fmt, rate):
    x = _sine(440.0, 1.0, rate, 0.3)
    enc = StreamEncoder(fmt, rate)
    data = b"".join([enc.push(x[i:i + rate // 25]) for i in range(0, rate, rate // 25)] + [enc.finish()])
    y, decoded_rate = _decode_any(data)
    if fmt == "opus":
        assert decoded_rate == 48000    # Opus always decodes at 48 kHz
    else:
        assert decoded_rate == rate
    assert abs(len(y) / decoded_rate - 1.0) < 0.1
    assert abs(_peak_hz(y[: decoded_rate // 2 * 2], decoded_rate) - 440) < 4
    if fmt in ("wav", "flac"):          # lossless: the very samples
        assert np.abs(y[: len(x)] - np.rint(x * 32767) / 32768).max() < 1e-4


def test_the_streamed_wav_header_says_unknown_length_and_the_rate():
    enc = StreamEncoder("wav", 8000)
    data = enc.push(_sine(440, 0.1, 8000)) + enc.finish()
    assert data[:4] == b"RIFF" and data[8:16] == b"WAVEfmt " and data[36:40] == b"data"
    assert int.from_bytes(data[24:28], "little") == 8000 and len(data) == 44 + 2 * 800


@pytest.mark.parametrize("fmt", ["opus", "aac", "ulaw", "alaw"])
def test_new_formats_as_whole_files(fmt):
    rate = 8000 if fmt in ("ulaw", "alaw") else 24000
    x = _sine(440.0, 0.5, rate, 0.3)
    data = encode_audio(x, rate, fmt)
    if fmt in ("ulaw", "alaw"):
        assert len(data) == len(x)
        y = (ulaw_decode if fmt == "ulaw" else alaw_decode)(data) / 32768
        assert np.abs(y - x).max() < 0.3 / 16
    else:
        y, _ = _decode_any(data)
        assert len(y) > 0


# ---- the serving layer's formats ---------------------------------------------------------------------

def test_output_format_checks_name_and_rate():
    assert output_format("pcm").sample_rate == 24000
    assert output_format("ulaw").sample_rate == 8000 and output_format("alaw", 8000).name == "alaw"
    assert output_format("pcm", 16000).headers["X-Sample-Rate"] == "16000"
    for bad_name in ("wma", None, 3):
        with pytest.raises(ApiError) as info:
            output_format(bad_name)
        assert info.value.code == "unsupported_response_format" and info.value.param == "response_format"
    for fmt, rate in [("ulaw", 16000), ("pcm", 11025), ("opus", 44100), ("pcm", "16000"), ("pcm", True)]:
        with pytest.raises(ApiError) as info:
            output_format(fmt, rate)
        assert info.value.code == "unsupported_sample_rate" and info.value.param == "sample_rate"
    assert set(FORMAT_RATES) == {"pcm", "wav", "flac", "mp3", "opus", "aac", "ulaw", "alaw"}


@pytest.mark.parametrize("fmt, rate", [("pcm", 8000), ("pcm", 16000), ("pcm", 48000), ("ulaw", 8000),
                                       ("alaw", 8000)])
def test_audio_encoder_streams_resampled_raw_samples_seamlessly(fmt, rate):
    x = _sine(700.0, 1.0)
    encoder = AudioEncoder(output_format(fmt, rate))
    streamed = b"".join([encoder.push(x[i:i + 1920]) for i in range(0, SR, 1920)] + [encoder.finish()])
    whole = encode_file(x, output_format(fmt, rate))
    assert len(streamed) == len(whole) == rate * (2 if fmt == "pcm" else 1)
    decode = {"pcm": lambda b: np.frombuffer(b, "<i2"), "ulaw": ulaw_decode, "alaw": alaw_decode}[fmt]
    a, b = decode(streamed).astype(np.int32), decode(whole).astype(np.int32)
    # the same samples up to one quantization step (float rounding of two soxr runs)
    assert np.abs(a - b).max() <= (1 if fmt == "pcm" else 512)
    assert abs(_peak_hz(a.astype(np.float32), rate) - 700) <= 2


def test_end_utterance_delivers_every_sample_said_so_far():
    encoder = AudioEncoder(output_format("pcm", 8000))
    got = encoder.push(_sine(440.0, 0.24))
    assert len(got) < 2 * 1920                      # the filter holds its delay back...
    got += encoder.end_utterance()
    assert len(got) == 2 * 1920                     # ...until the utterance ends
    wav = sf.read(io.BytesIO(encode_file(_sine(440.0, 0.24), output_format("wav", 8000))))[0]
    assert len(wav) == 1920
