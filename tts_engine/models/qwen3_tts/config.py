"""Parse and validate the official Qwen3-TTS 12 Hz checkpoint configuration.

Why our own parser instead of `qwen_tts`' config classes: their defaults do not match any released
checkpoint (32 code groups, codec ids 4196-4205, ...), so a missing field silently produces a broken
model. Here every field the engine relies on must be present, and an error names the file and the key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MODEL_TYPES = ("base", "custom_voice", "voice_design")


class CheckpointError(ValueError):
    """The checkpoint folder is missing a file or holds something we cannot use."""


def read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found (an official Qwen3-TTS checkpoint folder has it)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: malformed JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


class _Reader:
    """Reads typed keys out of one JSON object, naming file and key path on failure."""

    def __init__(self, data: dict[str, Any], path: Path, prefix: str = ""):
        self.data, self.path, self.prefix = data, path, prefix

    def _fail(self, key: str, problem: str) -> CheckpointError:
        return CheckpointError(f"{self.path}: key '{self.prefix}{key}' {problem}")

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
        if key not in self.data:
            if default is ...:
                raise self._fail(key, "is missing")
            return default
        value = self.data[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (isinstance(value, bool) and kind in (int, float)):
            raise self._fail(key, f"must be {getattr(kind, '__name__', kind)}, got {value!r}")
        return value

    def positive(self, key: str, default: Any = ...) -> int:
        value = self.get(key, int, default)
        if value <= 0:
            raise self._fail(key, f"must be a positive integer, got {value}")
        return value

    def sub(self, key: str) -> "_Reader":
        return _Reader(self.get(key, dict), self.path, f"{self.prefix}{key}.")


@dataclass(frozen=True)
class TransformerShape:
    """Shape of a Qwen3-style decoder stack (talker or code predictor)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int

    @staticmethod
    def read(r: _Reader) -> "TransformerShape":
        heads, kv = r.positive("num_attention_heads"), r.positive("num_key_value_heads")
        if heads % kv:
            raise r._fail("num_key_value_heads", f"({kv}) must divide num_attention_heads ({heads})")
        return TransformerShape(
            hidden_size=r.positive("hidden_size"),
            intermediate_size=r.positive("intermediate_size"),
            num_layers=r.positive("num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=kv,
            head_dim=r.positive("head_dim", r.data.get("hidden_size", 0) // heads or ...),
            rms_norm_eps=r.get("rms_norm_eps", float, 1e-6),
            rope_theta=r.get("rope_theta", float),
            max_position_embeddings=r.positive("max_position_embeddings"),
        )


@dataclass(frozen=True)
class CodecIds:
    """Special ids of the talker's codec vocabulary."""

    pad: int
    bos: int
    eos: int
    think: int
    nothink: int
    think_bos: int
    think_eos: int


@dataclass(frozen=True)
class TalkerConfig:
    shape: TransformerShape
    code_predictor: TransformerShape
    vocab_size: int            # codec vocabulary of codebook 0 (+ special ids)
    codebook_size: int         # entries of each codebook (code predictor vocab)
    num_code_groups: int
    text_vocab_size: int
    text_hidden_size: int
    codec: CodecIds
    languages: dict[str, int]  # lower-case name -> codec language id (dialects included)
    speakers: dict[str, list[int]]
    speaker_dialect: dict[str, str | None]


@dataclass(frozen=True)
class TokenIds:
    im_start: int
    im_end: int
    assistant: int | None
    tts_pad: int
    tts_bos: int
    tts_eos: int


@dataclass(frozen=True)
class GenerationDefaults:
    """generation_config.json, with the official wrapper's fallbacks for absent keys."""

    do_sample: bool = True
    top_k: int = 50
    top_p: float = 1.0
    temperature: float = 0.9
    repetition_penalty: float = 1.05
    subtalker_do_sample: bool = True
    subtalker_top_k: int = 50
    subtalker_top_p: float = 1.0
    subtalker_temperature: float = 0.9
    max_new_tokens: int = 2048


@dataclass(frozen=True)
class Qwen3TTSConfig:
    path: Path
    model_type: str            # base | custom_voice | voice_design
    model_size: str            # 0b6 | 1b7 (as written in the checkpoint)
    tokens: TokenIds
    talker: TalkerConfig
    speaker_encoder: dict[str, Any] | None
    generation: GenerationDefaults = field(default_factory=GenerationDefaults)

    @property
    def supports_instruct(self) -> bool:
        """The official wrapper drops instruct on 0.6B CustomVoice; VoiceDesign needs it."""
        if self.model_type == "voice_design":
            return True
        return self.model_type == "custom_voice" and "0b6" not in self.model_size

    @property
    def supported_languages(self) -> list[str]:
        """`auto` plus every non-dialect language, as the official wrapper validates them."""
        return ["auto"] + [name for name in self.talker.languages if "dialect" not in name]

    @property
    def supported_speakers(self) -> list[str]:
        return list(self.talker.speakers)


def _read_talker(r: _Reader) -> TalkerConfig:
    shape = TransformerShape.read(r)
    cp_reader = r.sub("code_predictor_config")
    code_predictor = TransformerShape.read(cp_reader)
    groups = r.positive("num_code_groups")
    if groups != 16:
        raise r._fail("num_code_groups", f"must be 16 for the 12 Hz tokenizer, got {groups}")
    if cp_reader.positive("num_code_groups", groups) != groups:
        raise cp_reader._fail("num_code_groups", "must equal talker_config.num_code_groups")
    vocab = r.positive("vocab_size")
    codebook = cp_reader.positive("vocab_size")
    if vocab - 1024 != codebook:
        # The official sampler suppresses [vocab-1024, vocab) except EOS; that only works when the
        # codebook ends exactly where the special-id window starts.
        raise r._fail("vocab_size", f"({vocab}) must equal code_predictor vocab_size ({codebook}) + 1024")
    rope = r.get("rope_scaling", dict, None)
    if rope is not None:
        for key in ("mrope_section", "interleaved"):
            if key not in rope:
                raise r._fail(f"rope_scaling.{key}", "is missing (the official code reads it directly)")
        if sum(rope["mrope_section"]) * 2 != shape.head_dim:
            raise r._fail("rope_scaling.mrope_section", f"must sum to head_dim/2 = {shape.head_dim // 2}")
    codec = CodecIds(
        pad=r.get("codec_pad_id", int), bos=r.get("codec_bos_id", int), eos=r.get("codec_eos_token_id", int),
        think=r.get("codec_think_id", int), nothink=r.get("codec_nothink_id", int),
        think_bos=r.get("codec_think_bos_id", int), think_eos=r.get("codec_think_eos_id", int),
    )
    for name, value in vars(codec).items():
        if not 0 <= value < vocab:
            raise r._fail(f"codec {name} id", f"({value}) is outside the codec vocabulary [0, {vocab})")
    languages = {str(k).lower(): v for k, v in r.get("codec_language_id", dict).items()}
    speakers_raw = r.get("spk_id", dict)
    speakers: dict[str, list[int]] = {}
    for name, ids in speakers_raw.items():
        ids = ids if isinstance(ids, list) else [ids]
        if not ids or not all(isinstance(i, int) and 0 <= i < vocab for i in ids):
            raise r._fail(f"spk_id.{name}", f"must be codec ids in [0, {vocab}), got {ids!r}")
        speakers[str(name).lower()] = ids
    dialects_raw = r.get("spk_is_dialect", dict, {})
    dialects: dict[str, str | None] = {}
    for name in speakers:
        value = dialects_raw.get(name, False)
        if value not in (False, None) and str(value).lower() not in languages:
            raise r._fail(f"spk_is_dialect.{name}", f"names unknown dialect {value!r}")
        dialects[name] = str(value).lower() if value not in (False, None) else None
    return TalkerConfig(
        shape=shape, code_predictor=code_predictor, vocab_size=vocab, codebook_size=codebook,
        num_code_groups=groups, text_vocab_size=r.positive("text_vocab_size"),
        text_hidden_size=r.positive("text_hidden_size"), codec=codec, languages=languages,
        speakers=speakers, speaker_dialect=dialects,
    )


def read_generation_defaults(folder: Path) -> GenerationDefaults:
    path = folder / "generation_config.json"
    if not path.exists():
        return GenerationDefaults()
    r = _Reader(read_json(path), path)
    base = GenerationDefaults()
    return GenerationDefaults(
        do_sample=r.get("do_sample", bool, base.do_sample),
        top_k=r.get("top_k", int, base.top_k),
        top_p=r.get("top_p", float, base.top_p),
        temperature=r.get("temperature", float, base.temperature),
        repetition_penalty=r.get("repetition_penalty", float, base.repetition_penalty),
        subtalker_do_sample=r.get("subtalker_dosample", bool, base.subtalker_do_sample),
        subtalker_top_k=r.get("subtalker_top_k", int, base.subtalker_top_k),
        subtalker_top_p=r.get("subtalker_top_p", float, base.subtalker_top_p),
        subtalker_temperature=r.get("subtalker_temperature", float, base.subtalker_temperature),
        max_new_tokens=r.positive("max_new_tokens", base.max_new_tokens),
    )


def load_config(folder: str | Path) -> Qwen3TTSConfig:
    """Read `config.json` and `generation_config.json` of an official checkpoint folder."""
    folder = Path(folder)
    path = folder / "config.json"
    r = _Reader(read_json(path), path)
    if r.get("model_type", str) != "qwen3_tts":
        raise r._fail("model_type", f"must be 'qwen3_tts', got {r.data['model_type']!r}")
    tokenizer_type = r.get("tokenizer_type", str, "qwen3_tts_tokenizer_12hz")
    if tokenizer_type != "qwen3_tts_tokenizer_12hz":
        raise r._fail("tokenizer_type", f"{tokenizer_type!r} is not supported (only the 12 Hz tokenizer)")
    model_type = r.get("tts_model_type", str)
    if model_type not in MODEL_TYPES:
        raise r._fail("tts_model_type", f"must be one of {MODEL_TYPES}, got {model_type!r}")
    talker = _read_talker(r.sub("talker_config"))
    tokens = TokenIds(
        im_start=r.get("im_start_token_id", int), im_end=r.get("im_end_token_id", int),
        assistant=r.get("assistant_token_id", int, None), tts_pad=r.get("tts_pad_token_id", int),
        tts_bos=r.get("tts_bos_token_id", int), tts_eos=r.get("tts_eos_token_id", int),
    )
    for name in ("tts_pad", "tts_bos", "tts_eos", "im_start", "im_end"):
        if not 0 <= getattr(tokens, name) < talker.text_vocab_size:
            raise r._fail(f"{name}_token_id", f"is outside the text vocabulary [0, {talker.text_vocab_size})")
    speaker_encoder = None
    if model_type == "base":
        speaker_encoder = r.get("speaker_encoder_config", dict)
        enc_dim = speaker_encoder.get("enc_dim")
        if enc_dim != talker.shape.hidden_size:
            raise r._fail("speaker_encoder_config.enc_dim",
                          f"({enc_dim}) must equal talker hidden_size ({talker.shape.hidden_size})")
    return Qwen3TTSConfig(
        path=folder, model_type=model_type, model_size=r.get("tts_model_size", str, ""),
        tokens=tokens, talker=talker, speaker_encoder=speaker_encoder,
        generation=read_generation_defaults(folder),
    )
