"""Stage input processors + AsyncDecodingPipeline on a known code sequence (no vLLM needed)."""

from __future__ import annotations

import dataclasses
import queue
import threading

import numpy as np
import pytest
import torch

from tests.checkpoints.tiny_speech_tokenizer import write_tiny_speech_tokenizer
from tts_engine.config import ChunkSchedule
from tts_engine.models.qwen3_tts.codec_decoder import Code2WavDecoder
from tts_engine.processors.qwen3_tts import ChunkConnector, CodecChunk, talker2code2wav, talker2code2wav_async_chunk
from tts_engine.stages.decoder import AsyncDecodingPipeline

FRAMES = 90   # longer than the tiny decoder's 72-frame attention window


class _Request:
    def __init__(self, request_id):
        self.request_id, self.finished = request_id, False

    def is_finished(self):
        return self.finished


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    folder = write_tiny_speech_tokenizer(tmp_path_factory.mktemp("codec") / "speech_tokenizer", seed=5)
    return Code2WavDecoder.from_folder(folder)


def _codes(seed: int, frames: int = FRAMES) -> torch.Tensor:
    return torch.randint(0, 2048, (frames, 16), generator=torch.Generator().manual_seed(seed))


def _stream(codes, processor, connector, request_id="r"):
    """Feed frames one by one as Stage 0 does; return the emitted chunks."""
    request, chunks = _Request(request_id), []
    for frame in codes:
        chunk = processor(connector, {"codes": frame[None]}, request)
        if chunk is not None:
            chunks.append(chunk)
    request.finished = True
    chunks.append(processor(connector, None, request))
    connector.free(request_id)
    return chunks


def _connector(size: int = 25, initial: int = 1, growth: int = 1) -> ChunkConnector:
    return ChunkConnector(ChunkSchedule(initial=initial, size=size, growth=growth), left_context_size=25)


@pytest.mark.parametrize("initial, size", [(1, 25), (4, 25), (1, 1), (4, 7), (1, 7), (4, 1)])
def test_chunk_sizes_and_context(initial, size):
    connector = _connector(size, initial)
    codes = _codes(0)
    chunks = _stream(codes, talker2code2wav_async_chunk, connector)
    new = [c.new_frames for c in chunks]
    assert new[0] == initial
    assert all(n == size for n in new[1:-1])
    assert 0 <= new[-1] <= size and chunks[-1].finished and not any(c.finished for c in chunks[:-1])
    assert sum(new) == FRAMES
    assert [c.chunk_idx for c in chunks] == list(range(len(chunks)))
    sent = 0
    for chunk in chunks:   # context is exactly the frames before the chunk, at most 25 of them
        ctx = chunk.left_context_size
        assert ctx == min(25, sent)
        assert torch.equal(chunk.codes, codes[sent - ctx:sent + chunk.codes.shape[0] - ctx])
        sent += chunk.new_frames
    assert connector.active_request_ids() == set()


def test_chunk_growth_schedule():
    connector = _connector(25, 1, growth=2)
    chunks = _stream(_codes(2), talker2code2wav_async_chunk, connector)
    new = [c.new_frames for c in chunks]
    assert new == [1, 2, 4, 8, 16, 25, 25, 9]


def test_batch_processor_sends_everything_once():
    connector = _connector()
    codes = _codes(1)
    chunks = _stream(codes, talker2code2wav, connector)
    assert len(chunks) == 1 and torch.equal(chunks[0].codes, codes) and chunks[0].finished


def _all_rows_free(pipeline) -> bool:
    table = pipeline.table
    return table is None or sorted(table._free) == list(range(table.capacity))


