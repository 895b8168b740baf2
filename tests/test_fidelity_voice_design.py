"""VoiceDesign (1.7B-like): a voice from a description; both text modes."""

from __future__ import annotations

import pytest

from tests.conftest import ENGINE_OPTIONS
from tests.fidelity import check_against_reference, engine_fixture
from tts_engine import RequestError, SpeechRequest

CASES = {
    "english": dict(text="Welcome to the show.", language="english",
                    instruct="A deep, calm male voice with a slight rasp."),
    "auto": dict(text="See you tomorrow!", language="auto", instruct="A bright young female voice, cheerful."),
}


engine = engine_fixture("voice_design", **ENGINE_OPTIONS)


@pytest.mark.parametrize("non_streaming", [True, False], ids=["non_streaming", "streaming_text"])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_reference(engine, checkpoints, case, non_streaming):
    check_against_reference(engine, checkpoints["voice_design"], "generate_voice_design", non_streaming, **CASES[case])


def test_voice_design_needs_instruct(engine):
    with pytest.raises(RequestError, match="instruct is required"):
        engine.synthesize(SpeechRequest(text="Hello"))
    with pytest.raises(RequestError, match="instruct is required"):
        engine.synthesize(SpeechRequest(text="Hello", instruct="   "))
