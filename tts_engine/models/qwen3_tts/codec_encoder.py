"""Reference-audio encoder of the Qwen3-TTS 12 Hz speech tokenizer: 24 kHz mono waveform -> codes [T, 16].

Used for voice cloning (ICL): the reference clip's codes are fed to the talker and act as decoder left
context. The official `Qwen3TTSTokenizerV2Encoder` is a transformers `MimiModel` with its decoder half
deleted, so we build exactly that from the folder's `encoder_config` and load the `encoder.*` weights.

What the official `Qwen3TTSTokenizer.encode(wav, sr=24000)` does, and we reproduce:
- `EncodecFeatureExtractor` (feature_size 1) is a no-op for one mono float32 clip: no normalization,
  no padding; its padding mask is all ones.
- Mimi encodes WITHOUT the padding mask (unused by the reference), with all quantizers; only the first
  `encoder_valid_num_quantizers` (16) are kept. Residual quantization is sequential, so asking Mimi for
  just 16 gives the same codes and skips the rest.
- Codes are trimmed to ceil(len / encode_downsample_rate) frames (1920 samples per 80 ms frame).
- Resampling (when sr != 24000) is `librosa.resample` in the reference wrapper; here the caller
  resamples, and a wrong rate is an error rather than a silent mismatch.
Note: the reference casts the padding mask to the model dtype before summing it, so in bf16 the frame
count of long clips can be off by one; in float32 (our choice) it is exact.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from .codec_decoder import check_weights, read_prefixed_weights, read_tokenizer_config

WEIGHT_PREFIX = "encoder."
# MimiModel parts the official encoder deletes (it only encodes).
_DECODER_PARTS = ("upsample", "decoder_transformer", "decoder")


class ReferenceAudioEncoder(nn.Module):
    """Mimi encoder (SEANet + transformer + downsample + split RVQ) keeping the first 16 codebooks."""

    def __init__(self, mimi: nn.Module, num_quantizers: int, samples_per_frame: int, sample_rate: int):
        super().__init__()
        self.mimi = mimi
        self.num_quantizers = num_quantizers
        self.samples_per_frame = samples_per_frame
        self.sample_rate = sample_rate

    @classmethod
    def from_folder(
        cls, path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
    ) -> ReferenceAudioEncoder:
        """Load from an official `speech_tokenizer/` folder (config.json + model.safetensors)."""
        from transformers import MimiConfig, MimiModel
        from transformers.modeling_utils import no_init_weights

        config, config_path = read_tokenizer_config(path)
        weights, weights_path = read_prefixed_weights(path, WEIGHT_PREFIX)
        enc_cfg = config.get("encoder_config")
        if not isinstance(enc_cfg, dict):
            raise ValueError(f"{config_path}: key 'encoder_config' is missing or not an object")
        # Reference defaults (Qwen3TTSTokenizerV2Config) for the top-level keys.
        num_q = int(config.get("encoder_valid_num_quantizers", 16))
        samples_per_frame = int(config.get("encode_downsample_rate", 1920))
        sample_rate = int(config.get("input_sample_rate", 24000))
        mimi_config = MimiConfig(**{k: v for k, v in enc_cfg.items() if k != "model_type"})
        if not 0 < num_q <= mimi_config.num_quantizers:
            raise ValueError(
                f"{config_path}: encoder_valid_num_quantizers={num_q} must be in 1..{mimi_config.num_quantizers}"
            )
        mimi_config._attn_implementation = "sdpa"  # what the reference's from_pretrained picks by default

        with no_init_weights():  # every tensor is overwritten by the checkpoint below
            mimi = MimiModel(mimi_config)
        for part in _DECODER_PARTS:
            setattr(mimi, part, None)
        check_weights({k: v.shape for k, v in mimi.state_dict().items()}, weights, WEIGHT_PREFIX, str(weights_path))
        mimi.load_state_dict(weights, strict=True)
        model = cls(mimi, num_q, samples_per_frame, sample_rate)
        return model.to(device=device, dtype=dtype).eval().requires_grad_(False)

    @torch.inference_mode()
    def encode(self, wav: np.ndarray, sample_rate: int = 24000) -> Tensor:
        """Mono float waveform at `self.sample_rate` -> LongTensor [ceil(len / 1920), 16] (on the model's device)."""
        if sample_rate != self.sample_rate:
            raise ValueError(
                f"encode expects {self.sample_rate} Hz audio, got {sample_rate} Hz: resample first "
                "(the reference uses librosa.resample)"
            )
        wav = np.asarray(wav, dtype=np.float32)
        if wav.ndim != 1 or wav.size == 0:
            raise ValueError(f"encode expects a non-empty 1-D mono waveform, got shape {wav.shape}")
        param = next(self.mimi.parameters())
        x = torch.from_numpy(wav).to(device=param.device, dtype=param.dtype)[None, None]  # [1, 1, L]
        codes = self.mimi.encode(x, num_quantizers=self.num_quantizers, return_dict=True).audio_codes  # [1, Q, T']
        frames = -(-wav.shape[0] // self.samples_per_frame)
        return codes[0, :, :frames].transpose(0, 1).contiguous()