def _run_pipeline(decoder, mode, streams: dict[str, list[CodecChunk]], state_table: bool = True,
                  check=None) -> dict[str, list[np.ndarray]]:
    pipeline = AsyncDecodingPipeline(decoder, torch.device("cpu"), mode=mode)
    pipeline.use_state_table = state_table
    outputs: queue.Queue = queue.Queue()
    try:
        for rid in streams:
            pipeline.open(rid, lambda *args: outputs.put(args),
                          on_decode_start=lambda idx, rid=rid: outputs.put(("start", rid, idx)))
        for i in range(max(len(c) for c in streams.values())):   # interleave requests, as live traffic does
            for rid, chunks in streams.items():
                if i < len(chunks):
                    pipeline.put(dataclasses.replace(chunks[i]))
        pipeline.barrier()
        assert pipeline.active_request_ids == set()
        assert _all_rows_free(pipeline), "a finished stream kept its row of the state table"
        if check is not None:
            check(pipeline)
    finally:
        pipeline.close()
    got: dict[str, list] = {rid: [] for rid in streams}
    started: dict[str, list[int]] = {rid: [] for rid in streams}
    while not outputs.empty():
        item = outputs.get()
        if item[0] == "start":     # told each chunk, in order, before that chunk's output
            _, rid, idx = item
            assert idx == len(started[rid]) == len(got[rid]), "a call began out of order or was told twice"
            started[rid].append(idx)
            continue
        rid, idx, audio, finished, error = item
        assert len(started[rid]) == idx + 1, "a chunk's output came before its call was reported"
        assert error is None
        assert idx == len(got[rid]), "chunks of a request arrived out of order"
        got[rid].append(audio)
    return got


@pytest.mark.parametrize("initial, size", [(1, 25), (4, 25), (1, 1), (4, 7)])
def test_exact_stream_equals_whole_decode(decoder, initial, size):
    codes = {f"r{i}": _codes(10 + i, FRAMES - 7 * i) for i in range(3)}
    streams = {rid: _stream(c, talker2code2wav_async_chunk,
                            _connector(size, initial), rid) for rid, c in codes.items()}
    got = _run_pipeline(decoder, "exact", streams)
    for rid, c in codes.items():
        whole = decoder.decode_full(c).numpy()
        streamed = np.concatenate(got[rid])
        assert streamed.shape == whole.shape, "missing or duplicated samples at chunk boundaries"
        assert float(np.abs(streamed - whole).max()) <= 1e-4
        assert got[rid][0].shape[0] == initial * decoder.samples_per_frame


def test_context_mode_length_exact_and_error_measured(decoder, capsys):
    codes = _codes(3)
    got = _run_pipeline(decoder, "context", {"r": _stream(codes, talker2code2wav_async_chunk, _connector())})
    streamed, whole = np.concatenate(got["r"]), decoder.decode_full(codes).numpy()
    assert streamed.shape == whole.shape
    diff = float(np.abs(streamed - whole).max())
    # The first 26 frames see their whole history, so they are exact; later frames are approximate.
    head = 26 * decoder.samples_per_frame
    assert float(np.abs(streamed[:head] - whole[:head]).max()) <= 1e-4
    with capsys.disabled():
        print(f"\n[25/25 context mode] max abs diff vs whole-sequence decode: {diff:.4f}")
    assert diff > 1e-4, "the context method cannot be exact beyond the decoder's reach"


def test_state_table_streams_what_per_stream_states_stream(decoder):
    """Stage 1 with its streams' states in one table (the default) and with a state per stream: the same samples,
    bit for bit, for streams batched together at different positions."""
    codes = {f"r{i}": _codes(30 + i, FRAMES - 5 * i) for i in range(10)}

    def run(state_table: bool):
        def rows_written(pipeline):      # each stream's position went through the table's rows, or none did
            assert bool((pipeline.table.positions > 0).any()) is state_table

        streams = {rid: _stream(c, talker2code2wav_async_chunk, _connector(7, 1, 2), rid) for rid, c in codes.items()}
        return _run_pipeline(decoder, "exact", streams, state_table, rows_written)

    table, own = run(True), run(False)
    for rid in codes:
        assert len(table[rid]) == len(own[rid])
        assert all(np.array_equal(a, b) for a, b in zip(table[rid], own[rid]))


def test_batch_mode_equals_exact_stream(decoder):
    codes = _codes(4)
    batch = _run_pipeline(decoder, "exact", {"r": _stream(codes, talker2code2wav, _connector())})
    stream = _run_pipeline(decoder, "exact", {"r": _stream(codes, talker2code2wav_async_chunk, _connector())})
    assert np.abs(np.concatenate(batch["r"]) - np.concatenate(stream["r"])).max() <= 1e-4


def test_abort_drops_the_stream(decoder):
    pipeline = AsyncDecodingPipeline(decoder, torch.device("cpu"))
    outputs: queue.Queue = queue.Queue()
    try:
        pipeline.open("a", lambda *args: outputs.put(args))
        chunks = _stream(_codes(6, 30), talker2code2wav_async_chunk, _connector())
        pipeline.put(chunks[0])
        pipeline.abort("a")
        for chunk in chunks[1:]:
            pipeline.put(chunk)
        pipeline.barrier()
        assert pipeline.active_request_ids == set()
        assert _all_rows_free(pipeline), "an aborted stream kept its row of the state table"
        assert outputs.qsize() <= 1
    finally:
        pipeline.close()


