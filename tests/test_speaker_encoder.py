"""Parity of our ECAPA-TDNN speaker encoder with the official ``qwen_tts`` one.

A tiny official ``Qwen3TTSSpeakerEncoder`` with seeded random weights is the oracle. Its reference
embedding is produced by running the official ``Qwen3TTSModel.create_voice_clone_prompt`` itself (on a
stub model whose ``extract_speaker_embedding`` is the real official method), so the official file
loading, mixdown and resampling are part of what we compare against. The stub codec records what the
official tokenizer would feed the 12 Hz encoder, which checks the reference-code input path too.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf
import torch
from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSSpeakerEncoderConfig
from qwen_tts.core.models.modeling_qwen3_tts import (
    Qwen3TTSForConditionalGeneration,
    Qwen3TTSSpeakerEncoder,
    mel_spectrogram,
)
from qwen_tts.inference.qwen3_tts_model import Qwen3TTSModel
from qwen_tts.inference.qwen3_tts_tokenizer import Qwen3TTSTokenizer

from tts_engine.audio import load_audio, resample
from tts_engine.models.qwen3_tts.speaker_encoder import (
    SpeakerEncoder,
    SpeakerEncoderConfig,
    log_mel_spectrogram,
)

TINY = {"enc_dim": 128, "enc_channels": [32, 32, 32, 32, 96], "enc_attention_channels": 16, "enc_se_channels": 16}
TOL = 1e-5


def _speech_clip(path: Path, text: str) -> Path:
    if shutil.which("espeak-ng"):
        subprocess.run(["espeak-ng", "-w", str(path), text], check=True, capture_output=True)
        return path
    sr = 22050  # voiced stand-in when espeak-ng is missing
    t = np.arange(int(2.5 * sr)) / sr
    phase = 2 * np.pi * np.cumsum(110 + 40 * np.sin(2 * np.pi * (1 + len(text) % 3) * t)) / sr
    voiced = sum(np.sin(k * phase) / k for k in range(1, 12)) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t)) ** 2
    sf.write(path, (0.3 * voiced / np.abs(voiced).max()).astype(np.float32), sr, subtype="PCM_16")
    return path


@pytest.fixture(scope="session")
def clip_paths(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("spk_clips")
    speech = _speech_clip(d / "speech.wav", "The speaker encoder turns a short clip into one vector.")
    other = _speech_clip(d / "other.wav", "Completely different words, said a little later on.")
    # 24 kHz stereo file: exercises the no-resample branch and librosa's mono mixdown.
    wav, sr = sf.read(speech, dtype="float32")
    w24 = resample(wav, sr, 24000)
    right = np.concatenate([np.zeros(500, np.float32), w24[:-500]]) * np.float32(0.7)
    sf.write(d / "stereo24k.wav", np.stack([w24, right], axis=1), 24000, subtype="FLOAT")
    return {"speech": speech, "other": other, "stereo24k": d / "stereo24k.wav"}


def _randomize(module: torch.nn.Module, seed: int = 1234) -> None:
    """Seeded random weights with fan-in scaling, so activations stay O(1) through the whole net."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=g) / (p.shape[1] * p.shape[2]) ** 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)


@pytest.fixture(scope="session")
def official() -> Qwen3TTSSpeakerEncoder:
    enc = Qwen3TTSSpeakerEncoder(Qwen3TTSSpeakerEncoderConfig(**TINY)).eval()
    _randomize(enc)
    return enc


@pytest.fixture(scope="session")
def ours(official) -> SpeakerEncoder:
    return SpeakerEncoder(TINY).eval().load_official_state_dict(official.state_dict())


class _RecordingCodec:
    """Stands in for ``speech_tokenizer``: runs the official input normalization and records it."""

    def __init__(self) -> None:
        self.tokenizer = Qwen3TTSTokenizer()
        self.tokenizer.feature_extractor = SimpleNamespace(sampling_rate=24000)
        self.inputs: list[np.ndarray] = []

    def encode(self, audios, sr=None):
        self.inputs = self.tokenizer._normalize_audio_inputs(audios, sr=sr)
        return SimpleNamespace(audio_codes=[torch.zeros(1, 16, dtype=torch.long) for _ in self.inputs])


