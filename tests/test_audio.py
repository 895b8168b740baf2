"""Tests for tts_engine.audio: decoding parity with the official loader, encoders, errors, helpers.

The official reference path loads a file with ``librosa.load(path, sr=None, mono=True)`` and resamples
with ``librosa.resample``; those are the oracles here. Fixture clips come from espeak-ng (real speech)
converted with ffmpeg/sox once per session.
"""

from __future__ import annotations

import io
import math
import shutil
import subprocess
import warnings
from pathlib import Path

import librosa
import numpy as np
import pytest
import soundfile as sf

from tts_engine import audio
from tts_engine.audio import AudioError

SENTENCE = "Voice cloning needs a clean reference clip of a few seconds."


def make_speech_clip(path: Path) -> Path:
    """Real speech from espeak-ng (22050 Hz mono int16); a voiced synthetic stand-in without it."""
    if shutil.which("espeak-ng"):
        subprocess.run(["espeak-ng", "-w", str(path), SENTENCE], check=True, capture_output=True)
        return path
    sr = 22050
    t = np.arange(int(2.5 * sr)) / sr
    f0 = 120 + 30 * np.sin(2 * np.pi * 1.5 * t)
    phase = 2 * np.pi * np.cumsum(f0) / sr
    voiced = sum(np.sin(k * phase) / k for k in range(1, 12)) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t)) ** 2
    sf.write(path, (0.3 * voiced / np.abs(voiced).max()).astype(np.float32), sr, subtype="PCM_16")
    return path


def _ffmpeg(src: Path, dst: Path, *args: str) -> Path:
    subprocess.run(["ffmpeg", "-v", "error", "-y", "-i", str(src), *args, str(dst)], check=True)
    return dst


