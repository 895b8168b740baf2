"""VoiceDesign (1.7B-like): a voice from a description; both text modes."""

from __future__ import annotations

import pytest

from tests.conftest import ENGINE_OPTIONS
from tests.fidelity import MAX_NEW_TOKENS, assert_same_output
from tests.reference import run_reference
from tts_engine import RequestError, SpeechRequest, TTSEngine

CASES = {
    "english": dict(text="Welcome to the show.", language="english",
                    instruct="A deep, calm male voice with a slight rasp."),
    "auto": dict(text="See you tomorrow!", language="auto", instruct="A bright young female voice, cheerful."),
}


@pytest.fixture(scope="module")
def engine(checkpoints):
    eng = TTSEngine.from_pretrained(checkpoints["voice_design"], **ENGINE_OPTIONS)
    yield eng
    eng.close()


@pytest.mark.parametrize("non_streaming", [True, False], ids=["non_streaming", "streaming_text"])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_reference(engine, checkpoints, case, non_streaming):
    kw = CASES[case]
    ref_codes, ref_wav = run_reference(str(checkpoints["voice_design"]), "generate_voice_design",
                                       non_streaming_mode=non_streaming, max_new_tokens=MAX_NEW_TOKENS, **kw)
    result = engine.synthesize(SpeechRequest(**kw, non_streaming_mode=non_streaming, do_sample=False,
                                             subtalker_do_sample=False, max_new_tokens=MAX_NEW_TOKENS))
    assert_same_output(result, ref_codes, ref_wav)


def test_voice_design_needs_instruct(engine):
    with pytest.raises(RequestError, match="instruct is required"):
        engine.synthesize(SpeechRequest(text="Hello"))
    with pytest.raises(RequestError, match="instruct is required"):
        engine.synthesize(SpeechRequest(text="Hello", instruct="   "))
