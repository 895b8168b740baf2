"""TTSEngine: the public entry point. Loads a checkpoint, owns the stages, serves requests.

One request: validate -> (Base) voice prompt from the reference clip -> talker prompt embeddings ->
Stage 0 (talker on vLLM + code predictor) produces 16-code frames -> Code2Wav decodes them to 24 kHz.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import queue
import threading
import time
import uuid
from pathlib import Path
from typing import AsyncIterator, Iterator

import numpy as np
import torch

from tts_engine.config import StageConfig, batch_buckets, engine_settings
from tts_engine.hub import resolve_model
from tts_engine.models.qwen3_tts.cloner import VoiceCloner
from tts_engine.models.qwen3_tts.codec_decoder import Code2WavDecoder
from tts_engine.models.qwen3_tts.config import CheckpointError, Qwen3TTSConfig, load_config, read_json
from tts_engine.models.qwen3_tts.prompt import PromptBuilder, PromptInputs, TextEmbedder
from tts_engine.models.qwen3_tts.sampling import RowSampling
from tts_engine.models.qwen3_tts.weights import validate_checkpoint_weights
from tts_engine.processors.qwen3_tts import ChunkConnector
from tts_engine.request import (
    ConsumerTooSlow,
    EngineClosed,
    PromptTooLong,
    RequestError,
    SpeechRequest,
    StreamFailed,
    StreamingChunkOutput,
    SynthesisResult,
    VoicePrompt,
    resolve_language,
)
from tts_engine.stages.decoder import AsyncDecodingPipeline
from tts_engine.stages.route import Route
from tts_engine.stages.talker import MIN_NEW_TOKENS, TalkerSampling, TalkerStage
from tts_engine.stages.trim import LeadingSilenceTrimmer
from tts_engine.stages.vllm_bridge import TalkerEngine
from tts_engine.submit_queue import Submission, SubmitQueue

log = logging.getLogger(__name__)
SAMPLE_RATE = 24000


class TTSEngine:
    _gc_freezers = 0   # engines of this process whose warmup() froze the collector's heap (see close)

    def __init__(self, config: Qwen3TTSConfig, settings: StageConfig, dtype: torch.dtype):
        self.config = config
        self.settings = settings
        self.dtype = dtype
        t, d = settings.talker, settings.decoder
        device = _device_of(settings)
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise RuntimeError(f"the stage config places the talker on {device}, but CUDA is not available here; "
                               "use a CPU config (configs/qwen3_tts_cpu.yaml) or devices: auto")
        self.device = torch.device(device)
        self.decoder_device = self.device if d.device == "auto" else torch.device(d.device)
        if self.decoder_device.type == "cuda":
            _enable_tf32_matmuls()
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(config.path))
        self.talker_engine = TalkerEngine(
            config.path, read_json(config.path / "config.json")["talker_config"], dtype=dtype,
            device=self.device.type, max_num_seqs=t.max_num_seqs, max_model_len=t.max_model_len,
            gpu_memory_utilization=t.gpu_memory_utilization, kv_cache_gib=t.kv_cache_gib,
            enforce_eager=t.enforce_eager if t.enforce_eager is not None else self.device.type == "cpu",
            async_scheduling=t.async_scheduling, seed=t.seed, cudagraph_mode=t.cudagraph_mode,
            cudagraph_max_tokens=t.cudagraph_max_tokens, max_batched_tokens=t.max_batched_tokens)
        model = self.talker_engine.model
        self.text_embedder = TextEmbedder.from_checkpoint(config, self.device, dtype)
        embed_tokens = model.model.embed_tokens
        self.prompts = PromptBuilder(
            config, lambda s: self.tokenizer(s)["input_ids"], self.text_embedder,
            codec_embed=embed_tokens,
            frame_embed=lambda codes: model.code_predictor.embed_codes(codes, embed_tokens.weight),
            tokenize_many=lambda texts: self.tokenizer(texts)["input_ids"])
        self.decoder = Code2WavDecoder.from_folder(config.path / "speech_tokenizer", device=self.decoder_device,
                                                   dtype=torch.float32)
        self.cloner = VoiceCloner(config, self.device) if config.model_type == "base" else None
        self._routes: dict[str, Route] = {}
        self._routes_lock = threading.Lock()
        self._closed = False
        self._froze_gc = False
        self.concurrent_prompt_builds = None
        self.submits = SubmitQueue(self._submit_many, self.abort)
        self.connector = ChunkConnector(schedule=d.schedule, left_context_size=d.left_context_size)
        self.pipeline = AsyncDecodingPipeline(
            self.decoder, self.decoder_device, mode=d.decode_mode, max_batch_size=d.max_batch_size,
            left_context_size=d.left_context_size, graph_shapes=d.graph_shapes(), batch_limit=d.batch_limit,
            on_death=self._stage_died, sample_rate=SAMPLE_RATE)
        self.talker = TalkerStage(self.talker_engine, config, self.device, on_death=self._stage_died,
                                  high_priority=t.high_priority_steps, early_handover=t.early_handover)

    # ---- construction ----------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, model: str | Path | None = None, stage_config: StageConfig | str | Path | None = None,
                        dtype: torch.dtype | str | None = None, **overrides) -> "TTSEngine":
        """`model`: a local folder or a Hub id (default: the stage config's `model`). `overrides` replace
        stage-config fields by name (`max_num_seqs=8`, `chunk_size=12`, `device="cpu"`, ...; see
        `tts_engine.config`). dtype default: bfloat16 on GPU, float32 on CPU."""
        settings = engine_settings(stage_config, **overrides)
        model = model if model is not None else settings.model
        if model is None:
            raise TypeError("from_pretrained needs a model (a folder or Hub id), here or as `model:` in the "
                            "stage config")
        folder = resolve_model(model)
        config = load_config(folder)
        validate_checkpoint_weights(config)
        on_gpu = _device_of(settings).startswith("cuda")
        if dtype is None:
            dtype = torch.bfloat16 if on_gpu else torch.float32
        elif isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        log.info("loading %s (%s, %s) on %s", folder, config.model_type, config.model_size,
                 "GPU" if on_gpu else "CPU")
        return cls(config, settings, dtype)

    def close(self) -> None:
        """Stop the stepping thread and release the vLLM engine (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self.submits.close()
        self.talker.close()
        self.pipeline.close()
        self.talker_engine.close()
        if self._froze_gc:      # what warmup() froze becomes collectable again; other warm engines stay frozen
            self._froze_gc = False
            TTSEngine._gc_freezers -= 1
            gc.unfreeze()
            gc.collect()
            if TTSEngine._gc_freezers:
                gc.freeze()

    def __enter__(self) -> "TTSEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def concurrent_prompt_builds(self) -> int | None:
        """How many threads may build a prompt at once (None, the default: any number; bench variants
        `prompt-builds-2` and `prompt-builds-1`, measured and not adopted).

        Why it was tried: in a burst of 64 the executor's 20 threads build at once, and every torch call in a build
        hands the interpreter lock back and takes it again, so Stage 0's thread gets it rarely (H200, thirteenth
        pass: its first step of a burst took 83 ms of wall time for 8.6 ms of its own CPU time). Threads over the
        bound sleep on a semaphore. Measured in the fourteenth pass: one build at a time brought the first frames
        30-50 ms sooner at p95, but the requests queued as long for their builds (closed 64 p95 225-255 ms, against
        199-222 with no bound and eager Stage 1 opens in the same run)."""
        return self._build_slots_size

    @concurrent_prompt_builds.setter
    def concurrent_prompt_builds(self, value: int | None) -> None:
        self._build_slots_size = value
        self._build_slots = threading.BoundedSemaphore(value) if value else None

    @property
    def submit_threads(self) -> int | None:
        """How many threads `generate` submits requests on (validation, the prompt's build, both stages told): 1, the
        default, a pool of the engine's own, which with `batch_submits` submits every request waiting at once; None is
        the event loop's default executor (min(32, CPUs + 4) threads: 20 on the H200 machine), the default until the
        fifteenth pass (bench variant `unbatched-submits`). One thread without batches (`submit-threads-1`): in the
        fourteenth pass a burst's first frames came ~55 ms sooner at p95 (the builds no longer starve Stage 0), but
        the requests then queued for the thread (closed 64 p95 215-285 vs 218-229 ms, fifteenth pass).

        Why: a bound on builds at once (`concurrent_prompt_builds`) let Stage 0 take its steps between builds (a
        burst's first frames 30-50 ms sooner at p95), but each build's turn passed from one sleeping thread to the
        next, which first had to win the interpreter back, and the requests queued as long as they gained. A pool of
        one or two threads works through a burst's submits without handing turns around, and the default pool's
        other threads stay out of the interpreter's queue. A request that clones a voice from an uploaded clip
        (`ref_audio`) is cloned on the default executor first, so the pool's submits do not wait for a clone."""
        return self.submits.threads

    @submit_threads.setter
    def submit_threads(self, value: int | None) -> None:
        self.submits.threads = value

    @property
    def batch_submits(self) -> bool:
        """Whether `generate`'s requests that wait for a submit thread are submitted together (True, the default;
        bench variant `unbatched-submits` switches it off with the old executor): the submit thread takes every
        request waiting and validates them, builds their prompts in one `PromptBuilder.build_many` (one tokenizer
        call, one upload of their ids, one host buffer, one event; each text still projected alone, so the bits are
        each request's own) and starts them in both stages.

        Why: a burst's prompts are host work on the interpreter both stages step on. Built on 20 executor threads
        they starved Stage 0 (the last of 64 built 87-90 ms after the burst began); one at a time on one thread, they
        queued (143-176 ms); together, all 64 were built by 36-37 ms with 26 ms of the submit thread's CPU time
        instead of 89-100 (H200, fifteenth pass). Closed 64 first chunk p95: 149-189 vs 218-229 ms."""
        return self.submits.batched

    @batch_submits.setter
    def batch_submits(self, value: bool) -> None:
        self.submits.batched = bool(value)

    # ---- voices ----------------------------------------------------------------------------------
    def create_voice_prompt(self, ref_audio, ref_text: str | None = None,
                            x_vector_only: bool = False) -> VoicePrompt:
        """Clone a voice from a reference clip (Base models), like `create_voice_clone_prompt`."""
        if self.cloner is None:
            raise RequestError(f"voice cloning needs a Base checkpoint; this one is {self.config.model_type}")
        if not x_vector_only and not (ref_text or "").strip():
            raise RequestError("ref_text is required for ICL voice cloning (or set x_vector_only=True)")
        return self.cloner.create(ref_audio, ref_text, x_vector_only)

    # ---- synthesis -------------------------------------------------------------------------------
    def _submit(self, request: SpeechRequest, deliver, request_id: str | None = None,
                prepared: tuple[PromptInputs, VoicePrompt | None] | None = None) -> tuple[Route, VoicePrompt | None]:
        """Validate, build the prompt and start both stages; outputs go to `deliver` (any thread). `prepared`: the
        request's `_prompt_inputs`, made already (a voice cloned from `ref_audio` on another thread)."""
        started = self._submit_many([Submission(request, deliver, request_id, prepared)])[0]
        if isinstance(started, Exception):
            raise started
        return started

    def _submit_many(self, submissions: list[Submission]) -> list["tuple[Route, VoicePrompt | None] | Exception"]:
        """`_submit` for requests that arrived together, in order, an exception in place of each that failed (one bad
        request fails alone): their prompts are built in one `build_many` (one tokenizer call, one upload, one host
        buffer), then each request is started in both stages."""
        results: list = [None] * len(submissions)
        valid: list[tuple[int, PromptInputs, VoicePrompt | None]] = []
        for i, submission in enumerate(submissions):
            try:
                self._ensure_open()
                valid.append((i, *(submission.prepared or self._prompt_inputs(submission.request))))
            except Exception as exc:
                results[i] = exc
        if not valid:
            return results
        slots = self._build_slots
        if slots is not None:
            slots.acquire()
        try:
            started = time.perf_counter()
            prompts = self.prompts.build_many([inputs for _, inputs, _ in valid])
            prompt_s = time.perf_counter() - started
        finally:
            if slots is not None:
                slots.release()
        for (i, inputs, voice), prompt in zip(valid, prompts):
            try:
                if isinstance(prompt, Exception):
                    raise prompt
                results[i] = self._start(submissions[i], inputs, prompt, prompt_s), voice
            except Exception as exc:
                results[i] = exc
        return results

    def _start(self, submission: Submission, inputs: PromptInputs, prompt, prompt_s: float) -> Route:
        """Register a request whose prompt is built and hand it to both stages."""
        request = submission.request
        positions, limit = prompt.prefill.shape[0], self.talker_engine.max_model_len
        if positions >= limit:
            raise PromptTooLong(f"text is too long: its prompt takes {positions} positions and the engine's "
                                f"max_model_len is {limit}; split the text or raise max_model_len")
        sampling = self._sampling(request)
        request_id = submission.request_id or uuid.uuid4().hex
        trimmer = LeadingSilenceTrimmer(SAMPLE_RATE) if request.trim_leading_silence else None
        route = Route(request_id, self.settings.talker.processor, self.connector, self.pipeline, submission.deliver,
                      self._route_done, self.decoder_device, trimmer, prompt_s)
        with self._routes_lock:
            if request_id in self._routes:
                raise RequestError(f"request id {request_id!r} is already running")
            self._routes[request_id] = route
        self.pipeline.open(request_id, route.on_output, context_codes=inputs.ref_codes,
                           on_decode_start=route.on_decode_start)
        self.talker.submit(request_id, prompt, sampling, route.on_frames, route.on_finish, route.on_admitted)
        return route

    def _ensure_open(self) -> None:
        """Refuse new work once the engine is closed or a stage thread has died (before any of the work)."""
        if self._closed:
            raise EngineClosed("the engine is closed")
        if not self.healthy:
            raise EngineClosed(f"the engine stopped working ({self.health()['error']}); it must be restarted")

    def _route_done(self, request_id: str) -> None:
        with self._routes_lock:
            self._routes.pop(request_id, None)

    async def generate(self, request: SpeechRequest, request_id: str | None = None,
                       max_buffered_s: float | None = None) -> AsyncIterator[StreamingChunkOutput]:
        """Stream a request: delta PCM chunks as Stage 1 produces them, the last with `metrics`.

        Closing or cancelling the iterator aborts the request in both stages. The stages never wait for a
        consumer; what it has not read yet waits in memory. `max_buffered_s` bounds that: a consumer more
        than this much audio behind has its request aborted and gets `ConsumerTooSlow`.
        """
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue = asyncio.Queue()
        request_id = request_id or uuid.uuid4().hex
        limit = None if max_buffered_s is None else max_buffered_s * SAMPLE_RATE
        buffered, overflowed = 0, False

        def put(item) -> None:   # on the loop's thread
            nonlocal buffered, overflowed
            if overflowed:
                return
            if isinstance(item, StreamingChunkOutput):
                buffered += item.audio.shape[0]
                if limit is not None and buffered > limit:
                    overflowed = True
                    self.abort(request_id)
                    item = ConsumerTooSlow(f"the client read the stream slower than real time: more than "
                                           f"{max_buffered_s:g} s of audio waited unread, so the request was stopped")
            inbox.put_nowait(item)

        def deliver(item) -> None:   # on a stage thread
            try:
                loop.call_soon_threadsafe(put, item)
            except RuntimeError:     # the consumer's event loop has closed: nobody will read this stream
                self.abort(request_id)

        abandoned = threading.Event()
        try:
            prepared = None
            if self.submits.serial and request.ref_audio is not None:
                # a clone takes its own time: on the default executor, so other submits do not wait for it
                # (not for a closed or broken engine: refused first, as `_submit` refuses before any work)
                self._ensure_open()
                prepared = await loop.run_in_executor(None, self._prompt_inputs, request)
            route = await self.submits.submit(Submission(request, deliver, request_id, prepared), abandoned)
        except asyncio.CancelledError:
            # Cancelled while the submit ran on its thread: the request would otherwise run to its end with
            # nobody reading it. Set first, then abort: either this abort finds the route, or the thread sees
            # the flag after registering it.
            abandoned.set()
            self.abort(request_id)
            raise
        finished = False
        try:
            while True:
                item = await inbox.get()
                if isinstance(item, Exception):
                    finished = True
                    raise item
                buffered -= item.audio.shape[0]
                finished = item.is_finished
                yield item
                if finished:
                    return
        finally:
            if not finished:
                self.abort(route.request_id)

    def abort(self, request_id: str) -> None:
        """Stop a request in both stages and free its buffers (returns at once; see `drain`)."""
        with self._routes_lock:
            route = self._routes.pop(request_id, None)
        if route is not None:
            route.cancel()
        self.talker.abort(request_id)
        self.pipeline.abort(request_id)

    def drain(self, timeout: float = 30.0) -> None:
        """Wait until both stage threads have handled every command sent before this call."""
        self.talker.barrier(timeout)
        self.pipeline.barrier(timeout)

    @property
    def active_request_count(self) -> int:
        """Requests submitted and not yet finished, failed or aborted (every route: HTTP, UI, agents)."""
        return len(self._routes)

    @property
    def healthy(self) -> bool:
        return not self._closed and self.talker.alive and self.pipeline.alive

    def health(self) -> dict:
        """Liveness of each stage thread (a stage whose thread died never comes back: restart the engine)."""
        died = self.talker._thread.died or self.pipeline._thread.died
        return {"healthy": self.healthy, "closed": self._closed, "stage0": self.talker.alive,
                "stage1": self.pipeline.alive, "active_requests": self.active_request_count,
                "held": self._held_counts(),
                "error": None if died is None else f"{type(died).__name__}: {died}"}

    def _stage_died(self, exc: BaseException) -> None:
        """A stage thread stopped: every request in flight fails now instead of waiting forever."""
        with self._routes_lock:
            routes, self._routes = list(self._routes.values()), {}
        for route in routes:
            route.fail(StreamFailed(f"the engine stopped working ({type(exc).__name__}: {exc})"))

    def _held_counts(self) -> dict[str, int] | None:
        """How many requests each part holds; the tables belong to the stage threads, so a copy can meet a
        change in flight (RuntimeError): try again, and give up quietly rather than fail a health probe."""
        for _ in range(3):
            try:
                return {part: len(ids) for part, ids in self.debug_state().items()}
            except RuntimeError:
                continue
        return None

    def debug_state(self) -> dict[str, set[str]]:
        """Per-request state still held by each part of the engine (for tests and diagnostics)."""
        return {
            "routes": set(self._routes), "stage0": set(self.talker.active_request_ids),
            "vllm": set(self.talker_engine.unfinished_request_ids()),
            "connector": self.connector.active_request_ids(), "stage1": self.pipeline.active_request_ids,
        }

    def warmup(self, batch_sizes: list[int] | None = None) -> float:
        """Meet every shape before users do: for each batch size, that many throw-away requests start
        together and run through every chunk size of the schedule, so the talker's batch sizes, the code
        predictor's buckets and each batched decoder shape are built now (vLLM's first steps, allocator
        growth, kernels, compiled graphs) instead of while a first burst of users waits. The decoder's
        CUDA graphs for every (batch bucket, frame count) are captured when the engine is built.

        `batch_sizes` default: powers of two up to `max_num_seqs` (and it) on a GPU; one request on a
        CPU, where a burst costs seconds and there is nothing to capture. Returns the seconds it took."""
        start = time.perf_counter()
        if batch_sizes is None:
            batch_sizes = [1]
            if self.device.type == "cuda":
                batch_sizes = batch_buckets(self.settings.talker.max_num_seqs)
        frames = self.settings.decoder.schedule.frames_through_steady()   # every chunk size of the schedule once
        kind = self.config.model_type
        fields: dict = {"voice": VoicePrompt(torch.zeros(self.config.talker.shape.hidden_size), x_vector_only=True)}
        if kind == "custom_voice":
            fields = {"speaker": self.config.supported_speakers[0]}
        elif kind == "voice_design":
            fields = {"instruct": "A neutral voice."}
        # Sampled, as users' requests are (the sampling kernels and the predictor's sampled graphs are
        # what a greedy warm-up never meets), then one greedy request for the greedy paths.
        sampled = SpeechRequest(text="Warm-up.", max_new_tokens=frames + 1, min_new_tokens=frames + 1,
                                **fields)
        greedy = dataclasses.replace(sampled, do_sample=False, subtalker_do_sample=False)

        def run(request: SpeechRequest) -> None:
            for _ in self.stream(request):
                pass

        run(greedy)
        for size in batch_sizes:
            threads = [threading.Thread(target=run, args=(sampled,), name="tts-warmup") for _ in range(size)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        # What start-up built (weights' wrappers, graphs, compiled code, caches) lives as long as the engine:
        # collect once, then freeze it out of the collector's view, so a full collection while users wait
        # walks only what requests allocate (vLLM does the same once its core is built, before our stages).
        if not self._froze_gc:
            self._froze_gc = True
            TTSEngine._gc_freezers += 1
        gc.collect()
        gc.freeze()
        elapsed = time.perf_counter() - start
        log.info("warm-up: %d frames through both stages at batch sizes %s in %.2f s", frames, batch_sizes, elapsed)
        return elapsed

    def stream(self, request: SpeechRequest, request_id: str | None = None) -> Iterator[StreamingChunkOutput]:
        """Blocking counterpart of `generate` for threads (e.g. a WebRTC generator); closing the
        iterator early aborts the request."""
        inbox: queue.Queue = queue.Queue()
        route, _ = self._submit(request, inbox.put, request_id)
        finished = False
        try:
            while not finished:
                item = inbox.get()
                if isinstance(item, Exception):
                    finished = True
                    raise item
                finished = item.is_finished
                yield item
        finally:
            if not finished:
                self.abort(route.request_id)

    def synthesize(self, request: SpeechRequest) -> SynthesisResult:
        """Run one request to completion and return all of it (the concatenated stream).

        Several threads may call this at once; vLLM batches their talker steps.
        """
        inbox: queue.Queue = queue.Queue()
        route, voice = self._submit(request, inbox.put)
        chunks: list[StreamingChunkOutput] = []
        try:
            while True:
                item = inbox.get()
                if isinstance(item, Exception):
                    raise item
                chunks.append(item)
                if item.is_finished:
                    break
        except BaseException:
            self.abort(route.request_id)
            raise
        audio = np.concatenate([c.audio for c in chunks]) if chunks else np.zeros(0, np.float32)
        codes = [c.codec_codes for c in chunks if c.codec_codes is not None and len(c.codec_codes)]
        all_codes = np.concatenate(codes) if codes else np.zeros((0, 16), np.int64)
        if not request.trim_leading_silence:   # the official cut only applies to the untrimmed stream
            audio = self._official_icl_cut(audio, voice, all_codes.shape[0])
        return SynthesisResult(audio=audio, sample_rate=SAMPLE_RATE, codes=all_codes)

    def _official_icl_cut(self, audio: np.ndarray, voice: VoicePrompt | None, frames: int) -> np.ndarray:
        """The official ICL decode cuts `int(ref/total * len)` samples of reference audio, which float
        rounding sometimes makes one sample short of the reference part; mirror that here."""
        if voice is None or voice.x_vector_only or voice.ref_codes is None or frames == 0:
            return audio
        ref = voice.ref_codes.shape[0]
        total = ref + frames
        hop = self.decoder.samples_per_frame
        missing = ref * hop - int(ref / total * (total * hop))
        if missing <= 0:
            return audio
        tail = self.decoder.decode_full(voice.ref_codes.to(self.decoder_device))[-missing:]
        return np.concatenate([tail.float().cpu().numpy(), audio])

    # ---- validation ------------------------------------------------------------------------------
    def _prompt_inputs(self, r: SpeechRequest) -> tuple[PromptInputs, VoicePrompt | None]:
        cfg = self.config
        if not isinstance(r.text, str) or not r.text.strip():
            raise RequestError("text is empty")
        language = resolve_language(r.language, cfg.supported_languages)
        speaker = r.speaker.strip().lower() if r.speaker else None
        instruct = r.instruct if (r.instruct and r.instruct.strip()) else None
        voice: VoicePrompt | None = None
        if cfg.model_type == "custom_voice":
            if speaker is None:
                raise RequestError(f"speaker is required for a CustomVoice model; choose one of "
                                   f"{cfg.supported_speakers}")
            if speaker not in cfg.talker.speakers:
                raise RequestError(f"unknown speaker {r.speaker!r}; supported: {cfg.supported_speakers}")
            if r.ref_audio is not None or r.voice is not None:
                raise RequestError("ref_audio/voice cloning needs a Base checkpoint; this is CustomVoice")
            if not cfg.supports_instruct:
                instruct = None  # the official 0.6B CustomVoice ignores instructions
        elif cfg.model_type == "voice_design":
            if instruct is None:
                raise RequestError("instruct is required for a VoiceDesign model (describe the voice)")
            if speaker is not None or r.ref_audio is not None or r.voice is not None:
                raise RequestError("a VoiceDesign model takes no speaker or reference audio, only instruct")
        else:
            if speaker is not None:
                raise RequestError(f"unknown speaker {r.speaker!r}: a Base model has no preset speakers; "
                                   "pass ref_audio (voice cloning) or a voice")
            instruct = None
            if r.voice is not None:
                voice = r.voice
            elif r.ref_audio is not None:
                voice = self.create_voice_prompt(r.ref_audio, r.ref_text, r.x_vector_only)
            else:
                raise RequestError("a Base model needs ref_audio (with ref_text, or x_vector_only) or a voice")
        non_streaming = r.non_streaming_mode
        if non_streaming is None:
            non_streaming = cfg.model_type != "base"
        icl = voice is not None and not voice.x_vector_only
        return PromptInputs(
            text=r.text, language=language, speaker=speaker, instruct=instruct,
            speaker_vector=voice.speaker_vector if voice is not None else None,
            ref_codes=voice.ref_codes if icl else None, ref_text=voice.ref_text if icl else None,
            non_streaming_mode=non_streaming), voice

    def _sampling(self, r: SpeechRequest) -> TalkerSampling:
        """Request value, else the stage config's default_sampling_params, else generation_config.json."""
        g = self.config.generation
        stage = self.settings.talker.sampling
        fields = dict(max_new_tokens=g.max_new_tokens, temperature=g.temperature, top_k=g.top_k, top_p=g.top_p,
                      repetition_penalty=g.repetition_penalty, do_sample=g.do_sample,
                      subtalker_do_sample=g.subtalker_do_sample, subtalker_temperature=g.subtalker_temperature,
                      subtalker_top_k=g.subtalker_top_k, subtalker_top_p=g.subtalker_top_p, seed=None)
        defaults = {k: stage.get(k, v) for k, v in fields.items()}
        r = dataclasses.replace(r, **{k: defaults[k] for k in fields if getattr(r, k) is None})

        def pick(value, default):
            return default if value is None else value

        max_new = pick(r.max_new_tokens, g.max_new_tokens)
        min_new = max(MIN_NEW_TOKENS, r.min_new_tokens or 0)
        temperature, top_k, top_p = pick(r.temperature, g.temperature), pick(r.top_k, g.top_k), pick(r.top_p, g.top_p)
        penalty = pick(r.repetition_penalty, g.repetition_penalty)
        sub_t, sub_k = pick(r.subtalker_temperature, g.subtalker_temperature), pick(r.subtalker_top_k, g.subtalker_top_k)
        sub_p = pick(r.subtalker_top_p, g.subtalker_top_p)
        checks = [("max_new_tokens", max_new >= 1), ("min_new_tokens", (r.min_new_tokens or 0) >= 0),
                  ("temperature", temperature > 0), ("top_k", top_k >= 0),
                  ("top_p", 0 < top_p <= 1), ("repetition_penalty", penalty > 0),
                  ("subtalker_temperature", sub_t > 0), ("subtalker_top_k", sub_k >= 0),
                  ("subtalker_top_p", 0 < sub_p <= 1)]
        for name, ok in checks:
            if not ok:
                raise RequestError(f"{name} is out of range")
        generator = None
        if r.seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(int(r.seed))
        return TalkerSampling(
            greedy=not pick(r.do_sample, g.do_sample), temperature=temperature, top_k=top_k, top_p=top_p,
            repetition_penalty=penalty, max_new_tokens=max_new, min_new_tokens=min_new, seed=r.seed,
            subtalker=RowSampling(do_sample=pick(r.subtalker_do_sample, g.subtalker_do_sample),
                                  temperature=sub_t, top_k=sub_k, top_p=sub_p, generator=generator))


def _device_of(settings: StageConfig) -> str:
    """The talker's device: the configured one, else CUDA when there is a GPU."""
    device = settings.talker.device
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def _enable_tf32_matmuls() -> None:
    """Process-wide: TF32 matmuls (convolutions already use TF32 by default) for the float32 codec on a
    GPU: ~2x on batched chunks, ~1e-3 relative rounding, no bf16 NaN/silence. Set once here, when an
    engine with a CUDA decoder is built, because torch offers no per-module switch; it also applies to
    any other float32 matmul in the process (the talker runs in bf16 and is unaffected)."""
    torch.backends.cuda.matmul.allow_tf32 = True


__all__ = ["TTSEngine", "CheckpointError"]
