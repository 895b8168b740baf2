"""A tiny random Qwen3-TTS 12 Hz checkpoint in the official on-disk format, for `--demo` mode.

`build_demo_checkpoint(folder)` writes a complete checkpoint folder, laid out like the published ones:

    config.json, generation_config.json            every field written by hand (see below)
    vocab.json, merges.txt, tokenizer_config.json  a byte-level BPE text tokenizer (Qwen2Tokenizer)
    model.safetensors                              talker.* (+ speaker_encoder.* for Base), official names
    speech_tokenizer/                              config.json, configuration.json, preprocessor_config.json,
                                                   model.safetensors (encoder.*, decoder.*)

The weights are random, so the audio is noise-like, but every code path (talker, code predictor,
speaker encoder, codec encoder and decoder) runs on real tensors with the official names and shapes.
It works offline and does NOT import the official `qwen_tts` package: tensor names and shapes come
from our own modules (`weights._expected_talker_shapes`, `SpeakerEncoder`, `Code2WavDecoder`) and from
transformers' `MimiModel` (the official tokenizer encoder is a MimiModel without its decoder half).
`tests/test_demo_checkpoint.py` proves the folder loads with the official `qwen_tts` classes and that
their state dicts equal our files.

This module is also the single home of the tiny configuration data used by the test builder
`tests/checkpoints/tiny_qwen3_tts.py` (which instead takes the weights from the official classes).

Full-size shapes: `shape="0.6b"` / `"1.7b"` write random weights in the released shapes (the
official config values: talker 1024/3072 or 2048/6144 wide, 28 layers; code predictor 1024/3072,
5 layers; text vocabulary 151936 x 2048 with the real special-token ids; the released codec and
speaker encoder). They exist for benchmarks: a few GiB, built in seconds to a minute, talker and
speaker encoder in bfloat16 as released, codec in float32. Each tensor draws from its own generator
(seeded by the seed and its name), so the build order does not matter.

Why the config is written by hand: the official config classes' defaults match no released checkpoint
(32 code groups, codec ids 4196-4205, ...), and `save_pretrained` writes a `speaker_encoder_config`
that the official code cannot reload. Shapes are tiny but keep every invariant of the release
(16 code groups, codec vocab 3072 = codebook 2048 + 1024, all special codec ids, 1920 samples/frame);
the talker head_dim is 64 because vLLM's CPU attention rejects smaller heads.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "DEMO_GENERATION", "DIALECTS", "LANGUAGES", "MODEL_SIZES", "MODEL_TYPES", "SHAPES", "SPEAKERS", "SPECIAL_TOKENS",
    "TEXT_VOCAB", "build_demo_checkpoint", "demo_config", "demo_speech_tokenizer_config", "full_config",
    "write_text_tokenizer",
]

log = logging.getLogger(__name__)

MODEL_TYPES = ("base", "custom_voice", "voice_design")
MODEL_SIZES = ("0b6", "1b7")  # 1b7: the code predictor is narrower than the talker (small_to_mtp_projection)
SHAPES = ("tiny", "0.6b", "1.7b")  # tiny: test-sized; 0.6b / 1.7b: the released shapes (benchmarks)
_SHAPE_SIZE = {"0.6b": "0b6", "1.7b": "1b7"}

# --------------------------------------------------------------------------------------------------
# Text tokenizer: 256 byte symbols, merged words, then special tokens (ids chosen small on purpose).
# --------------------------------------------------------------------------------------------------

_MERGED_WORDS = ("assistant", "user")
_SPECIAL_NAMES = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|audio_start|>", "<|audio_end|>",
                  "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>", "<tts_text_bos_single>", "<|audio_pad|>")
TEXT_VOCAB = 320

LANGUAGES = {
    "chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071,
    "spanish": 2054, "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069,
    "beijing_dialect": 2074, "sichuan_dialect": 2062,
}
SPEAKERS = {"serena": [3066], "vivian": [3065], "ryan": [3061], "eric": [2875], "dylan": [2878]}
DIALECTS = {"serena": False, "vivian": False, "ryan": False, "eric": "sichuan_dialect", "dylan": "beijing_dialect"}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table used by byte-level BPE."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(printable, map(chr, chars), strict=True))


def _bpe_vocab() -> tuple[dict[str, int], list[str]]:
    vocab: dict[str, int] = {ch: i for i, ch in enumerate(sorted(_bytes_to_unicode().values()))}
    merges: list[str] = []
    for word in _MERGED_WORDS:
        for end in range(2, len(word) + 1):
            merges.append(f"{word[:end - 1]} {word[end - 1]}")
            vocab.setdefault(word[:end], len(vocab))
    return vocab, merges


# Added tokens get the ids right after the BPE vocabulary (the fast tokenizer numbers them so).
SPECIAL_TOKENS = {name: len(_bpe_vocab()[0]) + k for k, name in enumerate(_SPECIAL_NAMES)}
assert max(SPECIAL_TOKENS.values()) < TEXT_VOCAB

# The released layout (full shapes): 151643 regular tokens, then the special tokens at their real ids.
_FULL_REGULAR = 151643
FULL_TEXT_VOCAB = 151936
FULL_SPECIAL_TOKENS = dict(zip(_SPECIAL_NAMES, (151643, 151644, 151645, 151669, 151670, 151671, 151672, 151673,
                                                151674, 151675), strict=True))
FULL_SPEAKERS = {"serena": [3066], "vivian": [3065], "uncle_fu": [3010], "ryan": [3061], "aiden": [2861],
                 "ono_anna": [2873], "sohee": [2864], "eric": [2875], "dylan": [2878]}
FULL_DIALECTS = {name: DIALECTS.get(name, False) for name in FULL_SPEAKERS}


def write_text_tokenizer(folder: Path, full: bool = False) -> dict[str, int]:
    """Write vocab.json, merges.txt and tokenizer_config.json into `folder`; returns the BPE vocab.

    `full`: the released id layout (151643 regular tokens, padded with unreachable placeholders, then
    the special tokens at their real ids, `FULL_SPECIAL_TOKENS`)."""
    folder = Path(folder)
    vocab, merges = _bpe_vocab()
    specials = SPECIAL_TOKENS
    if full:
        vocab.update({f"<|unused_{i}|>": i for i in range(len(vocab), _FULL_REGULAR)})
        specials = dict(FULL_SPECIAL_TOKENS)
        top = max(specials.values())
        taken = set(specials.values())
        specials.update({f"<|reserved_{i}|>": i for i in range(_FULL_REGULAR, top) if i not in taken})
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    added = {str(i): {"content": tok, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": True} for tok, i in sorted(specials.items(), key=lambda x: x[1])}
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "add_prefix_space": False, "added_tokens_decoder": added, "bos_token": None,
        "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>", "errors": "replace",
        "model_max_length": 32768, "pad_token": "<|endoftext|>", "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
    }, indent=1), encoding="utf-8")
    return vocab


# --------------------------------------------------------------------------------------------------
# config.json / generation_config.json
# --------------------------------------------------------------------------------------------------


def demo_config(model_type: str, size: str = "0b6") -> dict:
    """config.json contents; `size="1b7"` gives the code predictor a narrower width (projection)."""
    hidden = 128
    cp_hidden = hidden if size == "0b6" else 64
    cp_heads = 4
    talker = {
        "hidden_size": hidden, "intermediate_size": 256, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64, "hidden_act": "silu",
        "vocab_size": 3072, "text_vocab_size": TEXT_VOCAB, "text_hidden_size": 64,
        "num_code_groups": 16, "rms_norm_eps": 1e-6, "rope_theta": 1000000, "max_position_embeddings": 32768,
        "rope_scaling": {"interleaved": True, "mrope_section": [16, 8, 8], "rope_type": "default",
                         "type": "default"},
        "position_id_per_seconds": 13, "attention_bias": False, "use_sliding_window": False,
        "codec_pad_id": 2148, "codec_bos_id": 2149, "codec_eos_token_id": 2150, "codec_think_id": 2154,
        "codec_nothink_id": 2155, "codec_think_bos_id": 2156, "codec_think_eos_id": 2157,
        "codec_language_id": LANGUAGES,
        "spk_id": SPEAKERS if model_type == "custom_voice" else {},
        "spk_is_dialect": DIALECTS if model_type == "custom_voice" else {},
        "code_predictor_config": {
            "hidden_size": cp_hidden, "intermediate_size": 2 * cp_hidden, "num_hidden_layers": 2,
            "num_attention_heads": cp_heads, "num_key_value_heads": 2, "head_dim": cp_hidden // cp_heads,
            "vocab_size": 2048, "num_code_groups": 16, "rope_theta": 1000000, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 65536, "max_length": 20, "hidden_act": "silu",
            "attention_bias": False, "use_sliding_window": False,
        },
    }
    config = {
        "architectures": ["Qwen3TTSForConditionalGeneration"], "model_type": "qwen3_tts",
        "tokenizer_type": "qwen3_tts_tokenizer_12hz", "tts_model_size": size, "tts_model_type": model_type,
        "im_start_token_id": SPECIAL_TOKENS["<|im_start|>"], "im_end_token_id": SPECIAL_TOKENS["<|im_end|>"],
        "assistant_token_id": _bpe_vocab()[0]["assistant"], "tts_pad_token_id": SPECIAL_TOKENS["<tts_pad>"],
        "tts_bos_token_id": SPECIAL_TOKENS["<tts_text_bos>"], "tts_eos_token_id": SPECIAL_TOKENS["<tts_text_eod>"],
        "talker_config": talker, "torch_dtype": "float32", "transformers_version": "4.57.3",
    }
    if model_type == "base":
        config["speaker_encoder_config"] = {
            "mel_dim": 128, "enc_dim": hidden, "enc_channels": [32, 32, 32, 32, 96],
            "enc_kernel_sizes": [5, 3, 3, 3, 1], "enc_dilations": [1, 2, 3, 4, 1],
            "enc_attention_channels": 16, "enc_res2net_scale": 8, "enc_se_channels": 16, "sample_rate": 24000,
        }
    return config


def full_config(model_type: str, shape: str) -> dict:
    """config.json in a released shape (`shape` "0.6b" or "1.7b"): the official config values, the
    real special-token ids; only `assistant_token_id` follows our (placeholder-padded) text vocabulary."""
    size = _SHAPE_SIZE[shape]
    config = demo_config(model_type, size)
    hidden, inter = (1024, 3072) if shape == "0.6b" else (2048, 6144)
    talker = config["talker_config"]
    talker.update({
        "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": 28, "num_attention_heads": 16,
        "num_key_value_heads": 8, "head_dim": 128, "text_vocab_size": FULL_TEXT_VOCAB, "text_hidden_size": 2048,
        "rope_scaling": {"interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default",
                         "type": "default"},
        "spk_id": FULL_SPEAKERS if model_type == "custom_voice" else {},
        "spk_is_dialect": FULL_DIALECTS if model_type == "custom_voice" else {},
    })
    talker["code_predictor_config"].update({
        "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 5, "num_attention_heads": 16,
        "num_key_value_heads": 8, "head_dim": 128,
    })
    config.update({
        "im_start_token_id": FULL_SPECIAL_TOKENS["<|im_start|>"], "im_end_token_id": FULL_SPECIAL_TOKENS["<|im_end|>"],
        "tts_pad_token_id": FULL_SPECIAL_TOKENS["<tts_pad>"], "tts_bos_token_id": FULL_SPECIAL_TOKENS["<tts_text_bos>"],
        "tts_eos_token_id": FULL_SPECIAL_TOKENS["<tts_text_eod>"], "torch_dtype": "bfloat16",
    })
    if model_type == "base":
        config["speaker_encoder_config"].update({
            "enc_dim": hidden, "enc_channels": [512, 512, 512, 512, 1536], "enc_attention_channels": 128,
            "enc_se_channels": 128,
        })
    return config


# The released generation_config.json (the official wrapper reads it as a raw dict).
DEMO_GENERATION = {
    "do_sample": True, "top_k": 50, "top_p": 1.0, "temperature": 0.9, "repetition_penalty": 1.05,
    "subtalker_dosample": True, "subtalker_top_k": 50, "subtalker_top_p": 1.0,
    "subtalker_temperature": 0.9, "max_new_tokens": 8192,
}

# --------------------------------------------------------------------------------------------------
# speech_tokenizer/ configuration. Same content as tests/checkpoints/tiny_speech_tokenizer.py
# (tests/test_demo_checkpoint.py asserts they stay equal).
# --------------------------------------------------------------------------------------------------

_SAMPLE_RATE = 24_000
_SAMPLES_PER_FRAME = 1920


def _decoder_config(sliding_window: int = 72) -> dict[str, Any]:
    """`decoder_config`: real structure (16 quantizers, all upsampling stages), tiny widths; keeps the
    released 72-frame attention window, and head_dim * heads != hidden_size as in the release."""
    return {
        "codebook_size": 2048, "codebook_dim": 16, "latent_dim": 32, "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "attention_bias": False, "attention_dropout": 0.0, "sliding_window": sliding_window,
        "max_position_embeddings": 8000, "rope_theta": 10000, "rms_norm_eps": 1e-5, "hidden_act": "silu",
        "layer_scale_initial_scale": 0.01, "num_quantizers": 16, "num_semantic_quantizers": 1,
        "semantic_codebook_size": 4096, "vector_quantization_hidden_dimension": 16,
        "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2], "decoder_dim": 64,
    }


def _encoder_config() -> dict[str, Any]:
    """`encoder_config` (a `MimiConfig`): SEANet rates and frame rate as released, 32 quantizers of
    which the tokenizer keeps the first 16."""
    return {
        "model_type": "mimi", "sampling_rate": _SAMPLE_RATE, "_frame_rate": 12.5, "audio_channels": 1,
        "hidden_size": 32, "num_filters": 4, "num_residual_layers": 1, "upsampling_ratios": [8, 6, 5, 4],
        "kernel_size": 7, "last_kernel_size": 3, "residual_kernel_size": 3, "dilation_growth_rate": 2,
        "use_causal_conv": True, "pad_mode": "constant", "compress": 2, "trim_right_ratio": 1.0,
        "codebook_size": 2048, "codebook_dim": 16, "num_quantizers": 32, "num_semantic_quantizers": 1,
        "use_conv_shortcut": False, "vector_quantization_hidden_dimension": 16, "upsample_groups": 32,
        "num_hidden_layers": 1, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4,
        "head_dim": 8, "hidden_act": "gelu", "max_position_embeddings": 8000, "initializer_range": 0.02,
        "norm_eps": 1e-5, "use_cache": False, "use_streaming": False, "rope_theta": 10000.0,
        "sliding_window": 250, "attention_dropout": 0.0, "layer_scale_initial_scale": 0.01,
        "attention_bias": False,
    }


def _full_decoder_config() -> dict[str, Any]:
    """The released `decoder_config` values."""
    return {**_decoder_config(), "codebook_dim": 512, "latent_dim": 1024, "hidden_size": 512,
            "intermediate_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 16,
            "head_dim": 64, "decoder_dim": 1536, "vector_quantization_hidden_dimension": 512}


def _full_encoder_config() -> dict[str, Any]:
    """A released-size Mimi encoder (SEANet 64 filters, 8-layer 512-wide transformer, dim-256 RVQ)."""
    return {**_encoder_config(), "hidden_size": 512, "num_filters": 64, "num_hidden_layers": 8,
            "intermediate_size": 2048, "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 64,
            "codebook_dim": 256, "vector_quantization_hidden_dimension": 256, "upsample_groups": 512}


def demo_speech_tokenizer_config(sliding_window: int = 72, shape: str = "tiny") -> dict[str, Any]:
    """The whole `speech_tokenizer/config.json`, shaped like the released file."""
    if shape != "tiny":
        return {**demo_speech_tokenizer_config(sliding_window), "encoder_config": _full_encoder_config(),
                "decoder_config": _full_decoder_config()}
    return {
        "architectures": ["Qwen3TTSTokenizerV2Model"],
        "model_type": "qwen3_tts_tokenizer_12hz",
        "encoder_valid_num_quantizers": 16,
        "input_sample_rate": _SAMPLE_RATE,
        "output_sample_rate": _SAMPLE_RATE,
        "decode_upsample_rate": _SAMPLES_PER_FRAME,
        "encode_downsample_rate": _SAMPLES_PER_FRAME,
        "encoder_config": _encoder_config(),
        "decoder_config": _decoder_config(sliding_window),
        "transformers_version": "4.57.3",
    }


_PREPROCESSOR_CONFIG = {
    "chunk_length_s": None, "feature_extractor_type": "EncodecFeatureExtractor", "feature_size": 1,
    "overlap": None, "padding_side": "right", "padding_value": 0.0, "return_attention_mask": True,
    "sampling_rate": _SAMPLE_RATE,
}
_CONFIGURATION_JSON = {"framework": "pytorch", "task": "audio-tokenizer", "allow_remote": True}

# --------------------------------------------------------------------------------------------------
# Tensor names and shapes (no official code needed)
# --------------------------------------------------------------------------------------------------

Shapes = dict[str, tuple[int, ...]]


def _talker_shapes(folder: Path) -> Shapes:
    """Every `talker.*` tensor: what `validate_checkpoint_weights` checks, plus the text projection
    (official `Qwen3TTSTalkerResizeMLP(text_hidden, text_hidden, hidden, bias=True)`)."""
    from tts_engine.models.qwen3_tts.config import load_config
    from tts_engine.models.qwen3_tts.weights import _expected_talker_shapes

    config = load_config(folder)
    shapes = _expected_talker_shapes(config)
    text, hidden = config.talker.text_hidden_size, config.talker.shape.hidden_size
    shapes.update({
        "talker.text_projection.linear_fc1.weight": (text, text),
        "talker.text_projection.linear_fc1.bias": (text,),
        "talker.text_projection.linear_fc2.weight": (hidden, text),
        "talker.text_projection.linear_fc2.bias": (hidden,),
    })
    return shapes


def _state_shapes(module: torch.nn.Module, prefix: str) -> Shapes:
    """Names and shapes of a module's persistent state (parameters and saved buffers)."""
    shapes: Shapes = {}
    for name, tensor in module.state_dict().items():
        if not tensor.is_floating_point():  # none exist today; they would need real values, not noise
            raise RuntimeError(f"{prefix}{name}: non-floating tensor ({tensor.dtype}) is not supported")
        shapes[prefix + name] = tuple(tensor.shape)
    return shapes