def test_a_first_chunk_goes_before_chunks_already_pending(decoder):
    """Stage 1 reads its inbox between calls: a new request's first chunk, arriving while another request
    has several 25-frame chunks pending, is decoded in the next call, not after all of them: they are not due
    yet (the clock stands still: the old stream's player has 2 s of audio ahead)."""
    pipeline = AsyncDecodingPipeline(decoder, torch.device("cpu"), clock=lambda: 0.0)
    order: list[tuple[str, int]] = []
    all_put, new_decoded = threading.Event(), threading.Event()
    old = _stream(_codes(7), talker2code2wav_async_chunk, _connector(), "old")
    new = _stream(_codes(8, 30), talker2code2wav_async_chunk, _connector(), "new")
    assert [c.new_frames for c in old[:4]] == [1, 25, 25, 25] and new[0].new_frames == 1

    def on_old(rid, idx, audio, finished, error):
        order.append((rid, idx))
        if idx == 1:        # old's chunks 2, 3, ... are pending now: a new request arrives
            pipeline.open("new", lambda rid, idx, *rest: (order.append((rid, idx)), new_decoded.set()))
            pipeline.put(new[0])

    try:
        pipeline.open("old", on_old, on_decode_start=lambda idx: idx or all_put.wait(30))
        for chunk in old:
            pipeline.put(chunk)
        all_put.set()
        assert new_decoded.wait(30)
        pipeline.barrier()
        pipeline.abort("new")
    finally:
        pipeline.close()
    assert order[:3] == [("old", 0), ("old", 1), ("new", 0)], order
    assert [idx for rid, idx in order if rid == "old"] == list(range(len(old)))


class _FirstChunkSupply:
    """New requests' first chunks, one arriving each time Stage 1 delivers the previous one (so one reaches
    every call) until `count` have come; `done` is set then."""

    def __init__(self, pipeline, order: list, count: int, seed: int):
        self.pipeline, self.order, self.done = pipeline, order, threading.Event()
        self.chunks = [_stream(_codes(seed + i, 3), talker2code2wav_async_chunk, _connector(), f"new-{i}")[0]
                       for i in range(count)]

    def arrive(self, i: int = 0) -> None:
        if i == len(self.chunks):
            self.done.set()
            return
        self.pipeline.open(f"new-{i}", lambda rid, idx, *rest: (self.order.append((rid, idx)), self.arrive(i + 1)))
        self.pipeline.put(self.chunks[i])


def test_a_steady_supply_of_first_chunks_cannot_hold_a_stream_back_forever(decoder):
    """In the smallest-first order smaller chunks go first, but a chunk passed over `max_passed_over` times goes
    next: with a new request's first chunk arriving at every call, another stream's pending 25-frame chunk still
    gets its turn."""
    pipeline = AsyncDecodingPipeline(decoder, torch.device("cpu"))
    pipeline.order = "smallest"
    order: list[tuple[str, int]] = []
    all_put = threading.Event()
    old = _stream(_codes(9), talker2code2wav_async_chunk, _connector(), "old")
    supply = _FirstChunkSupply(pipeline, order, 20, seed=20)
    firsts = supply.chunks

    def on_old(rid, idx, *rest):
        order.append((rid, idx))
        if idx == 0:
            supply.arrive()

    try:
        pipeline.open("old", on_old, on_decode_start=lambda idx: idx or all_put.wait(30))
        for chunk in old[:2]:           # 1 frame, then 25 frames
            pipeline.put(chunk)
        all_put.set()
        assert supply.done.wait(30)
        pipeline.barrier()
    finally:
        pipeline.close()
    limit = pipeline.max_passed_over
    assert order[0] == ("old", 0)
    assert order[1:limit + 1] == [(f"new-{i}", 0) for i in range(limit)], order
    assert order[limit + 1] == ("old", 1), order
    assert (pipeline.calls, pipeline.calls_by_pass_over) == (2 + len(firsts), 1)
    assert sorted(order[limit + 2:]) == sorted((f"new-{i}", 0) for i in range(limit, len(firsts)))


