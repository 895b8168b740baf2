"""Stage configs: the shipped YAML files load; bad ones name the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tts_engine.config import StageConfigError, load_stage_config
from tts_engine.processors.qwen3_tts import talker2code2wav, talker2code2wav_async_chunk

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_shipped_configs_load():
    streaming = load_stage_config(CONFIGS / "qwen3_tts.yaml")
    assert streaming.async_chunk and streaming.talker.processor is talker2code2wav_async_chunk
    assert streaming.decoder.decode_mode == "exact" and streaming.decoder.initial_chunk_size == 1
    assert streaming.decoder.chunk_growth == 2 and streaming.decoder.chunk_size == 25
    assert streaming.talker.max_num_seqs == 64 and streaming.talker.sampling["max_new_tokens"] == 2048
    assert streaming.talker.device == "cuda:0"
    batch = load_stage_config(CONFIGS / "qwen3_tts_batch.yaml")
    assert not batch.async_chunk and batch.talker.processor is talker2code2wav
    for name in ("qwen3_tts_cpu.yaml", "qwen3_tts_tiny_cpu.yaml"):
        cpu = load_stage_config(CONFIGS / name)
        assert cpu.talker.device == "cpu" and cpu.decoder.device == "cpu"


def _write(tmp_path, edit) -> Path:
    data = yaml.safe_load((CONFIGS / "qwen3_tts.yaml").read_text())
    edit(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(surprise=1), "unknown key 'surprise'"),
    (lambda d: d["stage_args"][1]["engine_args"].update(chunk_size=0), r"engine_args\.chunk_size' must be >= 1"),
    (lambda d: d["stage_args"][1]["engine_args"].update(chunk_size="big"), "chunk_size' must be int"),
    (lambda d: d["stage_args"][1]["engine_args"].update(initial_chunk_size=0), "initial_chunk_size' must be >= 1"),
    (lambda d: d["stage_args"][1]["engine_args"].update(decode_mode="magic"), "decode_mode' must be"),
    (lambda d: d["stage_args"].pop(0), "stage 0 \\(the talker\\) is missing"),
    (lambda d: d["stage_args"][0].update(engine_input_source=[1]), "cycle: 0 -> 1 -> 0|cycle: 1 -> 0 -> 1"),
    (lambda d: d["stage_args"][1].update(engine_input_source=[7]), "unknown stage 7"),
    (lambda d: d["stage_args"][0]["engine_args"].update(custom_process_next_stage_input_func="nope.missing"),
     "custom_process_next_stage_input_func' = 'nope.missing' cannot be imported"),
    (lambda d: d["stage_args"][0]["runtime"].update(devices="gpu-ish"), "runtime.devices"),
    (lambda d: d["stage_args"][0]["engine_args"].update(gpu_memory_utilization=1.5), "gpu_memory_utilization"),
    (lambda d: d["stage_args"][0]["default_sampling_params"].update(temperature=-1), "temperature' must be > 0"),
    (lambda d: d.pop("async_chunk"), "key 'async_chunk' is missing"),
])
def test_invalid_configs_name_file_and_key(tmp_path, edit, message):
    path = _write(tmp_path, edit)
    with pytest.raises(StageConfigError, match=message) as info:
        load_stage_config(path)
    assert str(path) in str(info.value)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(StageConfigError, match="not found"):
        load_stage_config(tmp_path / "absent.yaml")
    (tmp_path / "broken.yaml").write_text("stage_args: [unclosed")
    with pytest.raises(StageConfigError, match="malformed YAML"):
        load_stage_config(tmp_path / "broken.yaml")
