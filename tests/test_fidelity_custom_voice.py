"""CustomVoice (1.7B-like): preset speakers, dialect override, instructions; both text modes."""

from __future__ import annotations

import pytest

from tests.conftest import ENGINE_OPTIONS
from tests.fidelity import check_against_reference, engine_fixture
from tts_engine import RequestError, SpeechRequest

CASES = {
    "speaker": dict(text="Hello there, how are you today?", speaker="ryan", language="english"),
    "dialect_auto": dict(text="Good morning everyone.", speaker="eric", language="auto"),
    "dialect_chinese": dict(text="Nice weather today.", speaker="dylan", language="chinese"),
    "instruct": dict(text="I have some news for you.", speaker="vivian", language="english",
                     instruct="Speak slowly, with a warm and happy voice."),
}


engine = engine_fixture("custom_voice", **ENGINE_OPTIONS)


@pytest.mark.parametrize("non_streaming", [True, False], ids=["non_streaming", "streaming_text"])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_reference(engine, checkpoints, case, non_streaming):
    check_against_reference(engine, checkpoints["custom_voice"], "generate_custom_voice", non_streaming, **CASES[case])


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
