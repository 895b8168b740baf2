"""Broken checkpoints fail before any engine starts, with a message naming the file and the problem."""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from tests.checkpoints.tiny_qwen3_tts import tiny_config
from tts_engine import CheckpointError, TTSEngine
from tts_engine.models.qwen3_tts.config import load_config


@pytest.fixture()
def broken(checkpoints, tmp_path):
    folder = tmp_path / "ckpt"
    shutil.copytree(checkpoints["base"], folder)
    return folder


def _edit_config(folder, edit):
    data = json.loads((folder / "config.json").read_text())
    edit(data)
    (folder / "config.json").write_text(json.dumps(data))


def test_missing_config(broken):
    (broken / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"config\.json: file not found"):
        TTSEngine.from_pretrained(broken)


def test_malformed_config(broken):
    (broken / "config.json").write_text("{ not json")
    with pytest.raises(CheckpointError, match="malformed JSON"):
        TTSEngine.from_pretrained(broken)


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["talker_config"].pop("vocab_size"), "'talker_config.vocab_size' is missing"),
    (lambda d: d["talker_config"].update(num_code_groups=32), "num_code_groups' must be 16"),
    (lambda d: d.update(tts_model_type="karaoke"), "'tts_model_type' must be one of"),
    (lambda d: d["talker_config"]["rope_scaling"].pop("mrope_section"), "mrope_section' is missing"),
    (lambda d: d["talker_config"].update(hidden_size="big"), "hidden_size' must be int"),
    (lambda d: d.update(model_type="llama"), "'model_type' must be 'qwen3_tts'"),
    (lambda d: d["talker_config"].update(spk_id={"x": [99999]}), "spk_id.x"),
])
def test_invalid_config_keys(broken, edit, message):
    _edit_config(broken, edit)
    with pytest.raises(CheckpointError, match=message):
        TTSEngine.from_pretrained(broken)


def test_missing_weights(broken):
    (broken / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"model\.safetensors: file not found"):
        TTSEngine.from_pretrained(broken)


def test_weights_missing_a_tensor(broken):
    state = load_file(broken / "model.safetensors")
    state.pop("talker.model.layers.1.mlp.down_proj.weight")
    save_file(state, broken / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"missing 1 tensors.*layers\.1\.mlp\.down_proj"):
        TTSEngine.from_pretrained(broken)


def test_weights_do_not_match_config(broken):
    _edit_config(broken, lambda d: d["talker_config"].update(intermediate_size=512))
    with pytest.raises(CheckpointError, match="wrong shape for config.json"):
        TTSEngine.from_pretrained(broken)


def test_corrupt_weights(broken):
    (broken / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match="unreadable safetensors"):
        TTSEngine.from_pretrained(broken)


def test_not_a_model_argument(tmp_path):
    with pytest.raises(CheckpointError, match="not a folder"):
        TTSEngine.from_pretrained(str(tmp_path / "nope" / "deeper"))


def test_parses_all_official_fields(checkpoints):
    config = load_config(checkpoints["custom_voice"])
    assert config.model_type == "custom_voice" and config.model_size == "1b7"
    assert config.talker.codec.eos == 2150 and config.talker.codec.bos == 2149
    assert config.supported_languages[0] == "auto" and "beijing_dialect" not in config.supported_languages
    assert "english" in config.supported_languages and "eric" in config.supported_speakers
    assert config.talker.speaker_dialect["eric"] == "sichuan_dialect"
    assert config.talker.code_predictor.hidden_size == 64 and config.talker.shape.hidden_size == 128
    assert config.generation.max_new_tokens == 8192 and config.generation.top_k == 50
    assert config.supports_instruct
    assert load_config(checkpoints["base"]).speaker_encoder["enc_dim"] == 128
    assert tiny_config("base")["talker_config"]["spk_id"] == {}
