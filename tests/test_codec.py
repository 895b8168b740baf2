"""Parity tests: our 12 Hz codec (Code2WavDecoder, ReferenceAudioEncoder) vs the official `qwen_tts`
Qwen3TTSTokenizer, on a tiny random checkpoint in the official folder format.

The tiny decoder keeps the released 72-frame attention window, so sequences of 100+ frames slide it,
and the approximate 25-frame-context streaming method is visibly inexact (while exact streaming is not).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.checkpoints.tiny_speech_tokenizer import write_tiny_speech_tokenizer
from tts_engine.models.qwen3_tts.codec_decoder import Code2WavDecoder
from tts_engine.models.qwen3_tts.codec_encoder import ReferenceAudioEncoder
from tts_engine.models.qwen3_tts.config import CheckpointError

SPF = 1920  # samples per frame
TOL = 1e-4


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """These tests run hundreds of tiny ops; on a small shared CPU, OpenMP threads spinning against
    other processes make them 10-50x slower. One thread for this module, restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def codec_dir(tmp_path_factory) -> Path:
    return write_tiny_speech_tokenizer(tmp_path_factory.mktemp("tiny") / "speech_tokenizer", seed=0)


@pytest.fixture(scope="session")
def official(codec_dir):
    from qwen_tts import Qwen3TTSTokenizer

    return Qwen3TTSTokenizer.from_pretrained(str(codec_dir))


@pytest.fixture(scope="session")
def decoder(codec_dir) -> Code2WavDecoder:
    return Code2WavDecoder.from_folder(codec_dir)


@pytest.fixture(scope="session")
def encoder(codec_dir) -> ReferenceAudioEncoder:
    return ReferenceAudioEncoder.from_folder(codec_dir)


def random_codes(frames: int, seed: int, batch: int | None = None) -> torch.Tensor:
    shape = (frames, 16) if batch is None else (batch, frames, 16)
    return torch.randint(0, 2048, shape, generator=torch.Generator().manual_seed(seed))


def official_decode(official, codes: torch.Tensor) -> torch.Tensor:
    wavs, sr = official.decode({"audio_codes": codes})
    assert sr == 24000
    return torch.from_numpy(wavs[0])


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item()


# ---- the tiny checkpoint -------------------------------------------------------------------------


def test_tiny_checkpoint_is_official_format_and_fully_random(codec_dir, official):
    assert {p.name for p in codec_dir.iterdir()} >= {
        "config.json",
        "configuration.json",
        "preprocessor_config.json",
        "model.safetensors",
    }
    cfg = json.loads((codec_dir / "config.json").read_text())
    dec, enc = cfg["decoder_config"], cfg["encoder_config"]
    assert cfg["model_type"] == "qwen3_tts_tokenizer_12hz" and cfg["encoder_valid_num_quantizers"] == 16
    assert (dec["num_quantizers"], dec["codebook_size"], dec["num_hidden_layers"]) == (16, 2048, 2)
    assert dec["upsample_rates"] == [8, 5, 4, 3] and dec["upsampling_ratios"] == [2, 2]
    assert enc["sampling_rate"] == 24000 and enc["upsampling_ratios"] == [8, 6, 5, 4] and enc["num_quantizers"] >= 16
    assert official.get_model_type() == "qwen3_tts_tokenizer_12hz"
    assert official.get_decode_upsample_rate() == SPF

    # Every tensor randomized: none is left constant at its init value (e.g. embedding_sum = 0).
    weights = load_file(str(codec_dir / "model.safetensors"))
    constant = [k for k, v in weights.items() if v.numel() > 1 and not k.endswith("initialized") and v.std() == 0]
    assert constant == []
    official_keys = set(official.model.state_dict())
    assert set(weights) == official_keys


