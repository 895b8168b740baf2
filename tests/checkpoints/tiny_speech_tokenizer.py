"""Write a tiny, random 12 Hz speech tokenizer in the OFFICIAL `speech_tokenizer/` folder format.

The folder loads with the reference `qwen_tts.Qwen3TTSTokenizer.from_pretrained(folder)` and with our
`Code2WavDecoder` / `ReferenceAudioEncoder`, so parity tests can compare the two on the same weights.

Why it is built this way:
- The weights come from the official classes (their parameter names and shapes are the ground truth),
  randomized with a seeded generator. Default inits would hide bugs: `embedding_sum` starts at 0 (the
  decoder would output silence), SnakeBeta alpha/beta at 0, LayerScale at 0.01.
- The scales below are chosen so the waveform is loud but mostly inside [-1, 1]: a quiet output would
  make an absolute 1e-4 tolerance meaningless, and a saturated one would hide errors behind the clamp.
- `config.json` is written by hand: every field the official config classes read, with the values
  the released checkpoint uses wherever the shrink recipe does not need to change them
  (16 quantizers, 2048 entries, rates [8,5,4,3]+[2,2] = 1920 samples/frame, Mimi at 24 kHz/12.5 Hz).
- The decoder keeps the released 72-frame attention window (tests slide it with 100+ frame sequences;
  that takes well under a second on the tiny model). Pass `sliding_window=` to shrink it: code that
  carries attention state must read the window from the config.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

SAMPLE_RATE = 24_000
SAMPLES_PER_FRAME = 1920


def tiny_decoder_config(sliding_window: int = 72) -> dict[str, Any]:
    """`decoder_config` of the tiny codec: real structure (16 quantizers, 2 transformer layers, all
    upsampling stages), tiny widths. head_dim * heads != hidden_size on purpose, as in the release
    (16 x 64 = 1024 vs. 512); 2 kv heads for 4 query heads exercise grouped-query attention."""
    return {
        "codebook_size": 2048,
        "codebook_dim": 16,
        "latent_dim": 32,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "sliding_window": sliding_window,
        "max_position_embeddings": 8000,
        "rope_theta": 10000,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "layer_scale_initial_scale": 0.01,
        "num_quantizers": 16,
        "num_semantic_quantizers": 1,
        "semantic_codebook_size": 4096,
        "vector_quantization_hidden_dimension": 16,
        "upsample_rates": [8, 5, 4, 3],
        "upsampling_ratios": [2, 2],
        "decoder_dim": 64,
    }


def tiny_encoder_config() -> dict[str, Any]:
    """`encoder_config` (a `MimiConfig`) of the tiny codec: SEANet rates and frame rate as released,
    32 quantizers of which the tokenizer keeps the first 16."""
    return {
        "model_type": "mimi",
        "sampling_rate": SAMPLE_RATE,
        "_frame_rate": 12.5,
        "audio_channels": 1,
        "hidden_size": 32,
        "num_filters": 4,
        "num_residual_layers": 1,
        "upsampling_ratios": [8, 6, 5, 4],
        "kernel_size": 7,
        "last_kernel_size": 3,
        "residual_kernel_size": 3,
        "dilation_growth_rate": 2,
        "use_causal_conv": True,
        "pad_mode": "constant",
        "compress": 2,
        "trim_right_ratio": 1.0,
        "codebook_size": 2048,
        "codebook_dim": 16,
        "num_quantizers": 32,
        "num_semantic_quantizers": 1,
        "use_conv_shortcut": False,
        "vector_quantization_hidden_dimension": 16,
        "upsample_groups": 32,
        "num_hidden_layers": 1,
        "intermediate_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "head_dim": 8,
        "hidden_act": "gelu",
        "max_position_embeddings": 8000,
        "initializer_range": 0.02,
        "norm_eps": 1e-5,
        "use_cache": False,
        "use_streaming": False,
        "rope_theta": 10000.0,
        "sliding_window": 250,
        "attention_dropout": 0.0,
        "layer_scale_initial_scale": 0.01,
        "attention_bias": False,
    }


def tiny_tokenizer_config(sliding_window: int = 72) -> dict[str, Any]:
    """The whole `speech_tokenizer/config.json`, shaped like the released file."""
    return {
        "architectures": ["Qwen3TTSTokenizerV2Model"],
        "model_type": "qwen3_tts_tokenizer_12hz",
        "encoder_valid_num_quantizers": 16,
        "input_sample_rate": SAMPLE_RATE,
        "output_sample_rate": SAMPLE_RATE,
        "decode_upsample_rate": SAMPLES_PER_FRAME,
        "encode_downsample_rate": SAMPLES_PER_FRAME,
        "encoder_config": tiny_encoder_config(),
        "decoder_config": tiny_decoder_config(sliding_window),
        "transformers_version": "4.57.3",
    }


PREPROCESSOR_CONFIG = {
    "chunk_length_s": None,
    "feature_extractor_type": "EncodecFeatureExtractor",
    "feature_size": 1,
    "overlap": None,
    "padding_side": "right",
    "padding_value": 0.0,
    "return_attention_mask": True,
    "sampling_rate": SAMPLE_RATE,
}

CONFIGURATION_JSON = {"framework": "pytorch", "task": "audio-tokenizer", "allow_remote": True}


def _random_value(name: str, like: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A random replacement for one official tensor, scaled by what the tensor does."""
    leaf = name.rsplit(".", 1)[-1]

    def normal(std: float, mean: float = 0.0) -> torch.Tensor:
        return torch.randn(like.shape, generator=gen) * std + mean

    if leaf == "initialized":  # Mimi codebook flag: must stay "initialized"
        return torch.ones_like(like)
    if leaf == "cluster_usage":  # divides the codebook: keep it well away from the 1e-5 clamp
        return torch.rand(like.shape, generator=gen) + 0.5
    if leaf in ("embedding_sum", "embed_sum"):
        return normal(1.0)
    if leaf in ("alpha", "beta"):  # SnakeBeta, used as exp(alpha), exp(beta)
        return normal(0.3)
    if leaf in ("scale", "gamma"):  # LayerScale / ConvNeXt gamma: visible but not dominant residual branches
        return normal(0.1, mean=0.3)
    if like.dim() == 1:
        if "norm" in name and leaf == "weight":
            return normal(0.1, mean=1.0)
        return normal(0.05)  # biases
    fan_in = like[0].numel()  # Linear [out, in], Conv1d [out, in/groups, k]
    if re.search(r"decoder\.decoder\.\d+\.block\.1\.conv\.weight$", name):
        fan_in = like.shape[0] * 2  # ConvTranspose [in, out, 2r] stride r: 2 taps per output sample
    elif re.search(r"decoder\.upsample\.\d+\.0\.conv\.weight$", name):
        fan_in = like.shape[0]  # ConvTranspose [in, out, r] stride r: 1 tap per output sample
    std = 1.0 / max(fan_in, 1) ** 0.5
    if re.search(r"\.block\.\d\.conv2\.conv\.weight$", name):
        std *= 0.3  # decoder residual units: without this each block triples the signal
    return normal(std)


