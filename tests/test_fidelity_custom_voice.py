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


def test_cached_prompt_parts_equal_freshly_built_ones(engine):
    """The prompt builder keeps what every request of a language and preset speaker shares; a prompt built from
    the cache is the one built from scratch, and a speaker vector (a cloned voice) is never cached."""
    import torch

    from tts_engine.models.qwen3_tts.prompt import PromptInputs
    cases = [PromptInputs(text="Hi there.", language="english", speaker="ryan"),
             PromptInputs(text="Good morning, everyone.", language="auto", speaker="eric"),      # dialect
             PromptInputs(text="I have news.", language="english", speaker="vivian", instruct="Speak slowly."),
             PromptInputs(text="Nobody's voice.", language="chinese"),
             PromptInputs(text="Hi there.", language="english", speaker="ryan", non_streaming_mode=True),
             PromptInputs(text="Hi there.", language="chinese", speaker="ryan")]       # same speaker, other language
    prompts = engine.prompts
    try:
        prompts.cache_constants = prompts.cache_prefills = False
        prompts._constants.clear()
        prompts.leads.clear()
        prompts.first_rows.clear()
        fresh = [prompts.build(c) for c in cases]
        prompts.cache_constants = True
        constants_only = [prompts.build(c) for c in cases]
        prompts.cache_prefills = True
        computed = prompts.first_rows.misses
        cached = [[prompts.build(c) for c in cases] for _ in range(2)]     # the first fills the caches
    finally:
        prompts.cache_constants = prompts.cache_prefills = True
    assert ("codec track", engine.config.talker.languages["english"], "ryan") in prompts._constants
    # every prompt was put together from host pieces; the streaming ones' first text rows ("Hi", "Good", "I",
    # "Nobody") computed once, found the second time
    assert len(prompts.first_rows) == 4 and prompts.first_rows.misses - computed == 4
    assert len(prompts.leads) == 6            # (instruct, language, speaker): ryan in two languages; the tail
    for run in [constants_only, *cached]:
        for alone, built in zip(fresh, run):
            if built.ready is not None:        # on a GPU: the trailing text's kernels may still be running
                built.ready.synchronize()
            assert torch.equal(alone.prefill, built.prefill) and torch.equal(alone.trailing, built.trailing)
            assert torch.equal(alone.tts_pad, built.tts_pad)
    hidden = prompts.text.linear_fc2.out_features
    v1, v2 = torch.randn(hidden, generator=torch.Generator().manual_seed(1)), torch.zeros(hidden)
    one, two = (prompts.build(PromptInputs(text="Cloned.", language="chinese", speaker_vector=v)) for v in (v1, v2))
    assert not torch.equal(one.prefill, two.prefill), "a speaker vector's prompt came from another voice's cache"
    again = prompts.build(PromptInputs(text="Cloned.", language="chinese", speaker_vector=v1.clone()))
    try:                     # a cloned voice's pieces are found again by its vector, and equal a fresh build
        prompts.cache_prefills = False
        fresh_one = prompts.build(PromptInputs(text="Cloned.", language="chinese", speaker_vector=v1))
    finally:
        prompts.cache_prefills = True
    assert torch.equal(again.prefill, one.prefill) and torch.equal(fresh_one.prefill, one.prefill)
    plain = prompts.build(PromptInputs(text="Cloned.", language="chinese"))     # (chinese, no speaker) is cached
    assert one.prefill.shape[0] == plain.prefill.shape[0] + 1, "the speaker vector's row is missing"


def test_prompts_built_together_equal_prompts_built_alone(engine):
    """`build_many` (a burst's prompts in one call: one tokenizer call, one upload, one host buffer) gives every
    prompt the bits `build` gives it alone, in both text modes, with and without the host pieces' caches; a prompt
    that cannot be built fails alone, its error in its place."""
    import torch

    from tts_engine.models.qwen3_tts.prompt import PromptInputs
    hidden = engine.prompts.text.linear_fc2.out_features
    vector = torch.randn(hidden, generator=torch.Generator().manual_seed(3))
    cases = [PromptInputs(text="Hi", language="english", speaker="ryan", non_streaming_mode=True),
             PromptInputs(text="A longer sentence, with a comma and more words in it.", language="auto",
                          speaker="eric", non_streaming_mode=True),
             PromptInputs(text="I have news.", language="english", speaker="vivian", instruct="Speak slowly."),
             PromptInputs(text="Yes.", language="chinese", speaker_vector=vector, non_streaming_mode=True),
             PromptInputs(text="Streaming a step at a time.", language="english", speaker="dylan"),
             PromptInputs(text="Nobody's voice, the whole text at once.", language="chinese",
                          non_streaming_mode=True)]
    bad = PromptInputs(text="Unknown language.", language="klingon", speaker="ryan", non_streaming_mode=True)
    prompts = engine.prompts

    def same(alone, together):
        for prompt in (alone, together):
            if prompt.ready is not None:       # on a GPU: the copies and the trailing text's kernels
                prompt.ready.synchronize()
        return all(torch.equal(getattr(alone, field), getattr(together, field))
                   for field in ("prefill", "trailing", "tts_pad"))
    for cache in (True, False):
        prompts.cache_prefills = cache
        try:
            alone = [prompts.build(case) for case in cases]
            together = prompts.build_many(cases[:3] + [bad] + cases[3:])
        finally:
            prompts.cache_prefills = True
        assert isinstance(together.pop(3), KeyError), "the bad prompt's own error, in its place"
        assert all(same(a, t) for a, t in zip(alone, together)), f"cache_prefills={cache}"
    assert prompts.build_many([]) == []


def test_host_rows_keep_the_most_recently_used_up_to_their_capacity():
    import torch

    from tts_engine.models.qwen3_tts.prompt import HostRows
    rows, computed = HostRows(2), []

    def make(value):
        return lambda: computed.append(value) or torch.full((1, 3), float(value))

    assert rows.get(("a",), make(1))[0, 0] == 1 and rows.get(("b",), make(2))[0, 0] == 2
    assert rows.get(("a",), make(9))[0, 0] == 1          # found: not computed again, and now the most recent
    rows.get(("c",), make(3))                             # over capacity: "b", the least recently used, goes
    assert rows.get(("a",), make(9))[0, 0] == 1 and rows.get(("b",), make(4))[0, 0] == 4
    assert computed == [1, 2, 3, 4] and len(rows) == 2 and (rows.hits, rows.misses) == (2, 4)


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
