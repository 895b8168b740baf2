"""The `--demo` checkpoint (tts_engine/tools/demo_checkpoint.py) is a valid official-format checkpoint.

It is built without the official `qwen_tts` package, from our own modules' parameter names. These tests
use `qwen_tts` as the judge: the folder loads with `Qwen3TTSModel.from_pretrained`, the official model
(talker, speaker encoder, speech tokenizer) holds exactly our tensors, and official greedy generation
on it gives audible audio. Our own loaders accept it too.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from tests.checkpoints import tiny_speech_tokenizer
from tests.checkpoints.tiny_qwen3_tts import tiny_config
from tts_engine.models.qwen3_tts.config import load_config
from tts_engine.models.qwen3_tts.weights import validate_checkpoint_weights
from tts_engine.tools.demo_checkpoint import (
    build_demo_checkpoint,
    demo_config,
    demo_speech_tokenizer_config,
)

# (model_type, size): both code-predictor layouts (0b6: same width as the talker; 1b7: projection).
CASES = [("base", "0b6"), ("base", "1b7"), ("custom_voice", "0b6"), ("custom_voice", "1b7"), ("voice_design", "1b7")]
IDS = [f"{t}-{s}" for t, s in CASES]
GREEDY = {"do_sample": False, "subtalker_dosample": False, "max_new_tokens": 6}
SPF = 1920


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Tiny ops: OpenMP threads only add contention on a small shared CPU."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> dict[tuple[str, str], Path]:
    root = tmp_path_factory.mktemp("demo")
    return {case: build_demo_checkpoint(root / "-".join(case), *case, seed=7, progress=False) for case in CASES}


_official: dict[Path, object] = {}


def official(folder: Path):
    """`qwen_tts.Qwen3TTSModel` on `folder` (loaded once per folder)."""
    if folder not in _official:
        from qwen_tts import Qwen3TTSModel

        _official[folder] = Qwen3TTSModel.from_pretrained(str(folder), dtype=torch.float32)
    return _official[folder]


def assert_same_tensors(official_state: dict[str, torch.Tensor], ours: dict[str, torch.Tensor], where: str):
    missing = sorted(set(official_state) - set(ours))
    extra = sorted(set(ours) - set(official_state))
    assert not missing and not extra, f"{where}: missing {missing[:8]}, not in the official model {extra[:8]}"
    for name, value in official_state.items():
        assert value.shape == ours[name].shape, f"{where}: {name} {tuple(value.shape)} vs {tuple(ours[name].shape)}"
        assert value.dtype == ours[name].dtype == torch.float32, f"{where}: {name} dtype"
        assert torch.equal(value, ours[name]), f"{where}: {name} differs after the official load"


def audio(seconds: float = 1.0, sr: int = 24000) -> np.ndarray:
    """A harmonic tone with a little noise: a stand-in reference clip."""
    t = np.arange(int(seconds * sr)) / sr
    rng = np.random.default_rng(0)
    wav = 0.3 * np.sin(2 * np.pi * 180 * t) + 0.1 * np.sin(2 * np.pi * 540 * t) + 0.02 * rng.standard_normal(t.size)
    return wav.astype(np.float32)


def assert_audible(wav: np.ndarray, where: str) -> None:
    wav = np.asarray(wav)
    assert wav.ndim == 1 and wav.size >= SPF and wav.size % SPF == 0, f"{where}: {wav.shape}"
    assert np.isfinite(wav).all(), where
    rms = float(np.sqrt(np.mean(wav.astype(np.float64) ** 2)))
    assert rms > 0.01, f"{where}: near-silent output (rms {rms:.2e})"
    assert np.mean(np.abs(wav) >= 0.999) < 0.5, f"{where}: mostly clipped"


# ---- (1) the official classes load it and hold exactly our tensors ---------------------------------


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_official_model_holds_our_tensors(demo, case):
    folder = demo[case]
    model = official(folder).model
    ours = load_file(str(folder / "model.safetensors"))
    official_state = model.state_dict()
    assert_same_tensors(official_state, ours, f"{folder}/model.safetensors")
    has_speaker_encoder = any(k.startswith("speaker_encoder.") for k in ours)
    assert has_speaker_encoder == (case[0] == "base")
    if case[1] == "1b7":
        assert "talker.code_predictor.small_to_mtp_projection.weight" in ours

    codec = load_file(str(folder / "speech_tokenizer" / "model.safetensors"))
    assert_same_tensors(model.speech_tokenizer.model.state_dict(), codec, f"{folder}/speech_tokenizer")


def test_random_values_are_usable(demo):
    """Norms ~1, codebooks nonzero with positive usage, no untouched default inits (0 or 1)."""
    talker = load_file(str(demo["base", "0b6"] / "model.safetensors"))
    assert abs(float(talker["talker.model.norm.weight"].mean()) - 1.0) < 0.1
    assert 0.02 < float(talker["talker.model.layers.0.mlp.up_proj.weight"].std()) < 0.1
    codec = load_file(str(demo["base", "0b6"] / "speech_tokenizer" / "model.safetensors"))
    for name, value in codec.items():
        if name.endswith("cluster_usage"):
            assert float(value.min()) > 0.1, name
        elif name.endswith(("embedding_sum", "embed_sum")):
            assert float(value.abs().mean()) > 0.1, name
        elif not name.endswith("initialized"):
            assert value.numel() < 2 or float(value.std()) > 0, f"{name} is constant"
    for name, value in {**talker, **codec}.items():
        assert torch.isfinite(value).all(), name


# ---- (2) our config parser, weight validator and loaders accept it ----------------------------------


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_our_loaders_accept_it(demo, case):
    folder = demo[case]
    config = load_config(folder)
    assert (config.model_type, config.model_size) == case
    validate_checkpoint_weights(config)
    assert json.loads((folder / "config.json").read_text()) == tiny_config(*case)


def test_our_codec_and_speaker_encoder_load_it(demo):
    from tts_engine.models.qwen3_tts.codec_decoder import Code2WavDecoder
    from tts_engine.models.qwen3_tts.codec_encoder import ReferenceAudioEncoder
    from tts_engine.models.qwen3_tts.speaker_encoder import SpeakerEncoder

    folder = demo["base", "0b6"]
    codes = ReferenceAudioEncoder.from_folder(folder / "speech_tokenizer").encode(audio(1.0))
    assert tuple(codes.shape) == (13, 16)
    wav = Code2WavDecoder.from_folder(folder / "speech_tokenizer").decode(codes)
    assert_audible(wav.numpy(), "our decoder")
    encoder = SpeakerEncoder.from_model_config(json.loads((folder / "config.json").read_text()))
    encoder.load_official_state_dict(load_file(str(folder / "model.safetensors")))
    assert encoder.embed(audio(1.0)).abs().sum() > 0


def test_same_data_as_the_test_builder():
    """One copy of the checkpoint data: the tests' builder and the demo agree on every config file."""
    for model_type in ("base", "custom_voice", "voice_design"):
        for size in ("0b6", "1b7"):
            assert demo_config(model_type, size) == tiny_config(model_type, size)
    assert demo_speech_tokenizer_config() == tiny_speech_tokenizer.tiny_tokenizer_config()


