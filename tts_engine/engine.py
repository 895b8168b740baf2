"""TTSEngine: the public entry point. Loads a checkpoint, owns the stages, serves requests.

One request: validate -> (Base) voice prompt from the reference clip -> talker prompt embeddings ->
Stage 0 (talker on vLLM + code predictor) produces 16-code frames -> Code2Wav decodes them to 24 kHz.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import threading
import time
import uuid
from typing import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tts_engine.hub import resolve_model
from tts_engine.models.qwen3_tts.codec_decoder import Code2WavDecoder
from tts_engine.models.qwen3_tts.config import CheckpointError, Qwen3TTSConfig, load_config
from tts_engine.models.qwen3_tts.prompt import PromptBuilder, PromptInputs, TextEmbedder
from tts_engine.models.qwen3_tts.sampling import RowSampling
from tts_engine.models.qwen3_tts.weights import validate_checkpoint_weights
from tts_engine.request import RequestError, SpeechRequest, SynthesisResult, VoicePrompt
from tts_engine.stages.talker import MIN_NEW_TOKENS, TalkerSampling, TalkerStage
from tts_engine.stages.vllm_bridge import TalkerEngine
from tts_engine.config import DecoderStageConfig, StageConfig, TalkerStageConfig, load_stage_config
from tts_engine.processors.qwen3_tts import ChunkConnector, talker2code2wav_async_chunk
from tts_engine.stages.decoder import AsyncDecodingPipeline
from tts_engine.streaming import Job, StreamingChunkOutput
from tts_engine.voices import VoiceCloner

log = logging.getLogger(__name__)
SAMPLE_RATE = 24000


@dataclass
class EngineOptions:
    """Engine knobs; stage configs (configs/*.yaml) and keyword overrides land here."""

    device: str | None = None            # "cuda", "cuda:1", "cpu"; default: cuda if available
    max_num_seqs: int = 16
    max_model_len: int = 4096
    gpu_memory_utilization: float = 0.3
    kv_cache_gib: float | None = None     # CPU KV cache (VLLM_CPU_KVCACHE_SPACE)
    enforce_eager: bool | None = None     # default: eager on CPU, CUDA graphs on GPU
    seed: int = 0
    stage_config: "StageConfig | None" = None   # processors, chunking, Stage 1 device, sampling defaults


class TTSEngine:
    def __init__(self, config: Qwen3TTSConfig, options: EngineOptions, dtype: torch.dtype):
        self.config = config
        self.options = options
        self.dtype = dtype
        device = _device_of(options)
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise RuntimeError(f"the stage config places the talker on {device}, but CUDA is not available here; "
                               "use a CPU config (configs/qwen3_tts_cpu.yaml) or devices: auto")
        self.device = torch.device(device)
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(config.path))
        max_model_len = options.max_model_len
        raw = _raw_talker_config(config.path)
        self.talker_engine = TalkerEngine(
            config.path, raw, dtype=dtype, device=self.device.type, max_num_seqs=options.max_num_seqs,
            max_model_len=max_model_len, gpu_memory_utilization=options.gpu_memory_utilization,
            kv_cache_gib=options.kv_cache_gib,
            enforce_eager=options.enforce_eager if options.enforce_eager is not None else self.device.type == "cpu",
            seed=options.seed)
        model = self.talker_engine.model
        self.text_embedder = TextEmbedder.from_checkpoint(config, self.device, dtype)
        embed_tokens = model.model.embed_tokens
        self.prompts = PromptBuilder(
            config, lambda s: self.tokenizer(s)["input_ids"], self.text_embedder,
            codec_embed=embed_tokens,
            frame_embed=lambda codes: model.code_predictor.embed_codes(codes, embed_tokens.weight))
        stages = options.stage_config or default_stage_config()
        self.stage_config = stages
        d = stages.decoder
        self.decoder_device = self.device if d.device == "auto" else torch.device(d.device)
        self.decoder = Code2WavDecoder.from_folder(config.path / "speech_tokenizer", device=self.decoder_device,
                                                   dtype=torch.float32)
        self.cloner = VoiceCloner(config, self.device) if config.model_type == "base" else None
        self.connector = ChunkConnector(chunk_size=d.chunk_size, left_context_size=d.left_context_size,
                                        initial_chunk_size=d.initial_chunk_size, chunk_growth=d.chunk_growth)
        self.pipeline = AsyncDecodingPipeline(self.decoder, self.decoder_device, mode=d.decode_mode,
                                              max_batch_size=d.max_batch_size, left_context_size=d.left_context_size)
        self.talker = TalkerStage(self.talker_engine, config, self.device)
        self._jobs: dict[str, Job] = {}
        self._jobs_lock = threading.Lock()
        self._closed = False

    # ---- construction ----------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, model: str | Path, stage_config: str | Path | None = None,
                        dtype: torch.dtype | str | None = None, **overrides) -> "TTSEngine":
        """`model`: a local folder or a Hub id. dtype default: bfloat16 on GPU, float32 on CPU."""
        options = EngineOptions()
        if stage_config is not None:
            options = load_stage_config(stage_config).engine_options(options)
        for key, value in overrides.items():
            if not hasattr(options, key):
                raise TypeError(f"unknown engine option {key!r}; known: {sorted(vars(options))}")
            setattr(options, key, value)
        folder = resolve_model(model)
        config = load_config(folder)
        validate_checkpoint_weights(config)
        on_gpu = _device_of(options).startswith("cuda")
        if dtype is None:
            dtype = torch.bfloat16 if on_gpu else torch.float32
        elif isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        log.info("loading %s (%s, %s) on %s", folder, config.model_type, config.model_size,
                 "GPU" if on_gpu else "CPU")
        return cls(config, options, dtype)

    def close(self) -> None:
        """Stop the stepping thread and release the vLLM engine (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self.talker.close()
        self.pipeline.close()
        self.talker_engine.close()

    def __enter__(self) -> "TTSEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

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
    def _submit(self, request: SpeechRequest, deliver, request_id: str | None = None) -> tuple[Job, VoicePrompt | None]:
        """Validate, build the prompt and start both stages; outputs go to `deliver` (any thread)."""
        if self._closed:
            raise RuntimeError("the engine is closed")
        prompt_inputs, voice = self._prompt_inputs(request)
        prompt = self.prompts.build(prompt_inputs)
        positions, limit = prompt.prefill.shape[0], self.talker_engine.max_model_len
        if positions >= limit:
            raise RequestError(f"text is too long: its prompt takes {positions} positions and the engine's "
                               f"max_model_len is {limit}; split the text or raise max_model_len")
        sampling = self._sampling(request)
        request_id = request_id or uuid.uuid4().hex
        processor = self.stage_config.talker.processor
        job = Job(request_id, processor, self.connector, self.pipeline, deliver, self._job_done, self.decoder_device)
        with self._jobs_lock:
            if request_id in self._jobs:
                raise RequestError(f"request id {request_id!r} is already running")
            self._jobs[request_id] = job
        self.pipeline.open(request_id, job.on_output, context_codes=prompt_inputs.ref_codes)
        self.talker.submit(request_id, prompt, sampling, job.on_frames, job.on_finish)
        return job, voice

    def _job_done(self, request_id: str) -> None:
        with self._jobs_lock:
            self._jobs.pop(request_id, None)

    async def generate(self, request: SpeechRequest, request_id: str | None = None
                       ) -> AsyncIterator[StreamingChunkOutput]:
        """Stream a request: delta PCM chunks as Stage 1 produces them, the last with `metrics`.

        Closing or cancelling the iterator aborts the request in both stages.
        """
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue = asyncio.Queue()
        job, _ = await loop.run_in_executor(
            None, self._submit, request, lambda item: loop.call_soon_threadsafe(inbox.put_nowait, item), request_id)
        finished = False
        try:
            while True:
                item = await inbox.get()
                if isinstance(item, Exception):
                    finished = True
                    raise item
                finished = item.is_finished
                yield item
                if finished:
                    return
        finally:
            if not finished:
                self.abort(job.request_id)

    def abort(self, request_id: str) -> None:
        """Stop a request in both stages and free its buffers (returns at once; see `drain`)."""
        with self._jobs_lock:
            job = self._jobs.pop(request_id, None)
        if job is not None:
            job.cancel()
        self.talker.abort(request_id)
        self.pipeline.abort(request_id)

    def drain(self, timeout: float = 30.0) -> None:
        """Wait until both stage threads have handled every command sent before this call."""
        self.talker.barrier(timeout)
        self.pipeline.barrier(timeout)

    def debug_state(self) -> dict[str, set[str]]:
        """Per-request state still held by each part of the engine (for tests and diagnostics)."""
        return {
            "jobs": set(self._jobs), "stage0": set(self.talker.active_request_ids),
            "vllm": set(self.talker_engine.unfinished_request_ids()),
            "connector": self.connector.active_request_ids(), "stage1": self.pipeline.active_request_ids,
        }

    def warmup(self) -> float:
        """Run one throw-away request through both stages so the first user request does not pay for
        first-call costs (vLLM's first steps, allocator growth, kernels for each chunk shape).
        Returns the seconds it took."""
        start = time.perf_counter()
        d = self.stage_config.decoder
        frames, size, k = d.initial_chunk_size, d.initial_chunk_size, 1
        while size < d.chunk_size:     # cover every chunk size of the schedule once
            size = min(d.chunk_size, d.initial_chunk_size * max(2, d.chunk_growth) ** k)
            frames += size
            k += 1
        kind = self.config.model_type
        fields: dict = {"voice": VoicePrompt(torch.zeros(self.config.talker.shape.hidden_size), x_vector_only=True)}
        if kind == "custom_voice":
            fields = {"speaker": self.config.supported_speakers[0]}
        elif kind == "voice_design":
            fields = {"instruct": "A neutral voice."}
        request = SpeechRequest(text="Warm-up.", do_sample=False, subtalker_do_sample=False,
                                max_new_tokens=frames + 1, **fields)
        for _ in self.stream(request):
            pass
        elapsed = time.perf_counter() - start
        log.info("warm-up: %d frames through both stages in %.2f s", frames, elapsed)
        return elapsed

    def stream(self, request: SpeechRequest, request_id: str | None = None) -> Iterator[StreamingChunkOutput]:
        """Blocking counterpart of `generate` for threads (e.g. a WebRTC generator); closing the
        iterator early aborts the request."""
        inbox: queue.Queue = queue.Queue()
        job, _ = self._submit(request, inbox.put, request_id)
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
                self.abort(job.request_id)

    def synthesize(self, request: SpeechRequest) -> SynthesisResult:
        """Run one request to completion and return all of it (the concatenated stream).

        Several threads may call this at once; vLLM batches their talker steps.
        """
        inbox: queue.Queue = queue.Queue()
        job, voice = self._submit(request, inbox.put)
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
            self.abort(job.request_id)
            raise
        audio = np.concatenate([c.audio for c in chunks]) if chunks else np.zeros(0, np.float32)
        codes = [c.codec_codes for c in chunks if c.codec_codes is not None and len(c.codec_codes)]
        all_codes = np.concatenate(codes) if codes else np.zeros((0, 16), np.int64)
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
        language = (r.language or "auto").strip().lower()
        if language not in cfg.supported_languages:
            raise RequestError(f"unsupported language {r.language!r}; supported: {cfg.supported_languages}")
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
        stage = self.stage_config.talker.sampling
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


def _device_of(options: EngineOptions) -> str:
    """The talker's device: the configured one, else CUDA when there is a GPU."""
    return options.device or ("cuda" if torch.cuda.is_available() else "cpu")


def default_stage_config() -> StageConfig:
    """What configs/qwen3_tts.yaml says: async_chunk streaming, exact decoding, a first chunk of 1 frame
    growing 2, 4, ... up to 25 (devices and sizes left to the machine)."""
    return StageConfig(path=None, async_chunk=True, model=None,
                       talker=TalkerStageConfig(processor=talker2code2wav_async_chunk),
                       decoder=DecoderStageConfig(chunk_growth=2))


def _raw_talker_config(folder: Path) -> dict:
    from tts_engine.models.qwen3_tts.config import read_json
    return read_json(folder / "config.json")["talker_config"]


__all__ = ["TTSEngine", "EngineOptions", "CheckpointError"]
