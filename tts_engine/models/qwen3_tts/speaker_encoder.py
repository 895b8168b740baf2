"""Qwen3-TTS Base speaker encoder: log-mel front end + ECAPA-TDNN, parameter-compatible with the official one.

The talker of a Base checkpoint has one "speaker slot" in its prefill; voice cloning fills it with the
x-vector this module computes from a 24 kHz reference clip. The vector is inserted into the talker
sequence as is, so ``enc_dim`` equals the talker hidden size (1024 for 0.6B, 2048 for 1.7B).

Parity contract (tested against ``qwen_tts==0.1.1``): ``SpeakerEncoder.embed(wav24k)`` returns what the
official ``Qwen3TTSForConditionalGeneration.extract_speaker_embedding(wav24k, 24000)`` returns, given the
same weights and dtype. Like the official code, the mel is always computed on CPU in float32 and only then
cast to the encoder's device and dtype.

Module and attribute names mirror the official ones, so checkpoint tensors named
``speaker_encoder.<name>`` load after stripping the prefix (see :meth:`SpeakerEncoder.load_official_state_dict`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "MEL_SAMPLE_RATE",
    "SpeakerEncoder",
    "SpeakerEncoderConfig",
    "log_mel_spectrogram",
]

# Front-end constants hard-coded by the official ``extract_speaker_embedding`` (not read from config).
MEL_SAMPLE_RATE = 24000
MEL_N_FFT = 1024
MEL_HOP = 256
MEL_WIN = 1024
MEL_BINS = 128
MEL_FMIN = 0.0
MEL_FMAX = 12000.0
_MAG_EPS = 1e-9  # added under the sqrt of |STFT|^2; it floors silent bins at ~3e-5, so it matters
_LOG_FLOOR = 1e-5

_CHECKPOINT_PREFIX = "speaker_encoder."
# Keys HF/``save_pretrained`` may put into a sub-config dict that carry no architecture information.
_IGNORED_CONFIG_KEYS = frozenset({"model_type", "transformers_version", "architectures", "torch_dtype", "dtype"})


# --------------------------------------------------------------------------------------------
# Mel front end
# --------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _mel_basis() -> torch.Tensor:
    """Slaney-style librosa filterbank (norm="slaney", htk=False), float32 [n_mels, n_fft//2+1]."""
    from librosa.filters import mel  # lazy: librosa is slow to import

    basis = mel(sr=MEL_SAMPLE_RATE, n_fft=MEL_N_FFT, n_mels=MEL_BINS, fmin=MEL_FMIN, fmax=MEL_FMAX)
    return torch.from_numpy(basis).float()


def log_mel_spectrogram(wav: torch.Tensor) -> torch.Tensor:
    """Log-mel of 24 kHz audio, ``[batch, samples]`` (or ``[samples]``) -> ``[batch, 128, frames]``.

    Same recipe as the official ``mel_spectrogram``: reflect-pad (n_fft - hop) / 2 = 384 samples on each
    side and run a non-centred STFT (periodic Hann window), so frame ``t`` covers samples
    ``[256 t - 384, 256 t + 640)`` and there are ``(samples - 256) // 256 + 1`` frames; magnitude
    ``sqrt(re^2 + im^2 + 1e-9)``; project on the mel basis; ``log(max(x, 1e-5))``.
    Computed in float32 on the input's device.
    """
    if wav.dim() == 1:
        wav = wav.unsqueeze(0)
    wav = wav.float()
    pad = (MEL_N_FFT - MEL_HOP) // 2
    wav = F.pad(wav.unsqueeze(1), (pad, pad), mode="reflect").squeeze(1)
    spec = torch.stft(
        wav,
        MEL_N_FFT,
        hop_length=MEL_HOP,
        win_length=MEL_WIN,
        window=torch.hann_window(MEL_WIN, device=wav.device),
        center=False,
        normalized=False,
        onesided=True,
        return_complex=True,
    )
    magnitude = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + _MAG_EPS)
    mel = torch.matmul(_mel_basis().to(wav.device), magnitude)
    return torch.log(torch.clamp(mel, min=_LOG_FLOOR))


# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpeakerEncoderConfig:
    """Architecture of the ECAPA-TDNN; field names and defaults are the official config class's.

    Real checkpoints only write ``enc_dim`` and ``sample_rate`` in ``speaker_encoder_config``; every
    other field takes these defaults.
    """

    mel_dim: int = 128
    enc_dim: int = 1024
    enc_channels: tuple[int, ...] = (512, 512, 512, 512, 1536)
    enc_kernel_sizes: tuple[int, ...] = (5, 3, 3, 3, 1)
    enc_dilations: tuple[int, ...] = (1, 2, 3, 4, 1)
    enc_attention_channels: int = 128
    enc_res2net_scale: int = 8
    enc_se_channels: int = 128
    sample_rate: int = 24000

    def __post_init__(self) -> None:
        for name in ("enc_channels", "enc_kernel_sizes", "enc_dilations"):
            object.__setattr__(self, name, tuple(int(v) for v in getattr(self, name)))
        ch, n = self.enc_channels, len(self.enc_channels)
        if not (len(self.enc_kernel_sizes) == len(self.enc_dilations) == n) or n < 3:
            raise ValueError("enc_channels, enc_kernel_sizes and enc_dilations need the same length (>= 3)")
        if self.mel_dim != MEL_BINS:
            raise ValueError(f"mel_dim must be {MEL_BINS}: the official front end always computes {MEL_BINS} bands")
        # Conditions under which the official forward would fail at run time, caught at build time.
        if any(ch[i] != ch[0] for i in range(1, n - 1)):
            raise ValueError(f"SE-Res2Net blocks are residual: enc_channels[0:-1] must be equal, got {ch}")
        if sum(ch[1:-1]) != ch[-1]:
            raise ValueError(f"enc_channels[-1] must equal the concatenated block widths {sum(ch[1:-1])}, got {ch[-1]}")
        if ch[0] % self.enc_res2net_scale:
            raise ValueError(f"block width {ch[0]} must be divisible by enc_res2net_scale {self.enc_res2net_scale}")

    @classmethod
    def from_dict(cls, cfg: Mapping[str, Any] | None) -> SpeakerEncoderConfig:
        """Build from the ``speaker_encoder_config`` dict of ``config.json`` (unknown keys are errors)."""
        cfg = dict(cfg or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(k for k in cfg if k not in known and k not in _IGNORED_CONFIG_KEYS and not k.startswith("_"))
        if unknown:
            raise ValueError(f"unknown speaker_encoder_config keys: {unknown}")
        return cls(**{k: v for k, v in cfg.items() if k in known})

    def to_dict(self) -> dict[str, Any]:
        """Plain dict with list values, the shape ``config.json`` uses."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


# --------------------------------------------------------------------------------------------
# Layers (attribute names == official parameter names)
# --------------------------------------------------------------------------------------------


def _conv(c_in: int, c_out: int, kernel: int = 1, dilation: int = 1) -> nn.Conv1d:
    """Every official conv is 'same' length with reflect padding (a no-op for the 1x1 ones)."""
    return nn.Conv1d(c_in, c_out, kernel, dilation=dilation, padding="same", padding_mode="reflect")


class _TDNN(nn.Module):
    """Dilated conv + ReLU (official ``TimeDelayNetBlock``)."""

    def __init__(self, c_in: int, c_out: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.conv = _conv(c_in, c_out, kernel, dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv(x))


class _Res2Net(nn.Module):
    """Split channels in ``scale`` groups; group i>0 sees its input plus group i-1's output.

    The first group passes through untouched, hence ``scale - 1`` convs (``blocks.0..scale-2``).
    """

    def __init__(self, channels: int, scale: int, kernel: int, dilation: int) -> None:
        super().__init__()
        width = channels // scale
        self.scale = scale
        self.blocks = nn.ModuleList(_TDNN(width, width, kernel, dilation) for _ in range(scale - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        groups = torch.chunk(x, self.scale, dim=1)
        outputs = [groups[0]]
        prev: torch.Tensor | None = None
        for group, tdnn in zip(groups[1:], self.blocks, strict=True):
            prev = tdnn(group if prev is None else group + prev)
            outputs.append(prev)
        return torch.cat(outputs, dim=1)


class _SqueezeExcite(nn.Module):
    """Channel gates from the time-averaged features."""

    def __init__(self, channels: int, se_channels: int) -> None:
        super().__init__()
        self.conv1 = _conv(channels, se_channels)
        self.conv2 = _conv(se_channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.conv2(F.relu(self.conv1(x.mean(dim=2, keepdim=True)))))
        return x * gate


class _SERes2NetBlock(nn.Module):
    """1x1 TDNN -> Res2Net -> 1x1 TDNN -> squeeze-excite, plus the input (residual)."""

    def __init__(self, channels: int, scale: int, se_channels: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.tdnn1 = _TDNN(channels, channels, 1, 1)
        self.res2net_block = _Res2Net(channels, scale, kernel, dilation)
        self.tdnn2 = _TDNN(channels, channels, 1, 1)
        self.se_block = _SqueezeExcite(channels, se_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x)))) + x


def _weighted_stats(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-12) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel weighted mean and std over time; ``w`` sums to 1 along dim 2."""
    mean = (w * x).sum(dim=2)
    std = torch.sqrt((w * (x - mean.unsqueeze(2)).pow(2)).sum(dim=2).clamp(eps))
    return mean, std


class _AttentiveStatsPool(nn.Module):
    """Attentive statistics pooling with global context: ``[B, C, T] -> [B, 2C, 1]``.

    Attention logits see each frame together with the utterance's global mean/std; the output is the
    attention-weighted mean and std. Only unpadded batches exist here (one clip at a time), so the
    official length mask is all ones and is dropped.
    """

    def __init__(self, channels: int, attention_channels: int) -> None:
        super().__init__()
        self.tdnn = _TDNN(channels * 3, attention_channels, 1, 1)
        self.conv = _conv(attention_channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        frames = x.shape[-1]
        # Uniform weights built as ones / sum(ones) in x's dtype: bit-identical to the official
        # mask / mask.sum() also in bf16, where 1/T is not exactly representable.
        ones = x.new_ones(x.shape[0], 1, frames)
        mean, std = _weighted_stats(x, ones / ones.sum(dim=2, keepdim=True))
        context = torch.cat([x, mean.unsqueeze(2).expand_as(x), std.unsqueeze(2).expand_as(x)], dim=1)
        attention = F.softmax(self.conv(torch.tanh(self.tdnn(context))), dim=2)
        mean, std = _weighted_stats(x, attention)
        return torch.cat([mean, std], dim=1).unsqueeze(2)


# --------------------------------------------------------------------------------------------
# Encoder
# --------------------------------------------------------------------------------------------


class SpeakerEncoder(nn.Module):
    """ECAPA-TDNN x-vector extractor (official ``Qwen3TTSSpeakerEncoder``).

    TDNN -> SE-Res2Net blocks -> multi-layer feature aggregation (``mfa``, on the concatenated block
    outputs) -> attentive statistics pooling (``asp``) -> 1x1 conv ``fc`` to ``enc_dim``.
    """

    def __init__(self, config: SpeakerEncoderConfig | Mapping[str, Any] | None = None) -> None:
        super().__init__()
        cfg = config if isinstance(config, SpeakerEncoderConfig) else SpeakerEncoderConfig.from_dict(config)
        self.config = cfg
        ch, ks, dil = cfg.enc_channels, cfg.enc_kernel_sizes, cfg.enc_dilations
        self.blocks = nn.ModuleList([_TDNN(cfg.mel_dim, ch[0], ks[0], dil[0])])
        for i in range(1, len(ch) - 1):
            self.blocks.append(_SERes2NetBlock(ch[i], cfg.enc_res2net_scale, cfg.enc_se_channels, ks[i], dil[i]))
        self.mfa = _TDNN(ch[-1], ch[-1], ks[-1], dil[-1])
        self.asp = _AttentiveStatsPool(ch[-1], cfg.enc_attention_channels)
        self.fc = _conv(ch[-1] * 2, cfg.enc_dim)
        # Reflect padding needs more frames than the widest 'same' pad; the mel needs > 384 samples.
        max_pad = max((k - 1) * d // 2 for k, d in zip(ks, dil, strict=True))
        self.min_frames = max_pad + 1
        self.min_samples = max(MEL_HOP * self.min_frames, (MEL_N_FFT - MEL_HOP) // 2 + 1)

    @classmethod
    def from_model_config(cls, model_config: Mapping[str, Any]) -> SpeakerEncoder:
        """Build from a whole Base ``config.json`` dict, checking ``enc_dim`` against the talker width."""
        if not model_config.get("speaker_encoder_config"):
            raise ValueError("config has no speaker_encoder_config (only Base checkpoints have a speaker encoder)")
        cfg = SpeakerEncoderConfig.from_dict(model_config["speaker_encoder_config"])
        hidden = (model_config.get("talker_config") or {}).get("hidden_size")
        if hidden is not None and hidden != cfg.enc_dim:
            raise ValueError(f"speaker_encoder_config.enc_dim={cfg.enc_dim} != talker hidden_size={hidden}")
        return cls(cfg)

    @property
    def enc_dim(self) -> int:
        return self.config.enc_dim

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        """``mels``: ``[batch, frames, mel_dim]`` (official layout) -> ``[batch, enc_dim]``."""
        x = mels.transpose(1, 2)
        block_outputs = []
        for block in self.blocks:
            x = block(x)
            block_outputs.append(x)
        x = self.mfa(torch.cat(block_outputs[1:], dim=1))  # the first TDNN's output is not aggregated
        return self.fc(self.asp(x)).squeeze(-1)

    @torch.inference_mode()
    def embed(self, wav24k: np.ndarray | torch.Tensor) -> torch.Tensor:
        """x-vector of one mono 24 kHz clip -> ``[enc_dim]`` in this module's dtype and device.

        Mirrors ``extract_speaker_embedding``: float32 CPU mel, then cast to the encoder's device/dtype.
        Resample with :func:`tts_engine.audio.resample` first (or use :meth:`embed_audio`).
        """
        if isinstance(wav24k, torch.Tensor):
            wav = wav24k.detach().to("cpu", torch.float32)
        else:
            wav = torch.from_numpy(np.ascontiguousarray(wav24k, dtype=np.float32))
        if wav.dim() != 1:
            raise ValueError(f"embed expects a mono 1-D waveform, got shape {tuple(wav.shape)}")
        if wav.numel() < self.min_samples:
            raise ValueError(
                f"clip too short for the speaker encoder: {wav.numel()} samples at 24 kHz (minimum {self.min_samples})"
            )
        if not torch.isfinite(wav).all():
            raise ValueError("waveform contains NaN or Inf samples")
        param = next(self.parameters())
        mels = log_mel_spectrogram(wav.unsqueeze(0)).transpose(1, 2)
        return self(mels.to(device=param.device, dtype=param.dtype))[0]

    def embed_audio(self, wav: np.ndarray, sr: int) -> torch.Tensor:
        """x-vector of a mono clip at any rate, resampled the official way (librosa soxr_hq)."""
        from tts_engine.audio import resample

        return self.embed(resample(wav, sr, self.config.sample_rate))

    def load_official_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> SpeakerEncoder:
        """Load official weights; values are cast to this module's dtype.

        Accepts keys with the ``speaker_encoder.`` prefix already stripped, or a whole checkpoint dict
        (then only ``speaker_encoder.*`` keys are used). Raises ``ValueError`` listing missing,
        unexpected and shape-mismatched keys instead of loading anything partially.
        """
        if any(k.startswith(_CHECKPOINT_PREFIX) for k in state_dict):
            n = len(_CHECKPOINT_PREFIX)
            state_dict = {k[n:]: v for k, v in state_dict.items() if k.startswith(_CHECKPOINT_PREFIX)}
        own = self.state_dict()
        missing = sorted(set(own) - set(state_dict))
        unexpected = sorted(set(state_dict) - set(own))
        mismatched = [
            f"{k}: checkpoint {tuple(state_dict[k].shape)} vs model {tuple(own[k].shape)}"
            for k in sorted(set(own) & set(state_dict))
            if tuple(state_dict[k].shape) != tuple(own[k].shape)
        ]
        if missing or unexpected or mismatched:
            problems = []
            for label, items in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", mismatched)):
                if items:
                    shown = ", ".join(items[:12]) + (f", ... ({len(items)} total)" if len(items) > 12 else "")
                    problems.append(f"{label}: {shown}")
            raise ValueError("speaker encoder state dict does not match the config; " + "; ".join(problems))
        self.load_state_dict(dict(state_dict), strict=True)
        return self