def _official_voice_clone_prompt(official_encoder, ref_audio, dtype=torch.float32):
    """Run the official create_voice_clone_prompt; return (ref_spk_embedding, codec input wav)."""
    host = SimpleNamespace(speaker_encoder=official_encoder, device=torch.device("cpu"), dtype=dtype)
    codec = _RecordingCodec()
    model = SimpleNamespace(
        tts_model_type="base",
        tokenizer_type="qwen3_tts_tokenizer_12hz",
        tts_model_size="0b6",
        speech_tokenizer=codec,
        speaker_encoder_sample_rate=24000,
        extract_speaker_embedding=lambda audio, sr: Qwen3TTSForConditionalGeneration.extract_speaker_embedding(
            host, audio, sr
        ),
    )
    wrapper = Qwen3TTSModel.__new__(Qwen3TTSModel)
    wrapper.model = model
    items = wrapper.create_voice_clone_prompt(ref_audio=ref_audio, ref_text="reference transcript")
    return items[0].ref_spk_embedding, codec.inputs[0]


def _source(clip_paths, kind: str):
    if kind == "tuple16k":  # already-decoded audio at a rate that needs resampling
        wav, sr = sf.read(clip_paths["speech"], dtype="float32")
        return (resample(wav, sr, 16000), 16000)
    return str(clip_paths[kind])


@pytest.mark.parametrize("kind", ["speech", "stereo24k", "tuple16k"])
def test_embedding_matches_official_pipeline(official, ours, clip_paths, kind):
    source = _source(clip_paths, kind)
    ref_emb, codec_input = _official_voice_clone_prompt(official, source)

    wav, sr = load_audio(source)
    wav24 = resample(wav, sr, 24000)
    emb = ours.embed(wav24)

    assert emb.shape == ref_emb.shape == (TINY["enc_dim"],)
    assert emb.dtype == torch.float32
    assert ref_emb.std() > 0.1  # a non-degenerate oracle
    diff = (emb - ref_emb).abs().max().item()
    print(f"[{kind}] max |ours - official| = {diff:.3g}")
    assert diff <= TOL
    # What the official tokenizer feeds the 12 Hz codec encoder == our load + resample.
    assert codec_input.dtype == np.float32
    np.testing.assert_array_equal(codec_input, wav24)
    # embed_audio is the same composition
    assert (ours.embed_audio(wav, sr) - emb).abs().max().item() == 0.0