def _random_state_dict(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name, tensor in model.state_dict().items():
        value = _random_value(name, tensor, gen) if tensor.is_floating_point() else tensor
        state[name] = value.to(torch.float32).contiguous().clone()
    # The waveform head: aim for a loud-but-unclipped output (see module docstring).
    last = "decoder.decoder.6.conv.weight"
    state[last] = state[last] * 0.12
    return state


def write_tiny_speech_tokenizer(folder: Path, seed: int = 0, *, sliding_window: int = 72) -> Path:
    """Write a tiny random speech tokenizer into `folder` (created if needed) and return `folder`.

    Files: config.json, configuration.json, preprocessor_config.json, model.safetensors (float32,
    official parameter names `encoder.*` and `decoder.*`). ~1 MB of weights besides the codebooks.
    """
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = tiny_tokenizer_config(sliding_window)

    official_cfg = Qwen3TTSTokenizerV2Config(
        **{k: v for k, v in config.items() if k not in ("architectures", "model_type", "transformers_version")}
    )
    model = Qwen3TTSTokenizerV2Model(official_cfg)
    save_file(_random_state_dict(model, seed), str(folder / "model.safetensors"), metadata={"format": "pt"})

    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "configuration.json").write_text(json.dumps(CONFIGURATION_JSON, indent=2))
    (folder / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR_CONFIG, indent=2))
    return folder