# ---- (3) official greedy generation gives audible audio -----------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_official_generate_is_audible(demo, case):
    model = official(demo[case])
    text = "Hello world."
    if case[0] == "base":
        runs = {
            "x-vector": lambda: model.generate_voice_clone(text=text, language="English", ref_audio=(audio(), 24000),
                                                           x_vector_only_mode=True, **GREEDY),
            "icl": lambda: model.generate_voice_clone(text=text, language="English", ref_audio=(audio(), 24000),
                                                      ref_text="A tone.", **GREEDY),
        }
    elif case[0] == "custom_voice":
        runs = {"custom": lambda: model.generate_custom_voice(text=text, speaker="Vivian", language="English",
                                                              **GREEDY)}
    else:
        runs = {"design": lambda: model.generate_voice_design(text=text, instruct="A calm voice.", language="English",
                                                              **GREEDY)}
    for mode, run in runs.items():
        wavs, sr = run()
        assert sr == 24000
        assert_audible(wavs[0], f"{case} {mode}")


# ---- the builder itself -------------------------------------------------------------------------------


def test_deterministic_and_rebuildable(tmp_path, caplog):
    folder = tmp_path / "ckpt"
    with caplog.at_level(logging.INFO, logger="tts_engine.tools.demo_checkpoint"):
        assert build_demo_checkpoint(folder, "voice_design", "1b7", seed=3) == folder
    assert any("[3/3]" in r.getMessage() for r in caplog.records), "no progress lines logged"
    first = {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    assert {str(p) for p in first} == {
        "config.json", "generation_config.json", "vocab.json", "merges.txt", "tokenizer_config.json",
        "model.safetensors", "speech_tokenizer/config.json", "speech_tokenizer/configuration.json",
        "speech_tokenizer/preprocessor_config.json", "speech_tokenizer/model.safetensors"}
    (folder / "notes.txt").write_text("kept")
    (folder / "model.safetensors").write_bytes(b"stale")
    build_demo_checkpoint(folder, "voice_design", "1b7", seed=3, progress=False)
    again = {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    assert again.pop(Path("notes.txt")) == b"kept"
    assert again == first
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"], "staging folder left behind"
    other = build_demo_checkpoint(tmp_path / "other", "voice_design", "1b7", seed=4, progress=False)
    name = "talker.codec_head.weight"
    with safe_open(str(folder / "model.safetensors"), "pt") as a, safe_open(str(other / "model.safetensors"), "pt") as b:
        assert not torch.equal(a.get_tensor(name), b.get_tensor(name)), "the seed is ignored"


def test_rejects_unknown_arguments(tmp_path):
    with pytest.raises(ValueError, match="model_type"):
        build_demo_checkpoint(tmp_path / "x", "karaoke")
    with pytest.raises(ValueError, match="size"):
        build_demo_checkpoint(tmp_path / "x", "base", "7b")
    assert not (tmp_path / "x").exists()


def test_builds_without_qwen_tts(tmp_path):
    """`--demo` must work on a machine without the official package: block it and build."""
    script = textwrap.dedent(f"""
        import sys
        sys.modules["qwen_tts"] = None  # any `import qwen_tts...` now raises ImportError
        from tts_engine.tools.demo_checkpoint import build_demo_checkpoint
        from tts_engine.models.qwen3_tts.config import load_config
        from tts_engine.models.qwen3_tts.weights import validate_checkpoint_weights
        folder = build_demo_checkpoint({str(tmp_path / "ckpt")!r}, "base", progress=False)
        validate_checkpoint_weights(load_config(folder))
        loaded = sorted(m for m in sys.modules if m.startswith(("qwen_tts.", "vllm")))
        assert not loaded, loaded
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[1],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]
