"""Stage configs: the shipped YAML files load; bad ones name the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tts_engine.config import (
    ChunkSchedule,
    DecoderStageConfig,
    StageConfigError,
    TalkerStageConfig,
    engine_settings,
    load_stage_config,
)
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
    split = load_stage_config(CONFIGS / "qwen3_tts_split_gpus.yaml")
    assert (split.talker.device, split.decoder.device) == ("cuda:0", "cuda:1")
    for name in ("qwen3_tts_cpu.yaml", "qwen3_tts_tiny_cpu.yaml"):
        cpu = load_stage_config(CONFIGS / name)
        assert cpu.talker.device == "cpu" and cpu.decoder.device == "cpu"


def _write(tmp_path, edit, base: str = "qwen3_tts.yaml") -> Path:
    data = yaml.safe_load((CONFIGS / base).read_text())
    edit(data)
    path = tmp_path / "edited.yaml"
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
    (lambda d: d["stage_args"][0]["engine_args"].update(async_scheduling="yes"), "async_scheduling' must be bool"),
    (lambda d: d["stage_args"][1]["engine_args"].update(initial_chunk_repeats=0), "initial_chunk_repeats' must be >= 1"),
    (lambda d: d["stage_args"][0]["engine_args"].update(cudagraph_mode="ALL"), "cudagraph_mode' must be one of"),
    (lambda d: d["stage_args"][0]["engine_args"].update(cudagraph_max_tokens=0), "cudagraph_max_tokens' must be >= 1"),
    (lambda d: d["stage_args"][0]["engine_args"].update(max_batched_tokens=0), "max_batched_tokens' must be >= 1"),
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


# ---- one default per setting, the keys that decide, one schedule ----------------------------------

def _tiny_yaml(tmp_path, edit) -> Path:
    return _write(tmp_path, edit, base="qwen3_tts_tiny_cpu.yaml")


@pytest.mark.parametrize("async_chunk, processor", [
    (False, "talker2code2wav_async_chunk"), (True, "talker2code2wav")])
def test_async_chunk_and_processor_must_agree(tmp_path, async_chunk, processor):
    def edit(d):
        d["async_chunk"] = async_chunk
        d["stage_args"][0]["engine_args"]["custom_process_next_stage_input_func"] = \
            f"tts_engine.processors.qwen3_tts.{processor}"
    path = _tiny_yaml(tmp_path, edit)
    with pytest.raises(StageConfigError, match="'async_chunk' is") as info:
        load_stage_config(path)
    assert str(path) in str(info.value) and processor in str(info.value)


def test_a_processor_must_say_whether_it_streams(tmp_path):
    path = _tiny_yaml(tmp_path, lambda d: d["stage_args"][0]["engine_args"].update(
        custom_process_next_stage_input_func="tests.test_stage_config.undeclared_processor"))
    with pytest.raises(StageConfigError, match="does not declare `streams`"):
        load_stage_config(path)


def undeclared_processor(connector, pooling_output, request):   # a processor without `streams`
    return None


def test_leaving_a_key_out_gives_the_same_default_as_no_yaml(tmp_path):
    def strip(d):
        d["stage_args"][0]["runtime"].pop("max_batch_size")
        for key in ("chunk_size", "left_context_size", "initial_chunk_size", "initial_chunk_repeats", "chunk_growth",
                    "decode_mode"):
            d["stage_args"][1]["engine_args"].pop(key)
        d["stage_args"][1]["runtime"].pop("max_batch_size")
    parsed = load_stage_config(_tiny_yaml(tmp_path, strip))
    defaults = engine_settings(None)
    assert parsed.decoder.schedule == defaults.decoder.schedule == ChunkSchedule(1, 25, 2, repeats=2)
    assert parsed.talker.max_num_seqs == defaults.talker.max_num_seqs == TalkerStageConfig().max_num_seqs
    assert parsed.decoder.max_batch_size == defaults.decoder.max_batch_size
    assert defaults.talker.processor is talker2code2wav_async_chunk and defaults.async_chunk


def test_schedule_warmup_and_graph_shapes_come_from_one_place():
    decoder = load_stage_config(CONFIGS / "qwen3_tts.yaml").decoder
    assert decoder.schedule.sizes() == [1, 2, 4, 8, 16, 25]
    assert [decoder.schedule.frames(k) for k in range(8)] == [1, 1, 2, 4, 8, 16, 25, 25]
    assert decoder.schedule.frames_through_steady() == 1 + 1 + 2 + 4 + 8 + 16 + 25
    # the YAML allows 64 streams per decode: graphs must reach 64 (they stopped at 16)
    assert decoder.max_batch_size == 64 and decoder.graph_batch_sizes() == [1, 2, 4, 8, 16, 32, 64]
    assert ChunkSchedule(4, 7, 1).sizes() == [4, 7] and ChunkSchedule(3, 20, 2).sizes() == [3, 6, 12, 20]
    once = ChunkSchedule(1, 25, 2, repeats=1)            # growth from the second chunk on
    assert [once.frames(k) for k in range(8)] == [1, 2, 4, 8, 16, 25, 25, 25]
    assert once.sizes() == [1, 2, 4, 8, 16, 25] and once.frames_through_steady() == 56
    thrice = ChunkSchedule(1, 25, 2, repeats=3)          # the warm-up must still meet every size
    assert thrice.sizes() == [1, 2, 4, 8, 16, 25] and thrice.frames_through_steady() == 58
    assert ChunkSchedule(1, 25, 1, repeats=3).sizes() == [1, 25]
    assert DecoderStageConfig(max_batch_size=12).graph_batch_sizes() == [1, 2, 4, 8, 12]
    # every remainder a last chunk can have is a graph too; big chunks are split so a call holds at most
    # max_batch_frames (16 x 25 by default): 64 one-frame streams in one call, 16 streams of 25 frames
    assert decoder.graph_frame_counts() == list(range(1, 26))
    assert decoder.batch_limit(1) == 64 and decoder.batch_limit(25) == 16 and decoder.batch_limit(7) == 57
    shapes = set(decoder.graph_shapes())
    assert {(64, 1), (64, 6), (16, 25), (1, 25), (57, 7), (32, 7)} <= shapes and (32, 25) not in shapes
    assert all(b * n <= decoder.max_batch_frames for b, n in shapes)


def test_overrides_replace_fields_by_name():
    settings = engine_settings(CONFIGS / "qwen3_tts_tiny_cpu.yaml", max_num_seqs=3, chunk_size=12, device="cpu")
    assert settings.talker.max_num_seqs == 3 and settings.decoder.chunk_size == 12
    assert settings.talker.device == "cpu" and settings.talker.max_model_len == 512   # the rest stays
    with pytest.raises(TypeError, match="unknown engine option 'chunk_sise'"):
        engine_settings(None, chunk_sise=3)


def test_two_names_for_the_batch_limit_must_agree(tmp_path):
    path = _tiny_yaml(tmp_path, lambda d: d["stage_args"][0]["engine_args"].update(max_num_seqs=4))
    with pytest.raises(StageConfigError, match="name the same limit"):
        load_stage_config(path)


def test_the_model_key_is_read(tmp_path):
    from tts_engine import CheckpointError, TTSEngine

    missing = tmp_path / "no-such-checkpoint"
    path = _tiny_yaml(tmp_path, lambda d: d.update(model=str(missing)))
    assert load_stage_config(path).model == str(missing)
    with pytest.raises(CheckpointError, match="no-such-checkpoint"):
        TTSEngine.from_pretrained(stage_config=path)


def test_talker_graph_settings_reach_vllm_only_where_they_differ(tmp_path):
    from tts_engine.stages.vllm_bridge import _graph_args

    default = load_stage_config(CONFIGS / "qwen3_tts.yaml").talker
    assert (default.cudagraph_mode, default.cudagraph_max_tokens) == ("FULL", 2048)   # vLLM's step budget
    assert _graph_args(False, default.cudagraph_mode, default.cudagraph_max_tokens, 4096) == {
        "compilation_config": {"cudagraph_mode": "FULL", "max_cudagraph_capture_size": 2048}}
    # full graphs longer than a sequence may be crash vLLM's capture: capped at max_model_len
    assert _graph_args(False, "FULL", 2048, 1024) == {
        "compilation_config": {"cudagraph_mode": "FULL", "max_cudagraph_capture_size": 1024}}
    assert _graph_args(False, "FULL", 512, 256)["compilation_config"]["max_cudagraph_capture_size"] == 256
    path = _write(tmp_path, lambda d: d["stage_args"][0]["engine_args"].update(cudagraph_mode="FULL_AND_PIECEWISE"))
    talker = load_stage_config(path).talker
    assert _graph_args(False, talker.cudagraph_mode, None, 4096) == {}        # vLLM's own settings: nothing to pass
    assert _graph_args(False, talker.cudagraph_mode, 256, 128) == {          # piecewise: mixed batches uncaptured
        "compilation_config": {"cudagraph_mode": "FULL_AND_PIECEWISE", "max_cudagraph_capture_size": 256}}
    assert _graph_args(True, "FULL", 512, 4096) == {}                         # eager: no graphs
    vllm_own = _write(tmp_path, lambda d: d["stage_args"][0]["engine_args"].update(
        cudagraph_mode="FULL_AND_PIECEWISE", cudagraph_max_tokens=None))       # YAML null: vLLM's own size
    assert load_stage_config(vllm_own).talker.cudagraph_max_tokens is None
    budget = _write(tmp_path, lambda d: d["stage_args"][0]["engine_args"].update(max_batched_tokens=512))
    assert load_stage_config(budget).talker.max_batched_tokens == 512
    assert load_stage_config(CONFIGS / "qwen3_tts.yaml").talker.max_batched_tokens is None      # vLLM's
    with pytest.raises(StageConfigError, match="cudagraph_mode' must be one of"):
        engine_settings(CONFIGS / "qwen3_tts.yaml", cudagraph_mode="full")


@pytest.mark.parametrize("switch", ["high_priority_steps", "early_handover"])
def test_stage0_gpu_switches_are_on_by_default_and_can_be_switched_off(tmp_path, switch):
    """Stage 0 steps on a high-priority stream; frames go to Stage 1 as soon as the predictor made them."""
    assert getattr(load_stage_config(CONFIGS / "qwen3_tts.yaml").talker, switch) is True
    off = _write(tmp_path, lambda d: d["stage_args"][0]["engine_args"].update({switch: False}))
    assert getattr(load_stage_config(off).talker, switch) is False
    assert getattr(engine_settings(CONFIGS / "qwen3_tts.yaml", **{switch: False}).talker, switch) is False
    wrong = _write(tmp_path, lambda d: d["stage_args"][0]["engine_args"].update({switch: "yes"}))
    with pytest.raises(StageConfigError, match=switch):
        load_stage_config(wrong)


def test_async_scheduling_is_on_by_default_and_can_be_switched_off(tmp_path):
    assert load_stage_config(CONFIGS / "qwen3_tts.yaml").talker.async_scheduling
    path = _write(tmp_path, lambda d: d["stage_args"][0]["engine_args"].update(async_scheduling=False))
    assert not load_stage_config(path).talker.async_scheduling
    assert not engine_settings(CONFIGS / "qwen3_tts.yaml", async_scheduling=False).talker.async_scheduling