def _speaker_encoder_shapes(config: Mapping[str, Any]) -> Shapes:
    from tts_engine.models.qwen3_tts.speaker_encoder import SpeakerEncoder

    with torch.device("meta"):
        encoder = SpeakerEncoder.from_model_config(config)
    return _state_shapes(encoder, "speaker_encoder.")


def _codec_shapes(config: Mapping[str, Any]) -> Shapes:
    """`decoder.*` from our Code2WavDecoder (+ the encoder-side RVQ input projections the official
    decoder stores but never uses), `encoder.*` from a MimiModel without its decoder half, exactly as
    the official `Qwen3TTSTokenizerV2Encoder` (and our codec_encoder.py) builds it."""
    from transformers import MimiConfig, MimiModel
    from transformers.modeling_utils import no_init_weights

    from tts_engine.models.qwen3_tts import codec_decoder, codec_encoder

    dec_cfg = codec_decoder.Code2WavConfig.from_dict(config["decoder_config"])
    mimi_cfg = MimiConfig(**{k: v for k, v in config["encoder_config"].items() if k != "model_type"})
    with torch.device("meta"), no_init_weights():
        decoder = codec_decoder.Code2WavDecoder(dec_cfg)
        mimi = MimiModel(mimi_cfg)
    for part in codec_encoder._DECODER_PARTS:
        setattr(mimi, part, None)
    shapes = _state_shapes(decoder, codec_decoder.WEIGHT_PREFIX)
    half = dec_cfg.codebook_dim // 2  # official split RVQ: input_proj = Conv1d(dim, dim / 2, 1, bias=False)
    for name in codec_decoder.UNUSED_WEIGHTS:
        shapes[codec_decoder.WEIGHT_PREFIX + name] = (half, dec_cfg.codebook_dim, 1)
    shapes.update(_state_shapes(mimi, codec_encoder.WEIGHT_PREFIX))
    return shapes