def test_tiny_checkpoint_is_deterministic(tmp_path, codec_dir):
    again = write_tiny_speech_tokenizer(tmp_path / "again", seed=0)
    a, b = load_file(str(codec_dir / "model.safetensors")), load_file(str(again / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    other = load_file(str(write_tiny_speech_tokenizer(tmp_path / "other", seed=1) / "model.safetensors"))
    assert not torch.equal(a["decoder.pre_conv.conv.weight"], other["decoder.pre_conv.conv.weight"])


# ---- decoder parity ------------------------------------------------------------------------------


@pytest.mark.parametrize("frames", [1, 7, 100, 330])  # 330 > 300: the official 300/25 chunking kicks in
def test_decode_matches_official(official, decoder, frames):
    codes = random_codes(frames, seed=frames)
    ref = official_decode(official, codes)
    ours = decoder.decode(codes)
    assert ours.dtype == torch.float32 and ours.shape == (frames * SPF,)
    diff = max_diff(ours, ref)
    print(f"decode vs official, {frames} frames: max |diff| = {diff:.2e}")
    assert diff <= TOL
    # The tolerance only means something if the waveform is loud and not clipped flat.
    assert ref.pow(2).mean().sqrt() > 0.05 and (ref.abs() >= 1).float().mean() < 0.05


def test_decode_batch_with_padding_matches_official(official, decoder):
    long, short = random_codes(40, seed=1), random_codes(23, seed=2)
    ref_wavs, _ = official.decode([{"audio_codes": long}, {"audio_codes": short}])
    padded = torch.full((2, 40, 16), -1, dtype=torch.long)
    padded[0], padded[1, :23] = long, short
    ours = decoder.decode(padded)
    assert ours.shape == (2, 40 * SPF)
    assert max_diff(ours[0], torch.from_numpy(ref_wavs[0])) <= TOL
    assert max_diff(ours[1, : 23 * SPF], torch.from_numpy(ref_wavs[1])) <= TOL


def test_decode_full_matches_official_single_pass(official, decoder):
    codes = random_codes(150, seed=3)  # > 2 attention windows
    with torch.inference_mode():
        ref = official.model.decoder(codes.T[None])[0, 0]
    diff = max_diff(decoder.decode_full(codes), ref)
    print(f"decode_full vs official one-pass forward, 150 frames: max |diff| = {diff:.2e}")
    assert diff <= TOL


# ---- exact streaming -----------------------------------------------------------------------------


def stream(decoder: Code2WavDecoder, codes: torch.Tensor, first: int, size: int) -> list[torch.Tensor]:
    state = decoder.new_stream_state()
    chunks, start = [], 0
    while start < codes.shape[0]:
        n = first if start == 0 else size
        chunks.append(decoder.decode_step(state, codes[start : start + n]))
        start += n
    assert state.positions.tolist() == [codes.shape[0]]
    return chunks


@pytest.fixture(scope="session")
def stream_codes(decoder):
    codes = random_codes(90, seed=4)  # > the 72-frame window: the key/value cache must roll over
    return codes, decoder.decode_full(codes)


@pytest.mark.parametrize("first", [1, 4])
@pytest.mark.parametrize("size", [1, 7, 25])
def test_exact_streaming_equals_full_decode(decoder, stream_codes, first, size):
    codes, full = stream_codes
    chunks = stream(decoder, codes, first, size)
    assert chunks[0].shape == (first * SPF,)
    assert all(c.shape[0] % SPF == 0 for c in chunks)
    diff = max_diff(torch.cat(chunks), full)
    print(f"exact streaming (first {first}, then {size}) vs decode_full: max |diff| = {diff:.2e}")
    assert diff <= TOL


def test_batched_streams_at_different_positions(decoder):
    """Two streams decoded in one call (list of states), one 30 frames ahead of the other: per-row RoPE
    positions and window masks must keep them apart, and each equals its own full decode."""
    a, b = random_codes(110, seed=5), random_codes(80, seed=6)
    sa, sb = decoder.new_stream_state(), decoder.new_stream_state()
    out_a, out_b = [decoder.decode_step(sa, a[:30])], []
    for start in range(0, 80, 5):
        both = decoder.decode_step([sa, sb], torch.stack([a[30 + start : 35 + start], b[start : start + 5]]))
        assert both.shape == (2, 5 * SPF)
        out_a.append(both[0])
        out_b.append(both[1])
    assert sa.positions.tolist() == [110] and sb.positions.tolist() == [80]
    assert max_diff(torch.cat(out_a), decoder.decode_full(a)) <= TOL
    assert max_diff(torch.cat(out_b), decoder.decode_full(b)) <= TOL


def test_state_table_decodes_what_per_stream_states_decode(decoder):
    """Streams whose states are rows of a DecoderStateTable decode bit for bit what streams with states of their own
    decode, whatever the batch's composition and order; the table grows when full and keeps every stream's row;
    a stream that stops gives its row back and a new stream there starts fresh; a failed call writes nothing."""
    from tts_engine.models.qwen3_tts.codec_decoder import DecoderStateTable
    codes = [random_codes(40, seed=20 + i) for i in range(4)]
    table = DecoderStateTable(decoder, capacity=2)
    own = [decoder.new_stream_state() for _ in codes]
    slots = [table.open(), table.open()]
    done = {0: 0, 1: 0, 2: 0, 3: 0}                    # frames decoded per stream

    def call(members: list[int], n: int) -> None:
        batch = torch.stack([codes[i][done[i]:done[i] + n] for i in members])
        from_table = decoder.decode_rows(table, torch.tensor([slots[i] for i in members]), batch)
        from_own = decoder.decode_step([own[i] for i in members], batch)
        assert torch.equal(from_table, from_own)
        for i in members:
            done[i] += n

    call([0, 1], 3)
    slots += [table.open(), table.open()]              # a full table doubles; rows 0 and 1 are kept
    assert table.capacity == 4
    call([2, 0, 3], 5)
    call([1, 3], 1)
    call([3, 2, 1, 0], 4)
    with pytest.raises(ValueError):                    # a bad call leaves every row as it was
        decoder.decode_rows(table, torch.tensor([slots[0]]), torch.zeros(1, 2, 8, dtype=torch.long))
    call([0], 2)
    assert table.positions[torch.tensor(slots)].tolist() == [done[i] for i in range(4)]
    table.close(slots[1])                              # stream 1 stops; a new stream takes its row
    slots[1], own[1], done[1] = table.open(), decoder.new_stream_state(), 0
    table.settle()                                     # what a read of the table does first
    assert table.capacity == 4 and table.positions[slots[1]].item() == 0
    call([1, 2], 6)


@pytest.mark.parametrize("lazy", [True, False])
def test_state_table_rows_of_new_streams_are_fresh_when_read(decoder, lazy):
    """A row taken by a new stream reads as a new stream's state, whether `open` set it at once (`lazy_open` False)
    or the next read set every row opened since in one copy per buffer; a slot closed before that read is left
    alone, and growing the table in between keeps the pending rows pending."""
    from tts_engine.models.qwen3_tts.codec_decoder import DecoderStateTable
    table = DecoderStateTable(decoder, capacity=2)
    table.lazy_open = lazy
    first = table.open()
    decoder.decode_rows(table, torch.tensor([first]), random_codes(5, seed=40)[None])   # a used row
    used = [b[first].clone() for b in table.buffers]
    table.close(first)
    reused, closed_early, grown = table.open(), table.open(), table.open()   # the third grows the table
    assert reused == first and table.capacity == 4
    table.close(closed_early)
    assert closed_early not in table._fresh
    table.settle()
    fresh = decoder.new_stream_state(1)
    for slot in (reused, grown):
        assert table.positions[slot].item() == 0
        for row, initial in zip(table.buffers, fresh.buffers):
            assert torch.equal(row[slot], initial[0])
    assert any(not torch.equal(row, initial[0]) for row, initial in zip(used, fresh.buffers))   # it was not fresh
    own = decoder.new_stream_state()
    codes = random_codes(6, seed=41)[None]
    assert torch.equal(decoder.decode_rows(table, torch.tensor([reused]), codes), decoder.decode_step([own], codes))
    table.close(reused)                                # a used row again, now read by a decode with no settle before
    again = table.open()
    assert again == reused
    own = decoder.new_stream_state()
    assert torch.equal(decoder.decode_rows(table, torch.tensor([again]), codes), decoder.decode_step([own], codes))


def test_decode_step_rejects_bad_shapes(decoder):
    state = decoder.new_stream_state()
    with pytest.raises(ValueError, match="16"):
        decoder.decode_step(state, torch.zeros(3, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="batch"):
        decoder.decode_step(state, torch.zeros(2, 3, 16, dtype=torch.long))
    assert state.positions.tolist() == [0]  # a failed step leaves the state untouched


# ---- approximate (seed) streaming ----------------------------------------------------------------


def test_chunked_decode_streaming_lengths_and_official_parity(official, decoder, stream_codes):
    codes, full = stream_codes
    chunks = list(decoder.chunked_decode_streaming(codes, chunk_size=25, left_context_size=25))
    assert [c.shape[0] // SPF for c in chunks] == [25, 25, 25, 15]
    approx = torch.cat(chunks)
    assert approx.shape == full.shape == (90 * SPF,)
    # It is the official windowing algorithm with a 25/25 window ...
    with torch.inference_mode():
        ref = official.model.decoder.chunked_decode(codes.T[None], chunk_size=25, left_context_size=25)[0, 0]
    assert max_diff(approx, ref) <= TOL
    # ... which is NOT exact: a 72-frame attention window reaches past 25 frames of context.
    diff = max_diff(approx, full)
    print(f"chunked_decode_streaming(25, 25) vs decode_full: max |diff| = {diff:.3e}")
    assert diff > 1e-3

    first = list(decoder.chunked_decode_streaming(codes, chunk_size=25, left_context_size=25, first_chunk_size=1))
    assert [c.shape[0] // SPF for c in first] == [1, 25, 25, 25, 14]
    assert torch.equal(first[0], full[:SPF]) or max_diff(first[0], full[:SPF]) <= TOL  # no context needed at t=0


# ---- encoder parity ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def speech_24k(reference_clip: Path) -> np.ndarray:
    """A real speech clip (conftest: espeak-ng, 22.05 kHz) resampled to 24 kHz with librosa, as the
    reference wrapper does."""
    import librosa

    wav, sr = librosa.load(str(reference_clip), sr=None, mono=True)
    assert sr != 24000 and wav.size > 2 * sr  # a real resample of a multi-second clip
    return librosa.resample(wav, orig_sr=sr, target_sr=24000).astype(np.float32)


def test_encoder_matches_official_on_speech(official, encoder, speech_24k):
    ours = encoder.encode(speech_24k)
    ref = official.encode(speech_24k, sr=24000).audio_codes[0]
    assert ours.dtype == torch.long and ours.shape == (-(-speech_24k.size // SPF), 16) == ref.shape
    assert torch.equal(ours, ref)
    assert ours.unique().numel() > 100  # the codes carry information (not one repeated entry)


@pytest.mark.parametrize("length", [1, 1919, 1920, 1921, 10 * 1920 + 7])
def test_encoder_matches_official_on_any_length(official, encoder, length):
    t = np.arange(length) / 24000
    wav = (0.3 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 3 * t))).astype(np.float32)
    wav += np.random.default_rng(length).normal(0, 0.02, length).astype(np.float32)
    ours = encoder.encode(wav)
    assert ours.shape == (-(-length // SPF), 16)
    assert torch.equal(ours, official.encode(wav, sr=24000).audio_codes[0])


def test_encoder_rejects_wrong_rate_and_shape(encoder):
    with pytest.raises(ValueError, match="24000 Hz"):
        encoder.encode(np.zeros(1000, np.float32), sample_rate=16000)
    with pytest.raises(ValueError, match="mono"):
        encoder.encode(np.zeros((1000, 2), np.float32))


# ---- loading errors ------------------------------------------------------------------------------


def copy_codec(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("loader", [Code2WavDecoder.from_folder, ReferenceAudioEncoder.from_folder])
@pytest.mark.parametrize("missing", ["config.json", "model.safetensors"])
def test_missing_files_are_named(tmp_path, codec_dir, loader, missing):
    folder = copy_codec(codec_dir, tmp_path / "codec")
    (folder / missing).unlink()
    with pytest.raises(CheckpointError, match=f"{missing}: file not found"):
        loader(folder)


@pytest.mark.parametrize(
    ("loader", "section"),
    [(Code2WavDecoder.from_folder, "decoder_config"), (ReferenceAudioEncoder.from_folder, "encoder_config")],
)
def test_missing_config_section_is_named(tmp_path, codec_dir, loader, section):
    folder = copy_codec(codec_dir, tmp_path / "codec")
    cfg = json.loads((folder / "config.json").read_text())
    del cfg[section]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=section):
        loader(folder)


def test_decoder_weight_mismatches_are_listed(tmp_path, codec_dir):
    folder = copy_codec(codec_dir, tmp_path / "codec")
    weights = load_file(str(folder / "model.safetensors"))
    del weights["decoder.pre_transformer.layers.1.mlp.up_proj.weight"]
    weights["decoder.extra.weight"] = torch.zeros(3)
    weights["decoder.pre_conv.conv.bias"] = torch.zeros(5)
    save_file(weights, str(folder / "model.safetensors"))
    with pytest.raises(ValueError) as err:
        Code2WavDecoder.from_folder(folder)
    message = str(err.value)
    assert "model.safetensors" in message
    assert "1 missing: decoder.pre_transformer.layers.1.mlp.up_proj.weight" in message
    assert "1 unexpected: decoder.extra.weight" in message
    assert "decoder.pre_conv.conv.bias: checkpoint (5,)" in message


def test_decoder_config_not_matching_weights(tmp_path, codec_dir):
    folder = copy_codec(codec_dir, tmp_path / "codec")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["decoder_config"]["num_hidden_layers"] = 3
    cfg["decoder_config"]["latent_dim"] = 48
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"(?s)missing: decoder\.pre_transformer\.layers\.2.*shape-mismatched"):
        Code2WavDecoder.from_folder(folder)


def test_encoder_weight_mismatch_is_listed(tmp_path, codec_dir):
    folder = copy_codec(codec_dir, tmp_path / "codec")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["encoder_config"]["num_hidden_layers"] = 2
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"missing: encoder\.encoder_transformer\.layers\.1"):
        ReferenceAudioEncoder.from_folder(folder)


# ---- the released decoder's shape ----------------------------------------------------------------

RELEASED_DECODER_CONFIG = {  # speech_tokenizer/config.json -> decoder_config of the released models
    "attention_bias": False, "latent_dim": 1024, "codebook_dim": 512, "codebook_size": 2048,
    "decoder_dim": 1536, "hidden_act": "silu", "hidden_size": 512, "intermediate_size": 1024,
    "layer_scale_initial_scale": 0.01, "max_position_embeddings": 8000, "head_dim": 64,
    "num_attention_heads": 16, "num_hidden_layers": 8, "num_key_value_heads": 16, "num_quantizers": 16,
    "num_semantic_quantizers": 1, "rms_norm_eps": 1e-05, "rope_theta": 10000, "semantic_codebook_size": 4096,
    "sliding_window": 72, "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2],
    "vector_quantization_hidden_dimension": 512,
}  # fmt: skip


def test_released_config_builds_the_official_parameter_layout():
    """At full size (on the meta device: no memory, no time) our module has exactly the official
    decoder's parameter names and shapes, minus the two unused encoder-side projections."""
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2DecoderConfig
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Decoder

    from tts_engine.models.qwen3_tts.codec_decoder import UNUSED_WEIGHTS, Code2WavConfig

    with torch.device("meta"):
        ours = Code2WavDecoder(Code2WavConfig.from_dict(RELEASED_DECODER_CONFIG))
        ref = Qwen3TTSTokenizerV2Decoder(Qwen3TTSTokenizerV2DecoderConfig(**RELEASED_DECODER_CONFIG))
    ref_shapes = {k: v.shape for k, v in ref.state_dict().items() if k not in UNUSED_WEIGHTS}
    assert {k: v.shape for k, v in ours.state_dict().items()} == ref_shapes
    assert ours.samples_per_frame == 1920
    assert 110e6 < sum(p.numel() for p in ours.parameters()) < 120e6  # 114.3M (reference doc 1.5)


def test_snake_beta_keeps_its_scales_until_its_weights_change():
    """The activation computes e^alpha and 1/(e^beta + 1e-9) once per weights (29 of them in a decode step):
    the output must be the uncached formula's, bit for bit, and follow weights loaded or moved later."""
    from tts_engine.models.qwen3_tts.codec_decoder import SnakeBeta

    def uncached(act: SnakeBeta, x: torch.Tensor) -> torch.Tensor:
        alpha, beta = act.alpha.exp()[None, :, None], act.beta.exp()[None, :, None]
        return x + (1.0 / (beta + 1e-9)) * torch.sin(x * alpha).pow(2)

    gen = torch.Generator().manual_seed(0)
    act, x = SnakeBeta(6), torch.randn(2, 6, 50, generator=gen)
    with torch.inference_mode():
        assert torch.equal(act(x), uncached(act, x))                           # the zero init
        act.load_state_dict({"alpha": torch.randn(6, generator=gen), "beta": torch.randn(6, generator=gen)})
        assert torch.equal(act(x), uncached(act, x))                           # loaded in place
        first = act(x)
        with torch.no_grad():
            act.beta.mul_(2)                                                   # changed in place
        assert torch.equal(act(x), uncached(act, x)) and not torch.equal(act(x), first)
        act.double()                                                           # moved: new storage
        assert act(x.double()).dtype == torch.float64 and torch.equal(act(x.double()), uncached(act, x.double()))
        SnakeBeta.cache_scales = False                                          # the microbench's switch
        try:
            assert torch.equal(act(x.double()), uncached(act, x.double()))
        finally:
            SnakeBeta.cache_scales = True
