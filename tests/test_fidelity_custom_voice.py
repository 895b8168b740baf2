"""CustomVoice (1.7B-like): preset speakers, dialect override, instructions; both text modes."""

from __future__ import annotations

import pytest

from tests.conftest import ENGINE_OPTIONS
from tests.fidelity import MAX_NEW_TOKENS, assert_same_output
from tests.reference import run_reference
from tts_engine import RequestError, SpeechRequest, TTSEngine

CASES = {
    "speaker": dict(text="Hello there, how are you today?", speaker="ryan", language="english"),
    "dialect_auto": dict(text="Good morning everyone.", speaker="eric", language="auto"),
    "dialect_chinese": dict(text="Nice weather today.", speaker="dylan", language="chinese"),
    "instruct": dict(text="I have some news for you.", speaker="vivian", language="english",
                     instruct="Speak slowly, with a warm and happy voice."),
}


@pytest.fixture(scope="module")
def engine(checkpoints):
    eng = TTSEngine.from_pretrained(checkpoints["custom_voice"], **ENGINE_OPTIONS)
    yield eng
    eng.close()


@pytest.mark.parametrize("non_streaming", [True, False], ids=["non_streaming", "streaming_text"])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_reference(engine, checkpoints, case, non_streaming):
    kw = CASES[case]
    ref_codes, ref_wav = run_reference(str(checkpoints["custom_voice"]), "generate_custom_voice",
                                       non_streaming_mode=non_streaming, max_new_tokens=MAX_NEW_TOKENS, **kw)
    result = engine.synthesize(SpeechRequest(**kw, non_streaming_mode=non_streaming, do_sample=False,
                                             subtalker_do_sample=False, max_new_tokens=MAX_NEW_TOKENS))
    assert_same_output(result, ref_codes, ref_wav)


def test_dialect_changes_the_prompt(engine):
    """eric speaks Sichuan dialect for auto/chinese but not for english: the prefixes must differ."""
    from tts_engine.models.qwen3_tts.prompt import PromptInputs
    auto = engine.prompts.build(PromptInputs(text="Hi", language="auto", speaker="eric")).prefill
    english = engine.prompts.build(PromptInputs(text="Hi", language="english", speaker="eric")).prefill
    assert auto.shape == english.shape and not bool((auto == english).all())
    assert engine.prompts.language_id("auto", "eric") == engine.config.talker.languages["sichuan_dialect"]
    assert engine.prompts.language_id("english", "eric") == engine.config.talker.languages["english"]


@pytest.mark.parametrize("request_kwargs, message", [
    (dict(text="Hi", speaker="nobody"), "unknown speaker 'nobody'"),
    (dict(text="Hi", speaker="ryan", language="klingon"), "unsupported language 'klingon'"),
    (dict(text="", speaker="ryan"), "text is empty"),
    (dict(text="   \n", speaker="ryan"), "text is empty"),
    (dict(text="Hi"), "speaker is required"),
    (dict(text="Hi", speaker="ryan", ref_audio="x.wav"), "needs a Base checkpoint"),
])
def test_bad_requests_name_the_problem(engine, request_kwargs, message):
    with pytest.raises(RequestError, match=message):
        engine.synthesize(SpeechRequest(**request_kwargs))