# --------------------------------------------------------------------------------------------------
# Random values
# --------------------------------------------------------------------------------------------------

Rule = Callable[[str, tuple[int, ...], torch.Generator], torch.Tensor]


def _lm_value(name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Talker, code predictor, speaker encoder (the test builder's rule): norms ~1, the rest small."""
    noise = torch.randn(shape, generator=gen)
    if name.endswith(("norm.weight", ".scale")) or "layernorm" in name:
        return 1.0 + 0.1 * noise
    if "running_var" in name:
        return 1.0 + 0.1 * noise.abs()
    return 0.05 * noise


def _codec_value(name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Speech tokenizer (the test builder's rule): scaled so the waveform is loud but mostly inside
    [-1, 1]. Default inits would give silence (`embedding_sum` 0) or hide bugs (SnakeBeta 0)."""
    leaf = name.rsplit(".", 1)[-1]

    def normal(std: float, mean: float = 0.0) -> torch.Tensor:
        return torch.randn(shape, generator=gen) * std + mean

    if leaf == "initialized":  # Mimi codebook flag: must stay "initialized"
        return torch.ones(shape)
    if leaf == "cluster_usage":  # divides the codebook: keep it well away from the 1e-5 clamp
        return torch.rand(shape, generator=gen) + 0.5
    if leaf in ("embedding_sum", "embed_sum"):
        return normal(1.0)
    if leaf in ("alpha", "beta"):  # SnakeBeta, used as exp(alpha), exp(beta)
        return normal(0.3)
    if leaf in ("scale", "gamma"):  # LayerScale / ConvNeXt gamma: visible but not dominant residuals
        return normal(0.1, mean=0.3)
    if len(shape) == 1:
        if "norm" in name and leaf == "weight":
            return normal(0.1, mean=1.0)
        return normal(0.05)  # biases
    fan_in = 1
    for d in shape[1:]:
        fan_in *= d  # Linear [out, in], Conv1d [out, in/groups, k]
    if re.search(r"decoder\.decoder\.\d+\.block\.1\.conv\.weight$", name):
        fan_in = shape[0] * 2  # ConvTranspose [in, out, 2r] stride r: 2 taps per output sample
    elif re.search(r"decoder\.upsample\.\d+\.0\.conv\.weight$", name):
        fan_in = shape[0]  # ConvTranspose [in, out, r] stride r: 1 tap per output sample
    std = 1.0 / max(fan_in, 1) ** 0.5
    if re.search(r"\.block\.\d\.conv2\.conv\.weight$", name):
        std *= 0.3  # decoder residual units: without this each block triples the signal
    if name == "decoder.decoder.6.conv.weight":
        std *= 0.12  # the waveform head: loud but mostly unclipped
    return normal(std)


def _randomize(shapes: Shapes, seed: int, rule: Rule) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {name: rule(name, shape, gen).to(torch.float32).contiguous() for name, shape in shapes.items()}


def _full_lm_value(name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Released-size talker/predictor/speaker encoder: norms ~1, matrices scaled by fan-in (so 28 layers
    keep activations in a sane range), embeddings and biases small."""
    if name.endswith(("norm.weight", ".scale")) or "layernorm" in name or "running_var" in name:
        return _lm_value(name, shape, gen)
    if len(shape) < 2 or "embedding" in name:
        return 0.05 * torch.randn(shape, generator=gen)
    fan_in = 1
    for d in shape[1:]:
        fan_in *= d
    return torch.randn(shape, generator=gen) * min(0.05, 0.5 / fan_in ** 0.5)


def _randomize_each(shapes: Shapes, seed: int, rule: Rule, dtype: torch.dtype, level: int,
                    what: str) -> dict[str, torch.Tensor]:
    """Large shapes: one generator per tensor (seed + CRC of the name), progress every ~10%."""
    import zlib

    out: dict[str, torch.Tensor] = {}
    total = sum(math.prod(shape) for shape in shapes.values())
    done, mark = 0, 0.1
    for name, shape in shapes.items():
        gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
        out[name] = rule(name, shape, gen).to(dtype).contiguous()
        done += math.prod(shape)
        if done >= mark * total:
            log.log(level, "demo checkpoint:   %s %3.0f%% (%.0f M parameters)", what, 100 * done / total, done / 1e6)
            mark = done / total + 0.1
    return out


# --------------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------------


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=1), encoding="utf-8")


def _save(tensors: dict[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata={"format": "pt"})


def _mib(tensors: Iterable[torch.Tensor]) -> float:
    return sum(t.numel() * t.element_size() for t in tensors) / 2**20


def _install(staging: Path, folder: Path) -> None:
    """Move the finished files from `staging` into `folder`, config.json last, so a folder with a
    config.json is complete: an interrupted build never leaves a loadable half-checkpoint."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").unlink(missing_ok=True)
    for entry in sorted(staging.iterdir(), key=lambda p: p.name == "config.json"):
        target = folder / entry.name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        os.replace(entry, target)


def build_demo_checkpoint(folder: str | Path, model_type: str = "base", size: str = "0b6", seed: int = 0,
                          progress: bool = True, shape: str = "tiny") -> Path:
    """Write a complete tiny random checkpoint (official format) into `folder` and return its path.

    `model_type`: base | custom_voice | voice_design. `size`: 0b6 (code predictor as wide as the
    talker) or 1b7 (narrower code predictor behind `small_to_mtp_projection`); both are tiny (a few
    MiB). The same arguments give byte-identical files. The files listed in the module docstring are
    replaced; anything else in `folder` is left alone. Progress goes to this module's logger at INFO
    (DEBUG when `progress=False`). Takes well under a second on a CPU.

    `shape`: "tiny" (the above), or "0.6b" / "1.7b" for random weights in the released shapes (the
    size follows the shape; a few GiB, seconds to a minute).
    """
    if model_type not in MODEL_TYPES:
        raise ValueError(f"model_type must be one of {MODEL_TYPES}, got {model_type!r}")
    if size not in MODEL_SIZES:
        raise ValueError(f"size must be one of {MODEL_SIZES}, got {size!r}")
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {SHAPES}, got {shape!r}")
    if shape != "tiny":
        size = _SHAPE_SIZE[shape]
    folder = Path(folder).expanduser().absolute()
    level = logging.INFO if progress else logging.DEBUG
    start = time.perf_counter()
    log.log(level, "demo checkpoint: building a %s random %s (%s) checkpoint in %s", shape, model_type, size, folder)

    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.building-", dir=folder.parent))
    try:
        full = shape != "tiny"
        config = full_config(model_type, shape) if full else demo_config(model_type, size)
        _write_json(staging / "config.json", config)
        _write_json(staging / "generation_config.json", DEMO_GENERATION)
        write_text_tokenizer(staging, full=full)
        log.log(level, "demo checkpoint: [1/3] config.json, generation_config.json, text tokenizer")

        if full:
            tensors = _randomize_each(_talker_shapes(staging), seed, _full_lm_value, torch.bfloat16, level, "talker")
            if model_type == "base":
                tensors.update(_randomize_each(_speaker_encoder_shapes(config), seed + 1000, _full_lm_value,
                                               torch.bfloat16, level, "speaker encoder"))
        else:
            tensors = _randomize(_talker_shapes(staging), seed, _lm_value)
            if model_type == "base":
                tensors.update(_randomize(_speaker_encoder_shapes(config), seed + 1000, _lm_value))
        _save(tensors, staging / "model.safetensors")
        log.log(level, "demo checkpoint: [2/3] model.safetensors: %d tensors, %.1f MiB%s", len(tensors),
                _mib(tensors.values()), " (talker + speaker encoder)" if model_type == "base" else " (talker)")

        codec_dir = staging / "speech_tokenizer"
        codec_dir.mkdir()
        codec_config = demo_speech_tokenizer_config(shape=shape)
        if full:
            codec = _randomize_each(_codec_shapes(codec_config), seed + 1, _codec_value, torch.float32, level, "codec")
        else:
            codec = _randomize(_codec_shapes(codec_config), seed + 1, _codec_value)
        _save(codec, codec_dir / "model.safetensors")
        _write_json(codec_dir / "config.json", codec_config)
        _write_json(codec_dir / "configuration.json", _CONFIGURATION_JSON)
        _write_json(codec_dir / "preprocessor_config.json", _PREPROCESSOR_CONFIG)
        log.log(level, "demo checkpoint: [3/3] speech_tokenizer/: %d tensors, %.1f MiB", len(codec),
                _mib(codec.values()))

        _install(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.log(level, "demo checkpoint: done in %.1f s", time.perf_counter() - start)
    return folder