def test_mel_matches_official(clip_paths):
    wav, sr = load_audio(clip_paths["speech"])
    x = torch.from_numpy(resample(wav, sr, 24000)).unsqueeze(0)
    ref = mel_spectrogram(
        x, n_fft=1024, num_mels=128, sampling_rate=24000, hop_size=256, win_size=1024, fmin=0, fmax=12000
    )
    mel = log_mel_spectrogram(x)
    assert mel.shape == ref.shape == (1, 128, (x.shape[1] - 256) // 256 + 1)
    assert (mel - ref).abs().max().item() <= 1e-6


def test_bf16_matches_official_bf16(official, clip_paths):
    off16 = copy.deepcopy(official).to(torch.bfloat16)
    ours16 = SpeakerEncoder(TINY).to(torch.bfloat16).eval().load_official_state_dict(off16.state_dict())
    ref_emb, _ = _official_voice_clone_prompt(off16, str(clip_paths["speech"]), dtype=torch.bfloat16)
    wav, sr = load_audio(clip_paths["speech"])
    emb = ours16.embed(resample(wav, sr, 24000))
    assert emb.dtype == ref_emb.dtype == torch.bfloat16
    assert (emb.float() - ref_emb.float()).abs().max().item() <= TOL


def test_comparison_is_sensitive(official, ours, clip_paths):
    """Guards against a vacuous parity test: weights and inputs visibly move the embedding."""
    wav, sr = load_audio(clip_paths["speech"])
    wav24 = resample(wav, sr, 24000)
    base = ours.embed(wav24)
    perturbed = copy.deepcopy(ours)
    with torch.no_grad():
        # (not an asp.conv bias: softmax over time is invariant to it, a nice trap)
        perturbed.blocks[1].tdnn1.conv.weight[0, 0, 0] += 0.3
    assert (perturbed.embed(wav24) - base).abs().max().item() > 1e-3
    other, osr = load_audio(clip_paths["other"])
    assert (ours.embed(resample(other, osr, 24000)) - base).abs().max().item() > 1e-2


@pytest.mark.parametrize("enc_dim", [1024, 2048])
def test_real_size_structure_matches_official(enc_dim):
    """Full-size 0.6B/1.7B encoders (built on the meta device): identical parameter names and shapes."""
    with torch.device("meta"):
        ref = Qwen3TTSSpeakerEncoder(Qwen3TTSSpeakerEncoderConfig(enc_dim=enc_dim))
        mine = SpeakerEncoder({"enc_dim": enc_dim, "sample_rate": 24000})
    ref_shapes = {k: tuple(v.shape) for k, v in ref.state_dict().items()}
    assert {k: tuple(v.shape) for k, v in mine.state_dict().items()} == ref_shapes
    n_params = sum(p.numel() for p in mine.parameters())
    # reference doc: 8.9M (0.6B) / 12.0M (1.7B)
    assert n_params == pytest.approx({1024: 8.9e6, 2048: 12.0e6}[enc_dim], rel=0.01)


def test_min_length_matches_official_limit(official, ours):
    rng = np.random.default_rng(0)
    wav = (0.1 * rng.standard_normal(ours.min_samples)).astype(np.float32)
    ref = Qwen3TTSForConditionalGeneration.extract_speaker_embedding(
        SimpleNamespace(speaker_encoder=official, device=torch.device("cpu"), dtype=torch.float32), wav, 24000
    )
    assert (ours.embed(wav) - ref).abs().max().item() <= TOL
    with pytest.raises(RuntimeError):  # the official code cannot embed one sample less either
        Qwen3TTSForConditionalGeneration.extract_speaker_embedding(
            SimpleNamespace(speaker_encoder=official, device=torch.device("cpu"), dtype=torch.float32),
            wav[:-1],
            24000,
        )
    with pytest.raises(ValueError, match="too short"):
        ours.embed(wav[:-1])


def test_embed_input_validation(ours):
    with pytest.raises(ValueError, match="1-D"):
        ours.embed(np.zeros((2, 24000), np.float32))
    bad = np.zeros(24000, np.float32)
    bad[100] = np.inf
    with pytest.raises(ValueError, match="NaN or Inf"):
        ours.embed(bad)
    # torch input and float64 input give the float32 numpy result
    x = (0.1 * np.random.default_rng(1).standard_normal(24000)).astype(np.float32)
    ref = ours.embed(x)
    assert torch.equal(ours.embed(torch.from_numpy(x)), ref)
    assert torch.equal(ours.embed(x.astype(np.float64)), ref)


def test_load_state_dict_errors(official):
    sd = dict(official.state_dict())
    enc = SpeakerEncoder(TINY)

    missing = {k: v for k, v in sd.items() if k != "fc.bias"}
    with pytest.raises(ValueError, match=r"missing: fc\.bias"):
        enc.load_official_state_dict(missing)

    extra = {**sd, "blocks.9.conv.weight": torch.zeros(1)}
    with pytest.raises(ValueError, match=r"unexpected: blocks\.9\.conv\.weight"):
        enc.load_official_state_dict(extra)

    wrong = {**sd, "mfa.conv.weight": torch.zeros(96, 96, 3)}
    expected = r"shape mismatch: mfa\.conv\.weight: checkpoint \(96, 96, 3\) vs model \(96, 96, 1\)"
    with pytest.raises(ValueError, match=expected):
        enc.load_official_state_dict(wrong)

    # A whole-checkpoint dict: only speaker_encoder.* is used, the prefix is stripped.
    full = {f"speaker_encoder.{k}": v for k, v in sd.items()}
    full["talker.model.norm.weight"] = torch.ones(4)
    enc.load_official_state_dict(full)
    for k, v in enc.state_dict().items():
        assert torch.equal(v, sd[k]), k


def test_config_parsing():
    cfg = SpeakerEncoderConfig.from_dict({"enc_dim": 2048, "sample_rate": 24000, "model_type": ""})
    assert cfg.enc_dim == 2048 and cfg.enc_channels == (512, 512, 512, 512, 1536)
    assert SpeakerEncoderConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown speaker_encoder_config keys"):
        SpeakerEncoderConfig.from_dict({"enc_dims": 1024})
    with pytest.raises(ValueError, match="enc_channels"):
        SpeakerEncoderConfig.from_dict({"enc_channels": [32, 32, 32, 32, 64]})
    with pytest.raises(ValueError, match="mel_dim"):
        SpeakerEncoderConfig(mel_dim=80)

    model_cfg = {"speaker_encoder_config": {"enc_dim": 1024}, "talker_config": {"hidden_size": 1024}}
    assert SpeakerEncoder.from_model_config(model_cfg).enc_dim == 1024
    with pytest.raises(ValueError, match="talker hidden_size"):
        SpeakerEncoder.from_model_config({**model_cfg, "talker_config": {"hidden_size": 2048}})
    with pytest.raises(ValueError, match="only Base"):
        SpeakerEncoder.from_model_config({"talker_config": {"hidden_size": 1024}})