def _gated(pipeline, order: list, name: str, chunk: CodecChunk, release: threading.Event) -> None:
    """Open a stream and put its chunk; its call holds Stage 1 until `release`, so what the test puts after this
    returns is pending together when the next round chooses."""
    inside = threading.Event()
    pipeline.open(name, lambda rid, idx, *rest: order.append((rid, idx)),
                  on_decode_start=lambda idx: idx or (inside.set(), release.wait(30)))
    pipeline.put(chunk)
    assert inside.wait(30)


def test_chunks_of_one_size_go_oldest_first_not_in_the_order_streams_opened(decoder):
    pipeline = AsyncDecodingPipeline(decoder, torch.device("cpu"), batch_limit=lambda frames: 1)
    order: list[tuple[str, int]] = []
    release = threading.Event()
    chunks = {rid: _stream(_codes(30 + i, 3), talker2code2wav_async_chunk, _connector(), rid)[0]
              for i, rid in enumerate(("gate", "a", "b"))}
    try:
        _gated(pipeline, order, "gate", chunks["gate"], release)
        for rid in ("a", "b"):
            pipeline.open(rid, lambda rid, idx, *rest: order.append((rid, idx)))
        pipeline.put(chunks["b"])          # b's chunk arrives first, though a was opened first
        pipeline.put(chunks["a"])
        release.set()
        pipeline.barrier()
    finally:
        pipeline.close()
    assert order == [("gate", 0), ("b", 0), ("a", 0)]


def test_the_pass_over_bound_takes_every_other_call_at_most(decoder):
    """Smallest-first order: three streams hold 25-frame chunks, passed over equally often, while a new first
    chunk arrives at every call: once they reach the bound, calls alternate between them and the first chunks,
    so no first chunk waits for more than one of theirs (one 25-frame chunk a call here)."""
    pipeline = AsyncDecodingPipeline(decoder, torch.device("cpu"), batch_limit=lambda frames: 3 if frames == 1 else 1)
    pipeline.order = "smallest"
    order: list[tuple[str, int]] = []
    release = threading.Event()
    old_ids = ("old-a", "old-b", "old-c")
    olds = {rid: _stream(_codes(40 + i), talker2code2wav_async_chunk, _connector(), rid)[:2]
            for i, rid in enumerate(old_ids)}
    supply = _FirstChunkSupply(pipeline, order, 14, seed=60)
    firsts = supply.chunks
    gate = _stream(_codes(59, 3), talker2code2wav_async_chunk, _connector(), "gate")[0]

    def on_old(rid, idx, *rest):
        order.append((rid, idx))
        if (rid, idx) == ("old-c", 0):      # the three first chunks went in one call: the supply starts
            supply.arrive()

    try:
        _gated(pipeline, order, "gate", gate, release)
        for rid in old_ids:
            pipeline.open(rid, on_old)
        for chunks in olds.values():
            pipeline.put(chunks[0])
        for chunks in olds.values():
            pipeline.put(chunks[1])
        release.set()
        assert supply.done.wait(30)
        pipeline.barrier()
    finally:
        pipeline.close()
    new = [(f"new-{i}", 0) for i in range(len(firsts))]
    assert order[:4] == [("gate", 0), ("old-a", 0), ("old-b", 0), ("old-c", 0)]
    assert order[4:] == new[:8] + [("old-a", 1), new[8], ("old-b", 1), new[9], ("old-c", 1)] + new[10:], order
    assert pipeline.calls_by_pass_over == 3


