"""The two-stage streaming engine end to end on CPU: real vLLM talker, real Stage 1 thread."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import REFERENCE_TEXT
from tests.fidelity import engine_fixture
from tts_engine import RequestError, SpeechRequest
from tts_engine.config import ChunkSchedule, load_stage_config
from tts_engine.processors.qwen3_tts import ChunkConnector, talker2code2wav_async_chunk
from tts_engine.stages.route import Route

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
GREEDY = dict(do_sample=False, subtalker_do_sample=False)


engine = engine_fixture("base", stage_config=CONFIGS / "qwen3_tts_tiny_cpu.yaml")


@pytest.fixture(scope="module")
def voices(engine, reference_clip, tmp_path_factory):
    other = tmp_path_factory.mktemp("clips2") / "other.wav"
    subprocess.run(["espeak-ng", "-v", "en-gb", "-p", "70", "-s", "130", "-w", str(other),
                    "She sells sea shells by the sea shore, every single morning."], check=True)
    return {
        "a_icl": engine.create_voice_prompt(str(reference_clip), REFERENCE_TEXT),
        "a_xvec": engine.create_voice_prompt(str(reference_clip), x_vector_only=True),
        "b_xvec": engine.create_voice_prompt(str(other), x_vector_only=True),
        "b_icl": engine.create_voice_prompt(str(other), "She sells sea shells by the sea shore, every single morning."),
    }


def _collect(engine, request):
    async def run():
        return [chunk async for chunk in engine.generate(request)]
    return asyncio.run(run())


def _frames(chunk) -> int:
    return 0 if chunk.codec_codes is None else chunk.codec_codes.shape[0]


def test_growing_chunks_from_the_config(engine, voices):
    assert engine.connector.schedule.growth == 2   # configs/qwen3_tts_tiny_cpu.yaml
    chunks = _collect(engine, SpeechRequest(text="Growing chunks.", voice=voices["a_xvec"], max_new_tokens=80,
                                            **GREEDY))
    assert engine.connector.schedule.repeats == 2
    assert [_frames(c) for c in chunks][:7] == [1, 1, 2, 4, 8, 16, 25]


def test_stream_is_delta_exact_and_equals_synthesize(engine, voices):
    request = SpeechRequest(text="Streaming test sentence, long enough for several chunks.", voice=voices["a_xvec"],
                            max_new_tokens=60, **GREEDY)
    saved = engine.connector.schedule
    engine.connector.schedule = ChunkSchedule(initial=1, size=25, growth=1)   # the seed's: 1, then 25
    try:
        chunks = _collect(engine, request)
    finally:
        engine.connector.schedule = saved
    frames = [_frames(c) for c in chunks]
    assert frames[0] == 1, "the first chunk holds initial_chunk_size frames"
    assert all(f == 25 for f in frames[1:-1]) and frames[-1] <= 25
    assert [c.chunk_idx for c in chunks] == list(range(len(chunks)))
    assert chunks[-1].is_finished and not any(c.is_finished for c in chunks[:-1])
    for c in chunks:
        assert c.sample_rate == 24000 and c.audio.dtype == np.float32
        assert c.audio.shape[0] == _frames(c) * 1920, "each chunk carries only its own new samples"
    audio = np.concatenate([c.audio for c in chunks])
    assert chunks[-1].total_generated == audio.shape[0]
    codes = np.concatenate([c.codec_codes for c in chunks if _frames(c)])
    whole = engine.decoder.decode_full(torch.from_numpy(codes)).numpy()
    assert float(np.abs(audio - whole).max()) <= 1e-4
    offline = engine.synthesize(request)
    assert np.array_equal(offline.codes, codes)
    assert float(np.abs(offline.audio - audio).max()) <= 1e-4
    m = chunks[-1].metrics
    assert m.frames == codes.shape[0] and len(m.frame_times_s) == m.frames
    assert 0 < m.first_frame_s <= m.first_chunk_s <= m.finished_s and m.real_time_factor > 0
    # each chunk's way through Stage 1, in order: handed over, its call began, its audio ready
    assert len(m.chunk_put_s) == len(m.chunk_call_s) == len(m.chunk_done_s) == len(chunks)
    assert all(put <= call <= done for put, call, done in zip(m.chunk_put_s, m.chunk_call_s, m.chunk_done_s))
    assert m.chunk_call_s[0] == m.first_decode_s and m.chunk_done_s == sorted(m.chunk_done_s)


@pytest.mark.parametrize("initial, size", [(4, 7), (1, 1)])
def test_live_chunking_variants(engine, voices, initial, size):
    saved = engine.connector.schedule
    engine.connector.schedule = ChunkSchedule(initial=initial, size=size, growth=1)
    try:
        chunks = _collect(engine, SpeechRequest(text="Chunking variants.", voice=voices["b_icl"],
                                                max_new_tokens=30, **GREEDY))
    finally:
        engine.connector.schedule = saved
    frames = [_frames(c) for c in chunks]
    assert frames[0] == initial and all(f == size for f in frames[1:-1])
    audio = np.concatenate([c.audio for c in chunks])
    codes = np.concatenate([c.codec_codes for c in chunks if _frames(c)])
    # ICL: the reference codes are the decoder's left context, so decode them first and drop them.
    ref = voices["b_icl"].ref_codes
    whole = engine.decoder.decode_full(torch.cat([ref, torch.from_numpy(codes)])).numpy()[ref.shape[0] * 1920:]
    assert float(np.abs(audio - whole).max()) <= 1e-4


BURST_TEXTS = ["One small step.", "The rain in Spain stays mainly in the plain.", "Hello, hello, can you hear me?",
               "Seven swans a swimming.", "A different sentence with numbers 1, 2, 3.", "Short.",
               "What a wonderful world it is.", "The end of the list, at last."]


def _burst(voices, names: list[str], frames: int, step: int) -> list[SpeechRequest]:
    """Eight greedy requests of cloned voices (`names` of `voices`), every third with its text in the prefill."""
    return [SpeechRequest(text=t, voice=voices[v], non_streaming_mode=i % 3 == 0, max_new_tokens=frames + step * i,
                          **GREEDY) for i, (t, v) in enumerate(zip(BURST_TEXTS, names))]


async def _codes_and_audio(engine, request: SpeechRequest) -> tuple[np.ndarray, np.ndarray]:
    chunks = [c async for c in engine.generate(request)]
    return (np.concatenate([c.codec_codes for c in chunks if _frames(c)]), np.concatenate([c.audio for c in chunks]))


def _one_at_a_time(engine, requests: list[SpeechRequest]) -> list[tuple[np.ndarray, np.ndarray]]:
    async def run():
        return [await _codes_and_audio(engine, r) for r in requests]
    return asyncio.run(run())


def test_eight_concurrent_requests_equal_their_solo_runs(engine, voices):
    requests = _burst(voices, ["a_icl", "a_xvec", "b_xvec", "b_icl"] * 2, frames=20, step=3)

    async def together():
        return await asyncio.gather(*(_codes_and_audio(engine, r) for r in requests))

    solo = _one_at_a_time(engine, requests)
    for i, ((codes0, audio0), (codes, audio)) in enumerate(zip(solo, asyncio.run(together()))):
        assert np.array_equal(codes0, codes), f"request {i}: codes changed under concurrency"
        assert audio0.shape == audio.shape and float(np.abs(audio0 - audio).max()) <= 1e-4, \
            f"request {i}: audio differs from its solo run (crosstalk?)"
    assert len({codes.tobytes() for codes, _ in solo}) == len(solo)


def test_abort_mid_stream_frees_every_buffer(engine, voices):
    saved = engine.connector.schedule
    engine.connector.schedule = ChunkSchedule(initial=1, size=1, growth=1)

    async def run():
        stream = engine.generate(SpeechRequest(text="This request will be cut short. " * 4, voice=voices["a_xvec"],
                                               max_new_tokens=200, **GREEDY))
        got = [await stream.__anext__() for _ in range(3)]
        rid = got[0].request_id
        assert not got[-1].is_finished
        await stream.aclose()
        return rid

    try:
        rid = asyncio.run(run())
    finally:
        engine.connector.schedule = saved
    engine.drain()
    state = engine.debug_state()
    assert all(rid not in ids for ids in state.values()), state
    assert state == {k: set() for k in state}, state
    assert engine.talker_engine.has_unfinished() is False
    assert engine.connector.code_prompt_token_ids == {}


@pytest.mark.parametrize("batched", [True, False], ids=["batched_on_the_pool", "on_the_loops_executor"])
def test_a_caller_that_gives_up_while_its_request_is_submitted_leaves_nothing_running(engine, voices, monkeypatch,
                                                                                      batched):
    """Cancelled while the submit ran on its thread (held inside the prompt build here), the request must not run on
    to its end with nobody reading it: the engine aborts it once it is in. Both ways of submitting: batched on the
    engine's pool (the default) and one at a time on the event loop's executor."""
    import threading

    build, building, release = engine.prompts.build_many, threading.Event(), threading.Event()

    def held_build(inputs):
        building.set()
        release.wait(30)
        return build(inputs)
    monkeypatch.setattr(engine.prompts, "build_many", held_build)
    request = SpeechRequest(text="Nobody will hear this. " * 4, voice=voices["a_xvec"], max_new_tokens=400, **GREEDY)

    async def give_up():
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(engine.generate(request, request_id="given-up").__anext__())
        await loop.run_in_executor(None, building.wait, 30)      # the submit is in the build now
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()
        await loop.shutdown_default_executor()    # the submit thread has finished (this loop stays open: a
        if engine.submits._pool is not None:       # closed one would abort the request on its first delivery)
            engine.submits._pool.submit(lambda: None).result(30)     # one thread: after the submit
        engine.drain()
        return engine.debug_state()
    if not batched:
        monkeypatch.setattr(engine, "submit_threads", None)
        monkeypatch.setattr(engine, "batch_submits", False)
    state = asyncio.run(give_up())
    assert all("given-up" not in ids for ids in state.values()), state
    engine.drain()
    assert engine.talker_engine.has_unfinished() is False


class _CopyInFlight:
    """Stands in for a prompt's CUDA event while its prefill is copied to the host (`TalkerPrompt.prefill_pending`):
    the copy "completes" when the test says so. `synchronize` gives up after a moment, as a copy that never lands
    would not, so a Stage 0 thread waiting on it still reads its commands."""

    def __init__(self):
        import threading
        self.landed = threading.Event()
        self.asked = 0

    def query(self) -> bool:
        self.asked += 1
        return self.landed.is_set()

    def synchronize(self) -> None:
        self.landed.wait(0.05)


def _copies_in_flight(engine, monkeypatch) -> list[_CopyInFlight]:
    """Every prompt built from here on is marked as still being copied to the host, until its copy lands."""
    build, copies = engine.prompts.build_many, []

    def build_in_flight(inputs):
        prompts = build(inputs)
        for prompt in prompts:
            prompt.prefill_pending, prompt.ready = True, _CopyInFlight()
            copies.append(prompt.ready)
        return prompts
    monkeypatch.setattr(engine.prompts, "build_many", build_in_flight)
    return copies


def _wait_until(condition, what: str) -> None:
    import time
    for _ in range(2000):
        if condition():
            return
        time.sleep(0.005)
    raise AssertionError(f"never happened: {what}")


def test_a_prefill_still_on_its_way_waits_in_stage0_and_streams_the_same_audio(engine, voices, monkeypatch):
    """A prompt whose prefill is still being copied to the host is not given to vLLM (which would read its bytes)
    until the copy has landed; then it runs exactly as a prompt built on the host."""
    request = SpeechRequest(text="Parked until its prompt lands.", voice=voices["a_xvec"], max_new_tokens=12,
                            seed=5)
    expected = engine.synthesize(request)
    copies = _copies_in_flight(engine, monkeypatch)

    async def run():
        loop = asyncio.get_running_loop()
        stream = engine.generate(request, request_id="parked")
        first = asyncio.ensure_future(stream.__anext__())
        await loop.run_in_executor(None, _wait_until, lambda: copies and copies[0].asked >= 3, "Stage 0 asks")
        held = engine.debug_state()
        assert "parked" in held["stage0"] and "parked" not in held["vllm"], held
        assert not first.done()
        copies[0].landed.set()
        chunks = [await first]
        async for chunk in stream:
            chunks.append(chunk)
        return chunks
    chunks = asyncio.run(run())
    assert np.array_equal(np.concatenate([c.audio for c in chunks]), expected.audio)
    engine.drain()
    assert engine.debug_state() == {k: set() for k in engine.debug_state()}


def test_a_request_aborted_before_its_prefill_lands_leaves_nothing(engine, voices, monkeypatch):
    copies = _copies_in_flight(engine, monkeypatch)
    request = SpeechRequest(text="Never admitted.", voice=voices["a_xvec"], max_new_tokens=12, **GREEDY)

    async def run():
        loop = asyncio.get_running_loop()
        stream = engine.generate(request, request_id="never")
        first = asyncio.ensure_future(stream.__anext__())
        await loop.run_in_executor(None, _wait_until, lambda: copies and copies[0].asked >= 1, "Stage 0 asks")
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
    asyncio.run(run())
    engine.drain()
    state = engine.debug_state()
    assert state == {k: set() for k in state}, state
    assert copies[0].landed.is_set() is False      # freed while its copy was still "in flight"


def test_prompt_builds_at_once_stay_within_the_bound(engine, voices, monkeypatch):
    """With `concurrent_prompt_builds` set, at most that many threads build a prompt at a time however many requests
    arrive (submitted one at a time on the loop's executor), and the streams still finish; None (the default) takes
    the bound away."""
    import threading

    build, changed = engine.prompts.build_many, threading.Condition()
    inside, most = [0], [0]

    def counted_build(inputs):
        with changed:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            changed.notify_all()
            changed.wait_for(lambda: most[0] >= 2, timeout=10)   # the first waits for a second to come in
        try:
            return build(inputs)
        finally:
            with changed:
                inside[0] -= 1
    monkeypatch.setattr(engine.prompts, "build_many", counted_build)
    monkeypatch.setattr(engine, "submit_threads", None)     # builds on the loop's executor threads, one a request
    monkeypatch.setattr(engine, "batch_submits", False)
    assert engine.concurrent_prompt_builds is None and engine._build_slots is None
    engine.concurrent_prompt_builds = 2

    async def collect(i: int):
        request = SpeechRequest(text=f"Burst request {i}.", voice=voices["a_xvec"], max_new_tokens=3, **GREEDY)
        return [chunk async for chunk in engine.generate(request)]

    async def burst():
        return await asyncio.gather(*(collect(i) for i in range(6)))
    try:
        streams = asyncio.run(burst())
    finally:
        engine.concurrent_prompt_builds = None
    assert all(chunks[-1].is_finished for chunks in streams)
    assert most[0] == 2               # two at once, never more
    assert engine._build_slots is None


def test_submits_run_on_the_engines_own_pool_when_set(engine, voices, monkeypatch):
    """Without batches, every request of a burst is submitted (its prompt built) on the engine's pool of
    `submit_threads` threads, one at a time, and the streams finish; None goes back to the event loop's executor."""
    import threading

    build, threads = engine.prompts.build_many, []

    def recorded_build(inputs):
        threads.append(threading.current_thread().name)
        return build(inputs)
    monkeypatch.setattr(engine.prompts, "build_many", recorded_build)

    async def collect(i: int):
        request = SpeechRequest(text=f"Pool request {i}.", voice=voices["a_xvec"], max_new_tokens=3, **GREEDY)
        return [chunk async for chunk in engine.generate(request)]

    async def burst(n: int):
        return await asyncio.gather(*(collect(i) for i in range(n)))
    assert engine.submit_threads == 1 and engine.batch_submits is True      # the defaults
    engine.batch_submits = False
    try:
        streams = asyncio.run(burst(6))
        assert all(chunks[-1].is_finished for chunks in streams)
        assert len(threads) == 6 and len(set(threads)) == 1 and threads[0].startswith("tts-submit"), threads
        threads.clear()
        engine.submit_threads = None
        assert asyncio.run(burst(1))[0][-1].is_finished
        assert len(threads) == 1 and not threads[0].startswith("tts-submit"), threads
    finally:
        engine.submit_threads, engine.batch_submits = 1, True


def test_batched_submits_build_a_burst_together_and_each_request_streams_what_it_streams_alone(engine, voices,
                                                                                             monkeypatch):
    """With `batch_submits` (the default), the submit thread takes every request waiting and builds their prompts in one
    `build_many`: a burst of eight is built in at most two calls (the first may start alone), each request streams
    the codes and audio it streams alone (cloned voices with and without reference codes, both text modes), and a
    bad request in the burst fails alone with its own error while the others stream."""
    requests = _burst(voices, ["a_xvec", "b_icl", "b_xvec", "a_icl"] * 2, frames=12, step=2)
    bad = [SpeechRequest(text="   ", voice=voices["a_xvec"], **GREEDY),                    # fails its validation
           SpeechRequest(text="Too hot.", voice=voices["a_xvec"], temperature=-1.0)]      # fails as it starts
    solo = _one_at_a_time(engine, requests)

    submit_many, build_many, taken, built = engine.submits.submit_many, engine.prompts.build_many, [], []
    burst = len(requests) + len(bad)

    def recorded_submit_many(submissions):
        if not taken:      # the first batch waits until the rest of the burst waits for the thread
            _wait_until(lambda: engine.submits.waiting + len(submissions) == burst, "the burst waits")
        taken.append(len(submissions))
        return submit_many(submissions)

    def recorded_build_many(inputs):
        built.append(len(inputs))
        return build_many(inputs)
    monkeypatch.setattr(engine.submits, "submit_many", recorded_submit_many)
    monkeypatch.setattr(engine.prompts, "build_many", recorded_build_many)

    async def together():
        return await asyncio.gather(*(_codes_and_audio(engine, r) for r in [*requests, *bad]), return_exceptions=True)
    assert engine.batch_submits is True and engine.submit_threads == 1      # the defaults
    results = asyncio.run(together())
    for i, ((codes0, audio0), result) in enumerate(zip(solo, results)):
        assert not isinstance(result, BaseException), f"request {i}: {result!r}"
        codes, audio = result
        assert np.array_equal(codes0, codes), f"request {i}: codes changed when built with the burst"
        assert audio0.shape == audio.shape and float(np.abs(audio0 - audio).max()) <= 1e-4, f"request {i}"
    empty, hot = results[len(requests):]
    assert isinstance(empty, RequestError) and "text is empty" in str(empty)
    assert isinstance(hot, RequestError) and "temperature" in str(hot)
    assert len(taken) <= 2 and sum(taken) == burst, taken
    assert sum(built) == burst - 1 and max(built) > 1, built      # the empty text is never built
    engine.drain()
    assert engine.debug_state() == {k: set() for k in engine.debug_state()}


def test_a_clone_from_an_uploaded_clip_runs_off_the_submit_pool(engine, reference_clip, monkeypatch):
    """With a submit pool (the default), a request that clones its voice from `ref_audio` is cloned on another thread, so
    the pool's one thread never waits for a clone; its prompt is still built on the pool."""
    import threading

    where: dict[str, str] = {}
    create, build = engine.cloner.create, engine.prompts.build_many

    def recorded_create(*args, **kwargs):
        where["clone"] = threading.current_thread().name
        return create(*args, **kwargs)

    def recorded_build(inputs):
        where["build"] = threading.current_thread().name
        return build(inputs)
    monkeypatch.setattr(engine.cloner, "create", recorded_create)
    monkeypatch.setattr(engine.prompts, "build_many", recorded_build)

    async def collect():
        request = SpeechRequest(text="A voice cloned on the way in.", ref_audio=str(reference_clip),
                                x_vector_only=True, max_new_tokens=3, **GREEDY)
        return [chunk async for chunk in engine.generate(request)]
    assert engine.submit_threads == 1
    chunks = asyncio.run(collect())
    assert chunks[-1].is_finished
    assert where["build"].startswith("tts-submit") and not where["clone"].startswith("tts-submit"), where


def test_batch_config_produces_the_same_audio(engine, voices):
    request = SpeechRequest(text="Batch versus streaming.", voice=voices["a_icl"], max_new_tokens=40, **GREEDY)
    streaming = engine.synthesize(request)
    batch_processor = load_stage_config(CONFIGS / "qwen3_tts_batch.yaml").talker.processor
    saved = engine.settings
    engine.settings = dataclasses.replace(saved, talker=dataclasses.replace(saved.talker, processor=batch_processor))
    try:
        chunks = _collect(engine, request)
        batch = engine.synthesize(request)
    finally:
        engine.settings = saved
    assert len(chunks) == 1 and chunks[0].is_finished
    assert np.array_equal(batch.codes, streaming.codes)
    assert batch.audio.shape == streaming.audio.shape
    assert float(np.abs(batch.audio - streaming.audio).max()) <= 1e-4


def test_stage1_device_comes_from_the_config(engine):
    assert engine.settings.decoder.device == "cpu"
    assert engine.decoder_device == torch.device("cpu")
    assert next(engine.decoder.parameters()).device == engine.decoder_device

    class Sink(list):
        def put(self, chunk):
            self.append(chunk)

    sink = Sink()
    route = Route("x", talker2code2wav_async_chunk, ChunkConnector(ChunkSchedule()), sink, lambda item: None,
                  lambda rid: None, stage1_device=torch.device("meta"))
    route.on_frames(torch.zeros(1, 16, dtype=torch.long))
    assert sink and sink[0].codes.device.type == "meta", "chunks must be moved to Stage 1's device"


def test_engine_errors_are_typed_and_languages_resolve_once(engine, voices):
    from tts_engine.request import PromptTooLong

    with pytest.raises(PromptTooLong, match="max_model_len"):
        engine.synthesize(SpeechRequest(text="word " * 2000, voice=voices["a_xvec"], max_new_tokens=2,
                                        non_streaming_mode=True, **GREEDY))   # the whole text in the prompt
    # ISO codes and any case resolve in the engine itself (the UI, the API and the agent routes share it)
    coded = engine.synthesize(SpeechRequest(text="Hi.", language="EN", voice=voices["a_xvec"], max_new_tokens=3,
                                            **GREEDY))
    named = engine.synthesize(SpeechRequest(text="Hi.", language="english", voice=voices["a_xvec"],
                                            max_new_tokens=3, **GREEDY))
    assert np.array_equal(coded.codes, named.codes)


def test_overlapping_requests_stream_exactly_their_reported_tokens(engine, voices):
    """Requests join a running batch, finish while others decode, one is aborted: every stream's codebook-0
    codes are the tokens vLLM reported for it but the last (the check scripts/gpu_async_check.py makes on a
    GPU with vLLM's async scheduling; here vLLM schedules synchronously)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "scripts" / "gpu_async_check.py"
    spec = importlib.util.spec_from_file_location("gpu_async_check", path)
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    assert check.overlapping_requests(engine, {"voice": voices["a_xvec"]}, 6) == []
