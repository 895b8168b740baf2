"""Base (0.6B-like): voice cloning (x-vector and ICL), concurrency, sampling, request errors."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from tests.conftest import ENGINE_OPTIONS, REFERENCE_TEXT
from tests.fidelity import MAX_NEW_TOKENS, assert_same_output, engine_fixture
from tests.reference import reference_model, run_reference
from tts_engine import RequestError, SpeechRequest

SHORT = "Hello world."
LONG = ("This sentence is deliberately long, so that in streaming text mode the text track outruns "
        "the reference codes by a wide margin.")
CASES = {
    "xvector": dict(text=SHORT, language="english", x_vector_only=True),
    "icl_short_text": dict(text=SHORT, language="english", ref_text=REFERENCE_TEXT),
    "icl_long_text": dict(text=LONG, language="auto", ref_text=REFERENCE_TEXT),
}
GREEDY = dict(do_sample=False, subtalker_do_sample=False, max_new_tokens=MAX_NEW_TOKENS)


engine = engine_fixture("base", **ENGINE_OPTIONS)


def _request(case: str, clip, non_streaming: bool = False, **extra) -> SpeechRequest:
    return SpeechRequest(**CASES[case], ref_audio=str(clip), non_streaming_mode=non_streaming, **{**GREEDY, **extra})


@pytest.mark.parametrize("non_streaming", [True, False], ids=["non_streaming", "streaming_text"])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_reference(engine, checkpoints, reference_clip, case, non_streaming):
    kw = dict(CASES[case])
    ref_codes, ref_wav = run_reference(
        str(checkpoints["base"]), "generate_voice_clone", ref_audio=str(reference_clip),
        x_vector_only_mode=kw.pop("x_vector_only", False), non_streaming_mode=non_streaming,
        max_new_tokens=MAX_NEW_TOKENS, **kw)
    assert_same_output(engine.synthesize(_request(case, reference_clip, non_streaming)), ref_codes, ref_wav)


def test_voice_prompt_matches_create_voice_clone_prompt(engine, checkpoints, reference_clip):
    ref = reference_model(str(checkpoints["base"])).create_voice_clone_prompt(
        ref_audio=str(reference_clip), ref_text=REFERENCE_TEXT)[0]
    ours = engine.create_voice_prompt(str(reference_clip), REFERENCE_TEXT)
    assert torch.equal(ours.ref_codes, ref.ref_code.cpu())
    assert ours.ref_codes.shape[1] == 16 and ours.ref_codes.shape[0] > 10
    diff = (ours.speaker_vector - ref.ref_spk_embedding.float().cpu()).abs().max().item()
    assert diff < 1e-5, diff
    xvec = engine.create_voice_prompt(str(reference_clip), x_vector_only=True)
    assert xvec.ref_codes is None and torch.equal(xvec.speaker_vector, ours.speaker_vector)


def test_array_reference_equals_file_reference(engine, reference_clip):
    import soundfile as sf
    wav, sr = sf.read(str(reference_clip), dtype="float32")
    from_array = engine.create_voice_prompt((wav, sr), REFERENCE_TEXT)
    from_file = engine.create_voice_prompt(str(reference_clip), REFERENCE_TEXT)
    assert torch.equal(from_array.ref_codes, from_file.ref_codes)
    assert torch.allclose(from_array.speaker_vector, from_file.speaker_vector, atol=1e-6)


def test_four_concurrent_requests_equal_their_solo_runs(engine, reference_clip):
    voice = engine.create_voice_prompt(str(reference_clip), REFERENCE_TEXT)
    requests = [
        SpeechRequest(text=SHORT, voice=voice, language="english", **GREEDY),
        SpeechRequest(text=LONG, voice=voice, language="auto", **GREEDY),
        SpeechRequest(text="Another sentence entirely.", ref_audio=str(reference_clip), x_vector_only=True,
                      non_streaming_mode=True, **GREEDY),
        SpeechRequest(text="Numbers: one, two, three.", voice=voice, non_streaming_mode=True, **GREEDY),
    ]
    solo = [engine.synthesize(r).codes for r in requests]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(engine.synthesize, requests))
    for i, (alone, batched) in enumerate(zip(solo, together)):
        assert alone.shape[0] >= 2
        assert np.array_equal(alone, batched.codes), f"request {i} changed when batched"
    assert len({r.codes.tobytes() for r in together}) == 4, "different requests gave identical codes"


def test_seeded_sampling_reproduces_and_seeds_matter(engine, reference_clip):
    voice = engine.create_voice_prompt(str(reference_clip), x_vector_only=True)
    sampled = dict(do_sample=True, subtalker_do_sample=True, temperature=1.0, subtalker_temperature=1.0,
                   top_k=50, max_new_tokens=MAX_NEW_TOKENS)
    first = engine.synthesize(SpeechRequest(text=SHORT, voice=voice, seed=1234, **sampled)).codes
    # Run the same seeded request again, this time batched with an unrelated sampled request.
    with ThreadPoolExecutor(2) as pool:
        again, _ = pool.map(engine.synthesize, [SpeechRequest(text=SHORT, voice=voice, seed=1234, **sampled),
                                                 SpeechRequest(text=LONG, voice=voice, seed=7, **sampled)])
    other = engine.synthesize(SpeechRequest(text=SHORT, voice=voice, seed=99, **sampled)).codes
    assert np.array_equal(first, again.codes)
    assert not np.array_equal(first, other), "different seeds gave the same sampled codes"


def test_top_k_one_equals_greedy(engine, reference_clip):
    voice = engine.create_voice_prompt(str(reference_clip), REFERENCE_TEXT)
    greedy = engine.synthesize(SpeechRequest(text=SHORT, voice=voice, **GREEDY)).codes
    top1 = engine.synthesize(SpeechRequest(text=SHORT, voice=voice, do_sample=True, top_k=1, temperature=0.7,
                                           subtalker_do_sample=True, subtalker_top_k=1, seed=5,
                                           max_new_tokens=MAX_NEW_TOKENS)).codes
    assert np.array_equal(greedy, top1)


def test_max_new_tokens_bounds_frames(engine, reference_clip):
    voice = engine.create_voice_prompt(str(reference_clip), x_vector_only=True)
    result = engine.synthesize(SpeechRequest(text=LONG, voice=voice, do_sample=False, subtalker_do_sample=False,
                                             max_new_tokens=5))
    assert 1 <= result.codes.shape[0] <= 4   # N sampled tokens -> at most N-1 frames, as the reference
    assert result.audio.shape[0] == result.codes.shape[0] * 1920


@pytest.mark.parametrize("request_kwargs, message", [
    (dict(text="Hi", ref_text=None), "ref_text is required"),
    (dict(text="Hi", ref_text="   "), "ref_text is required"),
    (dict(text="", x_vector_only=True), "text is empty"),
    (dict(text="Hi", x_vector_only=True, language="elvish"), "unsupported language 'elvish'"),
    (dict(text="Hi", x_vector_only=True, speaker="ryan"), "unknown speaker 'ryan'"),
])
def test_bad_requests_name_the_problem(engine, reference_clip, request_kwargs, message):
    with pytest.raises(RequestError, match=message):
        engine.synthesize(SpeechRequest(ref_audio=str(reference_clip), **request_kwargs))


def test_base_needs_a_reference(engine):
    with pytest.raises(RequestError, match="needs ref_audio"):
        engine.synthesize(SpeechRequest(text="Hi"))


def test_unreadable_reference_audio(engine, tmp_path):
    fake = tmp_path / "notes.wav"
    fake.write_text("this is not audio at all")
    with pytest.raises(RequestError, match="ref_audio"):
        engine.synthesize(SpeechRequest(text="Hi", ref_audio=str(fake), x_vector_only=True))
    with pytest.raises(RequestError, match="not found"):
        engine.synthesize(SpeechRequest(text="Hi", ref_audio=str(tmp_path / "missing.wav"), x_vector_only=True))