def _librosa_load(path: Path) -> tuple[np.ndarray, int]:
    """The official path loader (``Qwen3TTSModel._load_audio_to_np`` / ``Qwen3TTSTokenizer.load_audio``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "PySoundFile failed. Trying audioread" for m4a
        wav, sr = librosa.load(str(path), sr=None, mono=True)
    return wav, int(sr)


@pytest.fixture(scope="session")
def clips(tmp_path_factory) -> dict[str, Path]:
    """The espeak clip in every input format, plus a stereo clip whose channels differ."""
    d = tmp_path_factory.mktemp("audio_clips")
    mono = make_speech_clip(d / "speech.wav")
    wav, sr = sf.read(mono, dtype="float32")
    # Right channel: delayed and quieter, so a wrong mixdown (one channel only, sum) is visible.
    right = np.concatenate([np.zeros(300, np.float32), wav[:-300]]) * np.float32(0.5)
    sf.write(d / "stereo.wav", np.stack([wav, right], axis=1), sr, subtype="PCM_16")
    out = {"wav": mono, "stereo_wav": d / "stereo.wav"}
    if shutil.which("ffmpeg"):
        out["flac"] = _ffmpeg(mono, d / "speech.flac")
        out["mp3"] = _ffmpeg(mono, d / "speech.mp3", "-b:a", "64k")
        out["ogg"] = _ffmpeg(mono, d / "speech.ogg", "-c:a", "libvorbis")
        out["m4a"] = _ffmpeg(d / "stereo.wav", d / "speech.m4a", "-ar", "44100", "-c:a", "aac")
    elif shutil.which("sox"):
        out["flac"] = d / "speech.flac"
        subprocess.run(["sox", str(mono), str(out["flac"])], check=True)
    return out


def _need(clips: dict[str, Path], key: str) -> Path:
    if key not in clips:
        pytest.skip(f"no converter available to make a {key} clip (install ffmpeg)")
    return clips[key]


# ------------------------------------------------------------------------------------------
# Loading: parity with the official librosa.load path
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["wav", "stereo_wav", "flac", "mp3", "ogg"])
def test_load_matches_official_loader_exactly(clips, fmt):
    path = _need(clips, fmt)
    wav, sr = audio.load_audio(path)
    ref, ref_sr = _librosa_load(path)
    assert wav.dtype == np.float32 and wav.ndim == 1
    assert sr == ref_sr
    assert wav.shape == ref.shape
    np.testing.assert_array_equal(wav, ref)


def test_load_m4a_via_ffmpeg_within_one_lsb(clips):
    """libsndfile cannot read AAC; librosa falls back to an ffmpeg subprocess emitting int16."""
    path = _need(clips, "m4a")
    with pytest.raises(sf.LibsndfileError):
        sf.info(str(path))
    wav, sr = audio.load_audio(path)
    ref, ref_sr = _librosa_load(path)
    assert sr == ref_sr == 44100
    assert wav.shape == ref.shape
    # Decoder-version rounding only; m4a priming makes the lengths/offsets a sensitive check.
    assert np.abs(wav - ref).max() <= 2 / 32768
    assert np.abs(wav).max() > 0.1


def test_stereo_file_is_channel_mean(clips):
    stereo, sr = sf.read(clips["stereo_wav"], dtype="float32")
    wav, sr2 = audio.load_audio(clips["stereo_wav"])
    assert sr2 == sr
    np.testing.assert_array_equal(wav, (stereo[:, 0] + stereo[:, 1]) / np.float32(2))
    assert not np.allclose(wav, stereo[:, 0])


def test_load_bytes_equals_path(clips):
    for key in ("wav", "m4a"):
        if key in clips:
            from_path = audio.load_audio(clips[key])
            from_bytes = audio.load_audio(clips[key].read_bytes())
            assert from_bytes[1] == from_path[1]
            np.testing.assert_array_equal(from_bytes[0], from_path[0])


# ------------------------------------------------------------------------------------------
# (array, sr) inputs and mixdown
# ------------------------------------------------------------------------------------------


def test_array_input_float64_and_sr_order():
    x = np.linspace(-0.5, 0.5, 1000)
    wav, sr = audio.load_audio((x, 16000))
    assert sr == 16000 and wav.dtype == np.float32
    np.testing.assert_array_equal(wav, x.astype(np.float32))
    wav2, sr2 = audio.load_audio((16000, x))  # Gradio order
    assert sr2 == 16000
    np.testing.assert_array_equal(wav2, wav)


def test_array_input_int16_is_scaled():
    pcm = np.array([0, 16384, -32768, 32767], dtype=np.int16)
    wav, _ = audio.load_audio((pcm, 8000))
    np.testing.assert_allclose(wav, [0.0, 0.5, -1.0, 32767 / 32768], rtol=0, atol=1e-7)


@pytest.mark.parametrize("channels_first", [False, True])
def test_array_stereo_mixdown_both_layouts(channels_first):
    rng = np.random.default_rng(0)
    left, right = (rng.uniform(-0.5, 0.5, 4000).astype(np.float32) for _ in range(2))
    frames_x_ch = np.stack([left, right], axis=1)
    arr = frames_x_ch.T.copy() if channels_first else frames_x_ch
    wav, sr = audio.load_audio((arr, 24000))
    assert wav.shape == (4000,) and sr == 24000
    # Official (array, sr) convention: np.mean(axis=-1) on (frames, channels), in float32.
    np.testing.assert_array_equal(wav, np.mean(frames_x_ch, axis=-1))


def test_to_mono_explicit_axis_and_ambiguous_shape():
    x = np.ones((3, 5), np.float32) * np.arange(3, dtype=np.float32)[:, None]
    np.testing.assert_array_equal(audio.to_mono(x, channel_axis=0), np.full(5, 1.0, np.float32))
    with pytest.raises(AudioError, match="channels"):
        audio.to_mono(np.zeros((100, 200), np.float32))


# ------------------------------------------------------------------------------------------
# Errors
# ------------------------------------------------------------------------------------------


def test_missing_file(tmp_path):
    with pytest.raises(AudioError, match="not found"):
        audio.load_audio(tmp_path / "nope.wav")


def test_directory_is_rejected(tmp_path):
    with pytest.raises(AudioError, match="not a regular file"):
        audio.load_audio(tmp_path)


def test_empty_file(tmp_path):
    p = tmp_path / "empty.wav"
    p.write_bytes(b"")
    with pytest.raises(AudioError, match="empty"):
        audio.load_audio(p)
    with pytest.raises(AudioError, match="empty"):
        audio.load_audio(b"")


def test_text_file_renamed_wav(tmp_path):
    p = tmp_path / "notes.wav"
    p.write_text("this is not audio, just some text\n" * 50)
    with pytest.raises(AudioError, match="not an audio file or corrupt") as exc:
        audio.load_audio(p)
    assert "notes.wav" in str(exc.value)


def test_truncated_header(clips, tmp_path):
    p = tmp_path / "truncated.wav"
    p.write_bytes(clips["wav"].read_bytes()[:30])
    with pytest.raises(AudioError, match="not an audio file or corrupt"):
        audio.load_audio(p)


def test_header_without_samples(tmp_path):
    p = tmp_path / "zero.wav"
    sf.write(p, np.zeros(0, np.float32), 16000, subtype="PCM_16")
    with pytest.raises(AudioError, match="no audio samples"):
        audio.load_audio(p)
    with pytest.raises(AudioError, match="no audio samples"):
        audio.load_audio((np.zeros(0, np.float32), 16000))


def test_nan_and_bad_sr():
    x = np.zeros(100, np.float32)
    x[5] = np.nan
    with pytest.raises(AudioError, match="NaN"):
        audio.load_audio((x, 16000))
    with pytest.raises(AudioError, match="sample rate"):
        audio.load_audio((np.zeros(10, np.float32), 0))
    with pytest.raises(AudioError, match="NaN"):
        audio.float_to_int16(x)
    with pytest.raises(TypeError):
        audio.load_audio(12345)


def test_audio_error_is_value_error():
    assert issubclass(AudioError, ValueError)


# ------------------------------------------------------------------------------------------
# Resampling and quantization
# ------------------------------------------------------------------------------------------


def test_resample_matches_official_call(clips):
    wav, sr = audio.load_audio(clips["wav"])
    out = audio.resample(wav, sr, 24000)
    # The official call, verbatim (librosa default res_type).
    ref = librosa.resample(y=wav.astype(np.float32), orig_sr=int(sr), target_sr=24000)
    assert out.dtype == np.float32
    assert len(out) == math.ceil(len(wav) * 24000 / sr)
    np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(audio.resample(wav, sr, sr), wav)


def test_float_to_int16():
    x = np.array([0.0, 0.5, -0.5, 1.0, -1.0, 1.7, -3.0, 1e-5], np.float32)
    pcm = audio.float_to_int16(x)
    assert pcm.dtype == np.int16
    np.testing.assert_array_equal(pcm, [0, 16384, -16384, 32767, -32767, 32767, -32767, 0])


# ------------------------------------------------------------------------------------------
# Encoding
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def speech24k(clips) -> np.ndarray:
    wav, sr = audio.load_audio(clips["wav"])
    return audio.resample(wav, sr, 24000)


@pytest.mark.parametrize("fmt", ["wav", "flac"])
def test_encode_lossless_roundtrip(speech24k, fmt):
    data = audio.encode_audio(speech24k, 24000, fmt)
    decoded, sr = sf.read(io.BytesIO(data), dtype="int16")
    assert sr == 24000
    np.testing.assert_array_equal(decoded, audio.float_to_int16(speech24k))
    # and through our own loader
    back, sr2 = audio.load_audio(data)
    assert sr2 == 24000 and len(back) == len(speech24k)


def test_encode_pcm_is_raw_int16_le(speech24k):
    data = audio.encode_audio(speech24k, 24000, "pcm")
    assert len(data) == 2 * len(speech24k)
    np.testing.assert_array_equal(np.frombuffer(data, "<i2"), audio.float_to_int16(speech24k))


def _check_mp3(data: bytes, ref: np.ndarray, sr: int) -> None:
    assert data[:3] == b"ID3" or (data[0] == 0xFF and data[1] & 0xE0 == 0xE0)
    decoded, dsr = audio.load_audio(data)
    assert dsr == sr
    assert abs(len(decoded) - len(ref)) <= 1152  # at most one MPEG frame of padding
    n = min(len(decoded), len(ref))
    # Lossy but the same signal: high correlation at zero lag (no encoder-delay shift).
    corr = np.corrcoef(decoded[:n], ref[:n])[0, 1]
    assert corr > 0.95, corr


def test_encode_mp3_decodable(speech24k):
    data = audio.encode_audio(speech24k, 24000, "mp3")
    _check_mp3(data, speech24k, 24000)
    # PyAV decodes it too (what a browser-side ffmpeg would see)
    import av

    with av.open(io.BytesIO(data)) as c:
        assert c.streams.audio[0].codec_context.name in ("mp3", "mp3float")
        assert c.streams.audio[0].rate == 24000


def test_encode_mp3_pyav_fallback(speech24k):
    _check_mp3(audio._encode_mp3_pyav(audio.float_to_int16(speech24k), 24000), speech24k, 24000)


def test_encode_errors(speech24k):
    with pytest.raises(AudioError, match="unsupported output format"):
        audio.encode_audio(speech24k, 24000, "aiff")
    with pytest.raises(AudioError, match="mp3 cannot carry"):
        audio.encode_audio(speech24k, 23000, "mp3")
    with pytest.raises(AudioError, match="mono"):
        audio.encode_audio(np.zeros((10, 2), np.float32), 24000, "wav")
    assert set(audio.MIME_TYPES) == set(audio.ENCODE_FORMATS)


# ------------------------------------------------------------------------------------------
# Reference-clip checks and helpers
# ------------------------------------------------------------------------------------------


def test_check_reference_clip_ok(speech24k):
    clip, notice = audio.check_reference_clip(speech24k, 24000)
    assert notice == ""
    np.testing.assert_array_equal(clip, speech24k)


def test_check_reference_clip_trims_long(speech24k):
    long = np.tile(speech24k, 20)
    clip, notice = audio.check_reference_clip(long, 24000, max_s=10.0)
    assert len(clip) == 240000
    np.testing.assert_array_equal(clip, long[:240000])
    assert "10 s" in notice and "first" in notice


def test_check_reference_clip_too_short(speech24k):
    with pytest.raises(AudioError, match="too short: 0.50 s"):
        audio.check_reference_clip(speech24k[:12000], 24000, min_s=1.0)


def test_check_reference_clip_silent():
    with pytest.raises(AudioError, match="silent"):
        audio.check_reference_clip(np.zeros(48000, np.float32), 24000)
    quiet = (np.random.default_rng(0).standard_normal(48000) * 1e-5).astype(np.float32)
    with pytest.raises(AudioError, match="silent"):
        audio.check_reference_clip(quiet, 24000)


def test_check_reference_clip_silent_file(tmp_path):
    p = tmp_path / "silence.wav"
    sf.write(p, np.zeros(32000, np.float32), 16000)
    wav, sr = audio.load_audio(p)  # loading silence is fine ...
    with pytest.raises(AudioError, match="silent"):  # ... using it as a reference is not
        audio.check_reference_clip(wav, sr)


def test_level_helpers():
    x = np.array([0.0, 0.25, -0.5], np.float32)
    assert audio.peak_dbfs(x) == pytest.approx(20 * math.log10(0.5))
    assert audio.peak_dbfs(np.zeros(3)) == -math.inf
    assert audio.duration_s(np.zeros(48000), 24000) == 2.0
    y = audio.normalize_peak(x, 0.9)
    assert np.abs(y).max() == pytest.approx(0.9) and y.dtype == np.float32
    assert not audio.is_silent(x) and audio.is_silent(x * 1e-4)
