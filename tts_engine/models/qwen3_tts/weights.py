"""Reading parts of the official `model.safetensors` by prefix, with errors that name what is wrong."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from tts_engine.models.qwen3_tts.config import CheckpointError


def weights_path(folder: Path) -> Path:
    path = folder / "model.safetensors"
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found (the official checkpoint ships one model.safetensors)")
    return path


def read_prefixed(folder: Path, prefix: str) -> dict[str, torch.Tensor]:
    """All tensors whose name starts with `prefix`, with the prefix stripped."""
    path = weights_path(folder)
    try:
        with safe_open(str(path), framework="pt") as handle:
            return {name[len(prefix):]: handle.get_tensor(name)
                    for name in handle.keys() if name.startswith(prefix)}
    except (OSError, RuntimeError, ValueError, SafetensorError) as exc:
        raise CheckpointError(f"{path}: unreadable safetensors file: {exc}") from exc


def load_into(module: nn.Module, state: dict[str, torch.Tensor], where: str) -> None:
    """Strict load that lists missing, unexpected and mis-shaped tensors by name."""
    expected = module.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    mismatched = [f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(v.shape)}"
                  for k, v in expected.items() if k in state and state[k].shape != v.shape]
    problems = []
    if missing:
        problems.append(f"missing {missing[:8]}{' ...' if len(missing) > 8 else ''}")
    if unexpected:
        problems.append(f"unexpected {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}")
    if mismatched:
        problems.append(f"shape mismatch {mismatched[:8]}")
    if problems:
        raise CheckpointError(f"{where}: weights do not match config.json: " + "; ".join(problems))
    module.load_state_dict(state, strict=True)


def _expected_talker_shapes(config) -> dict[str, tuple[int, ...]]:
    talker = config.talker
    shapes: dict[str, tuple[int, ...]] = {}

    def stack(prefix: str, s) -> None:
        h, d = s.hidden_size, s.head_dim
        for n in range(s.num_layers):
            p = f"{prefix}layers.{n}."
            shapes.update({
                p + "self_attn.q_proj.weight": (s.num_heads * d, h), p + "self_attn.k_proj.weight": (s.num_kv_heads * d, h),
                p + "self_attn.v_proj.weight": (s.num_kv_heads * d, h), p + "self_attn.o_proj.weight": (h, s.num_heads * d),
                p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
                p + "mlp.gate_proj.weight": (s.intermediate_size, h), p + "mlp.up_proj.weight": (s.intermediate_size, h),
                p + "mlp.down_proj.weight": (h, s.intermediate_size),
                p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            })
        shapes[f"{prefix}norm.weight"] = (h,)

    h = talker.shape.hidden_size
    stack("talker.model.", talker.shape)
    shapes["talker.model.codec_embedding.weight"] = (talker.vocab_size, h)
    shapes["talker.model.text_embedding.weight"] = (talker.text_vocab_size, talker.text_hidden_size)
    shapes["talker.codec_head.weight"] = (talker.vocab_size, h)
    cp = talker.code_predictor
    stack("talker.code_predictor.model.", cp)
    for q in range(talker.num_code_groups - 1):
        shapes[f"talker.code_predictor.model.codec_embedding.{q}.weight"] = (talker.codebook_size, h)
        shapes[f"talker.code_predictor.lm_head.{q}.weight"] = (talker.codebook_size, cp.hidden_size)
    if cp.hidden_size != h:
        shapes["talker.code_predictor.small_to_mtp_projection.weight"] = (cp.hidden_size, h)
        shapes["talker.code_predictor.small_to_mtp_projection.bias"] = (cp.hidden_size,)
    return shapes


def validate_checkpoint_weights(config) -> None:
    """Check names and shapes in model.safetensors against config.json before anything is built.

    vLLM would otherwise fail deep inside its loader with a message about its own parameter names.
    """
    path = weights_path(config.path)
    try:
        with safe_open(str(path), framework="pt") as handle:
            found = {name: tuple(handle.get_slice(name).get_shape()) for name in handle.keys()}
    except (OSError, RuntimeError, ValueError, SafetensorError) as exc:
        raise CheckpointError(f"{path}: unreadable safetensors file: {exc}") from exc
    expected = _expected_talker_shapes(config)
    missing = sorted(k for k in expected if k not in found)
    mismatched = [f"{k}: {found[k]} vs expected {v}" for k, v in expected.items() if k in found and found[k] != v]
    for key in ("talker.text_projection.linear_fc1.weight", "talker.text_projection.linear_fc2.weight"):
        if key not in found:
            missing.append(key)
    if config.model_type == "base" and not any(k.startswith("speaker_encoder.") for k in found):
        missing.append("speaker_encoder.* (a Base checkpoint carries the speaker encoder)")
    problems = []
    if missing:
        problems.append(f"missing {len(missing)} tensors, e.g. {missing[:6]}")
    if mismatched:
        problems.append(f"{len(mismatched)} tensors with the wrong shape for config.json, e.g. {mismatched[:4]}")
    if problems:
        raise CheckpointError(f"{path}: " + "; ".join(problems))
