"""Tiny random Qwen3-TTS 12 Hz checkpoints in the official on-disk format.

Real weights cannot be downloaded in our build environment, so the loading code is exercised on
folders that look exactly like the published ones (config.json written by hand with every field,
model.safetensors with the official parameter names, a Qwen2 BPE tokenizer, speech_tokenizer/), only
small. The parameters come from the official `qwen_tts` classes, so both implementations read the
same names and shapes. Talker head_dim is 64 because vLLM's CPU attention rejects smaller heads.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from tests.checkpoints.tiny_speech_tokenizer import write_tiny_speech_tokenizer

# Text tokenizer: 256 byte symbols, merged words, then special tokens (ids chosen small on purpose).
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
    return dict(zip(printable, map(chr, chars)))


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


def write_text_tokenizer(folder: Path) -> dict[str, int]:
    vocab, merges = _bpe_vocab()
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    added = {str(i): {"content": tok, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": True} for tok, i in SPECIAL_TOKENS.items()}
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "add_prefix_space": False, "added_tokens_decoder": added, "bos_token": None,
        "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>", "errors": "replace",
        "model_max_length": 32768, "pad_token": "<|endoftext|>", "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
    }, indent=1), encoding="utf-8")
    return vocab


def tiny_config(model_type: str, size: str = "0b6") -> dict:
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


OFFICIAL_GENERATION = {
    "do_sample": True, "top_k": 50, "top_p": 1.0, "temperature": 0.9, "repetition_penalty": 1.05,
    "subtalker_dosample": True, "subtalker_top_k": 50, "subtalker_top_p": 1.0,
    "subtalker_temperature": 0.9, "max_new_tokens": 8192,
}


def _randomize(module: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """Every parameter random (the default init leaves some at 0/1, which hides bugs)."""
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name, tensor in module.state_dict().items():
        if not tensor.is_floating_point():
            state[name] = tensor.clone()
            continue
        noise = torch.randn(tensor.shape, generator=gen)
        if name.endswith("norm.weight") or "layernorm" in name or name.endswith(".scale"):
            value = 1.0 + 0.1 * noise
        elif "running_var" in name:
            value = 1.0 + 0.1 * noise.abs()
        else:
            value = 0.05 * noise
        state[name] = value.to(torch.float32).contiguous()
    return state


def write_tiny_checkpoint(folder: str | Path, model_type: str = "base", size: str = "0b6",
                          seed: int = 0) -> Path:
    """Write a complete official-format checkpoint folder and return its path."""
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = tiny_config(model_type, size)
    (folder / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    (folder / "generation_config.json").write_text(json.dumps(OFFICIAL_GENERATION, indent=1), encoding="utf-8")
    write_text_tokenizer(folder)
    torch.manual_seed(seed)
    model = Qwen3TTSForConditionalGeneration(Qwen3TTSConfig(**json.loads(json.dumps(config))))
    save_file(_randomize(model, seed), str(folder / "model.safetensors"), metadata={"format": "pt"})
    write_tiny_speech_tokenizer(folder / "speech_tokenizer", seed=seed + 1)
    return folder