class _Clock:
    """Stage 1's clock, set by the test: calls take no time on it, so the order depends only on what is set."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _started(pipeline, order: list, clock: _Clock, name: str, chunks: list[CodecChunk], at: float) -> None:
    """Open a stream and have its first chunk delivered at `at` (its player starts then: it has that chunk's
    frames to play); its next chunk is put afterwards, when the test sets it."""
    clock.now = at
    pipeline.open(name, lambda rid, idx, *rest: order.append((rid, idx)))
    pipeline.put(chunks[0])
    pipeline.barrier()


def _old_and_new_arrive(pipeline, order: list, clock: _Clock, old_next: CodecChunk, new_first: CodecChunk,
                        gate_first: CodecChunk, at: float) -> None:
    """While a gate stream's call holds Stage 1, at `at` an old stream's next chunk and a new request's first chunk
    ("new") arrive; then Stage 1 goes on and decodes everything, so the order shows which it took first."""
    release = threading.Event()
    _gated(pipeline, order, "gate", gate_first, release)
    clock.now = at
    pipeline.put(old_next)
    pipeline.open("new", lambda rid, idx, *rest: order.append((rid, idx)))
    pipeline.put(new_first)
    release.set()
    pipeline.barrier()


@pytest.mark.parametrize("now, expected", [
    (1.0, [("gate", 0), ("old", 1), ("new", 0)]),      # old's player ran dry at 0.08 s: its chunk goes first
    (0.05, [("gate", 0), ("new", 0), ("old", 1)]),     # 30 ms of old's audio left: the new first chunk goes first
])
def test_the_chunk_due_first_goes_first_whatever_its_size(decoder, now, expected):
    """A stream whose first frame was delivered at 0 s needs its next chunk by 0.08 s; a new request's first chunk
    is due when it arrives. Stage 1 takes whichever is due first, though the old stream's chunk has 25 frames and
    the new one 1 (the smallest-first order took the new one first either way)."""
    clock = _Clock()
    pipeline = AsyncDecodingPipeline(decoder, torch.device("cpu"), clock=clock)
    order: list[tuple[str, int]] = []
    old = _stream(_codes(70), talker2code2wav_async_chunk, _connector(), "old")
    new = _stream(_codes(71, 3), talker2code2wav_async_chunk, _connector(), "new")
    gate = _stream(_codes(72, 3), talker2code2wav_async_chunk, _connector(), "gate")
    assert old[1].new_frames == 25 and new[0].new_frames == 1
    try:
        _started(pipeline, order, clock, "old", old, at=0.0)
        _old_and_new_arrive(pipeline, order, clock, old[1], new[0], gate[0], at=now)
    finally:
        pipeline.close()
    assert order == [("old", 0)] + expected
    assert pipeline.calls_overdue == (1 if now > 0.08 else 0)


@pytest.mark.parametrize("arrives, expected", [
    (0.09, [("old", 1), ("new", 0)]),     # after the old chunk's due time less the lead: the old chunk first
    (0.07, [("new", 0), ("old", 1)]),     # before it: the first chunk first
])
def test_a_chunk_falls_due_a_mean_recent_call_early(decoder, arrives, expected):
    """The call that takes a chunk must end before its player runs dry, so the chunk counts as due a running
    mean of the calls' times early (each new call weighs a fifth): after calls of 20, 40 and 0 ms, 19.2 ms. The
    old stream's first frame was delivered at 20 ms, so its player runs dry at 100 ms and its next chunk counts as
    due at 80.8 ms: after a first chunk that arrived at 70 ms, before one that arrived at 90 ms (with no lead it
    would go after both; with the longest call added to the lead, before both)."""
    clock = _Clock()
    pipeline = AsyncDecodingPipeline(decoder, torch.device("cpu"), clock=clock)
    durations = [0.02, 0.04]
    decode = pipeline._decode

    def timed_decode(batch, frames):
        clock.now += durations.pop(0) if durations else 0.0
        return decode(batch, frames)

    pipeline._decode = timed_decode
    order: list[tuple[str, int]] = []
    old = _stream(_codes(90), talker2code2wav_async_chunk, _connector(), "old")
    other, new, gate = (_stream(_codes(91 + i, 3), talker2code2wav_async_chunk, _connector(), rid)
                        for i, rid in enumerate(("other", "new", "gate")))
    try:
        _started(pipeline, order, clock, "old", old, at=0.0)         # a call of 20 ms: delivered at 0.02 s
        _started(pipeline, order, clock, "other", other, at=0.02)    # a call of 40 ms
        _old_and_new_arrive(pipeline, order, clock, old[1], new[0], gate[0], at=arrives)   # the gate: 0 ms
    finally:
        pipeline.close()
    assert order[3:] == expected, order
    assert pipeline.lead_s == pytest.approx((0.8 * 0.02 + 0.2 * 0.04) * 0.8 ** 3)   # then three calls of 0 ms


def test_a_call_takes_the_chunks_of_its_size_due_first(decoder):
    """Three streams started at 0, 20 and 10 ms each have a 25-frame chunk pending, due 80 ms after their start,
    and a new first chunk arrives at 0.5 s: two 25-frame chunks a call, so the first call takes the streams that
    started at 0 and 10 ms, the next one the third (due at 0.1 s, before the first chunk that arrived at 0.5 s)."""
    clock = _Clock()
    pipeline = AsyncDecodingPipeline(decoder, torch.device("cpu"), clock=clock,
                                     batch_limit=lambda frames: 2 if frames == 25 else 16)
    order: list[tuple[str, int]] = []
    release = threading.Event()
    streams = {rid: _stream(_codes(80 + i), talker2code2wav_async_chunk, _connector(), rid)
               for i, rid in enumerate(("p", "q", "r"))}
    new = _stream(_codes(84, 3), talker2code2wav_async_chunk, _connector(), "new")
    gate = _stream(_codes(85, 3), talker2code2wav_async_chunk, _connector(), "gate")
    try:
        for rid, at in (("p", 0.0), ("q", 0.02), ("r", 0.01)):
            _started(pipeline, order, clock, rid, streams[rid], at)
        _gated(pipeline, order, "gate", gate[0], release)
        clock.now = 0.5
        for rid in ("q", "p", "r"):          # arrival order does not matter: when each is due does
            pipeline.put(streams[rid][1])
        pipeline.open("new", lambda rid, idx, *rest: order.append((rid, idx)))
        pipeline.put(new[0])
        calls_before = pipeline.calls
        release.set()
        pipeline.barrier()
    finally:
        pipeline.close()
    assert order[4:] == [("p", 1), ("r", 1), ("q", 1), ("new", 0)], order
    assert pipeline.calls - calls_before == 3


@pytest.mark.parametrize("state_table", [True, False])
def test_a_bad_chunk_fails_its_stream_alone(decoder, state_table):
    """A batched call that fails (one stream's codes are out of range) is retried one stream at a time: the bad
    stream ends with an error, the others' states were not touched by the failed call, so they go on and stream
    what one decode of their whole sequence gives; every row of the state table is free afterwards."""
    pipeline = AsyncDecodingPipeline(decoder, torch.device("cpu"))
    pipeline.use_state_table = state_table
    order: list[tuple[str, int]] = []
    outputs: dict[str, list] = {"good": [], "bad": []}
    release = threading.Event()
    good_codes = _codes(40, 10)
    good = _stream(good_codes, talker2code2wav_async_chunk, _connector(), "good")
    bad = _stream(_codes(41, 10), talker2code2wav_async_chunk, _connector(), "bad")
    bad[1] = dataclasses.replace(bad[1], codes=torch.full_like(bad[1].codes, 10_000))   # no such code
    assert good[1].new_frames == bad[1].new_frames      # pending together, so decoded in one call
    try:
        _gated(pipeline, order, "gate", _stream(_codes(42, 3), talker2code2wav_async_chunk, _connector(), "gate")[0],
               release)
        for rid, chunks in (("good", good), ("bad", bad)):
            pipeline.open(rid, lambda rid, idx, audio, finished, error: outputs[rid].append((idx, audio, error)))
            for chunk in chunks:
                pipeline.put(chunk)
        release.set()
        pipeline.abort("gate")                          # its other chunks never come
        pipeline.barrier()
        assert pipeline.active_request_ids == set()
        assert _all_rows_free(pipeline)
    finally:
        pipeline.close()
    assert [error for _, _, error in outputs["good"]] == [None] * len(good)
    streamed = np.concatenate([audio for _, audio, _ in outputs["good"]])
    whole = decoder.decode_full(good_codes).numpy()      # a state the failed call had touched would be far off
    assert streamed.shape == whole.shape and float(np.abs(streamed - whole).max()) <= 1e-4
    assert outputs["bad"][-1][2] is not None and "decoder failed" in outputs["bad"][-1][2]


def test_the_route_keeps_one_call_time_a_chunk():
    """Stage 1 tells the route each chunk's call in order; a chunk whose batch failed is told again when it is
    retried alone, and the retry's time replaces the first (one entry a chunk, as the bench's legs assume)."""
    from tts_engine.processors.qwen3_tts import ChunkConnector
    from tts_engine.stages.route import Route

    route = Route("r", talker2code2wav_async_chunk, ChunkConnector(ChunkSchedule()), pipeline=None,
                  deliver=lambda item: None, on_done=lambda rid: None, stage1_device=torch.device("cpu"))
    for idx in (0, 1, 1, 2):                     # chunk 1's batch failed; it was retried alone
        route.on_decode_start(idx)
    calls = route.metrics.chunk_call_s
    assert len(calls) == 3 and calls == sorted(calls) and route.metrics.first_decode_s == calls[0]
