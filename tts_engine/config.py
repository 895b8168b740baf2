"""Engine settings: stage-config YAML (configs/*.yaml, the seed's schema) -> validated dataclasses.

Every knob has exactly one default, the field default of `TalkerStageConfig` or `DecoderStageConfig`:
no YAML, a YAML that leaves a key out and `TTSEngine.from_pretrained(**overrides)` all start from it.
The chunk schedule (`ChunkSchedule`) is derived here once; the connector, the warm-up and the
decoder's CUDA-graph shapes all read it.

A bad config fails at start-up with the file and the key path in the message: unknown keys, wrong
types, impossible values (chunk_size < 1, ...), a missing stage 0, a cycle in engine_input_source, a
stage input processor that does not import, or one whose kind contradicts `async_chunk`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable

import yaml

from tts_engine.processors.qwen3_tts import talker2code2wav_async_chunk


class StageConfigError(ValueError):
    pass


@dataclass(frozen=True)
class ChunkSchedule:
    """How many new frames each chunk of a stream carries: `initial` for the first `repeats` chunks, then
    (growth g > 1) initial * g**k capped at `size`, else `size`: 1, 2, 4, 8, 16, 25, 25, ... by default, so a
    real-time player fed by a tiny first chunk never runs dry while the next, bigger one is generated.

    The second chunk is the tight one: it must be generated and decoded while the first plays, i.e. within
    initial x 80 ms, and it takes `initial * g` talker steps. `repeats` = 2 (1, 1, 2, 4, ...) halves that
    when steps are slow (many streams), for one more decode call per stream. The engine's default schedule
    is `DecoderStageConfig.schedule` (repeats 2); this type's own defaults are the plain 1, 2, 4, ..."""

    initial: int = 1
    size: int = 25
    growth: int = 2
    repeats: int = 1

    def frames(self, chunk_idx: int) -> int:
        if chunk_idx < self.repeats:
            return self.initial
        if self.growth <= 1:
            return self.size
        return min(self.size, self.initial * self.growth ** (chunk_idx - self.repeats + 1))

    def steady_index(self) -> int:
        """Index of the first chunk from which every chunk has `frames(k) == frames(steady_index())`."""
        k = max(1, self.repeats)        # inside the repeated first chunks, equal sizes say nothing
        while self.frames(k) != self.frames(k + 1):
            k += 1
        return k

    def sizes(self) -> list[int]:
        """Every distinct chunk size of the schedule, in stream order."""
        sizes: list[int] = []
        for k in range(self.steady_index() + 1):
            if self.frames(k) not in sizes:
                sizes.append(self.frames(k))
        return sizes

    def frames_through_steady(self) -> int:
        """Frames a stream needs to meet every chunk size once (what the warm-up generates)."""
        return sum(self.frames(k) for k in range(self.steady_index() + 1))


@dataclass(frozen=True)
class TalkerStageConfig:
    """Stage 0: the talker on vLLM."""

    device: str = "auto"                      # auto: cuda when a GPU answers, else cpu
    max_num_seqs: int = 16                    # requests stepped together (vLLM batch)
    max_model_len: int = 4096                 # prompt + generated frames per request
    gpu_memory_utilization: float = 0.3
    kv_cache_gib: float | None = None         # CPU KV cache (VLLM_CPU_KVCACHE_SPACE); None: vLLM's default
    enforce_eager: bool | None = None         # None: eager on CPU, CUDA graphs on GPU
    async_scheduling: bool = True             # vLLM prepares step t+1 while the GPU runs step t (GPU only:
                                              # vLLM turns it off on CPU); the hooks tolerate the one-step lag
    cudagraph_mode: str = "FULL"              # full CUDA graphs for steps a prefill joins too, not only for
                                              # decode-only steps (vLLM's FULL_AND_PIECEWISE runs those piecewise,
                                              # attention eager): Poisson 20 p95 67 vs 75-101 ms on the H200. Needs
                                              # FlashAttention 3 (vLLM falls back to FULL_AND_PIECEWISE without it)
    cudagraph_max_tokens: int | None = 2048   # tokens of the largest step run from a graph (None: vLLM's choice,
                                              # min(2 x max_num_seqs, 512)); a longer step runs without graphs.
                                              # 2,048 = vLLM's step budget: a burst of prompts runs from graphs too
                                              # (closed 64 on the H200: first chunk p50 238 vs 330 ms, 2 vs 22 of
                                              # 128 streams underran; capped at max_model_len, see vllm_bridge)
    high_priority_steps: bool = True          # Stage 0 steps on a CUDA stream of a priority above Stage 1's, so its
                                              # long decoder calls do not hold back the talker's step (GPU only;
                                              # Poisson 20 on the H200: p95 42 vs 55 ms, frame p50 8.0 vs 11.6 ms)
    early_handover: bool = True               # frames go on to Stage 1 once the code predictor made them, not after
                                              # the talker's forward queued behind it (GPU only; Poisson 1 on the
                                              # H200: first chunk's decode call p50 6.1 vs 8.1 ms, 7.0 vs 8.8)
    max_batched_tokens: int | None = None     # tokens one step may carry, prefills included (vLLM's
                                              # max_num_batched_tokens; None: vLLM's choice, 2,048 here)
    seed: int = 0
    processor: Callable = talker2code2wav_async_chunk   # the stage input processor (Stage 0 -> Stage 1)
    sampling: dict[str, Any] = field(default_factory=dict)   # default_sampling_params


@dataclass(frozen=True)
class DecoderStageConfig:
    """Stage 1: Code2Wav."""

    device: str = "auto"                      # auto: the talker's device
    chunk_size: int = 25
    left_context_size: int = 25
    initial_chunk_size: int = 1
    chunk_growth: int = 2                     # >1: chunks grow geometrically from the first to chunk_size
    initial_chunk_repeats: int = 2            # chunks of initial_chunk_size before the growth starts (1, 1, 2, 4, ...:
                                              # no underruns at 64 streams on the H200 where 1 had 49 of 128,
                                              # one 128-request run: BENCHMARKS.md)
    decode_mode: str = "exact"                # exact (carried state) | context (the seed's left-context method)
    max_batch_size: int = 16                  # streams decoded in one call (and CUDA graphs captured up to it)
    max_batch_frames: int = 400               # streams x new frames in one call: a round of big chunks is split
                                              # (decoder activations grow with both; 16 x 25 fits beside vLLM)

    @property
    def schedule(self) -> ChunkSchedule:
        return ChunkSchedule(self.initial_chunk_size, self.chunk_size, self.chunk_growth, self.initial_chunk_repeats)

    def graph_frame_counts(self) -> list[int]:
        """Frame counts of the decoder's CUDA graphs: every chunk size of the schedule and every remainder
        a stream's last chunk can have (1 .. chunk_size), so no decode of a stream runs eagerly."""
        return sorted(set(range(1, self.chunk_size + 1)) | set(self.schedule.sizes()))

    def graph_batch_sizes(self) -> list[int]:
        """Batch buckets of the decoder's CUDA graphs: powers of two up to `max_batch_size`, and it."""
        return batch_buckets(self.max_batch_size)

    def batch_limit(self, frames: int) -> int:
        """Streams decoded together in one call for chunks of `frames` new frames."""
        return max(1, min(self.max_batch_size, self.max_batch_frames // max(1, frames)))

    def graph_shapes(self) -> list[tuple[int, int]]:
        """(batch bucket, frames) of every decoder CUDA graph: each frame count with the buckets a call of
        that many frames can use: powers of two below `batch_limit(frames)`, and that limit."""
        return [(b, n) for n in self.graph_frame_counts() for b in batch_buckets(self.batch_limit(n))]


def batch_buckets(limit: int) -> list[int]:
    """1, 2, 4, ... below `limit`, then `limit`: the batch sizes graphs are captured for and warmed at."""
    sizes, b = [], 1
    while b < limit:
        sizes.append(b)
        b *= 2
    return sizes + [limit]


@dataclass(frozen=True)
class StageConfig:
    path: Path | None = None
    async_chunk: bool = True
    model: str | None = None                  # the checkpoint when the caller names none
    talker: TalkerStageConfig = field(default_factory=TalkerStageConfig)
    decoder: DecoderStageConfig = field(default_factory=DecoderStageConfig)

    def with_overrides(self, **overrides: Any) -> StageConfig:
        """Replace fields by name (`max_num_seqs=8`, `chunk_size=12`, ...). A name of both stages
        (`device`) means the talker's; Stage 1 follows it unless its own device is set."""
        talker_names = {f.name for f in fields(TalkerStageConfig)}
        decoder_names = {f.name for f in fields(DecoderStageConfig)} - {"device"}
        talker, decoder = {}, {}
        for key, value in overrides.items():
            if key in talker_names:
                talker[key] = value
            elif key in decoder_names:
                decoder[key] = value
            else:
                raise TypeError(f"unknown engine option {key!r}; known: {sorted(talker_names | decoder_names)}")
        if "device" in talker:
            talker["device"] = _device(talker["device"] or "auto")
        config = replace(self, talker=replace(self.talker, **talker), decoder=replace(self.decoder, **decoder))
        _check_kind(str(self.path or "<overrides>"), config)
        _cudagraph_mode(str(self.path or "<overrides>"), "", config.talker.cudagraph_mode)
        return config


CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")


def _cudagraph_mode(where: str, prefix: str, mode: str) -> str:
    if mode not in CUDAGRAPH_MODES:
        raise StageConfigError(f"{where}: '{prefix}engine_args.cudagraph_mode' must be one of {list(CUDAGRAPH_MODES)}, "
                               f"got {mode!r}")
    return mode


# key -> (type(s), required)
_TOP = {"async_chunk": (bool, True), "model": (str, False), "stage_args": (list, True)}
_STAGE = {"stage_id": (int, True), "stage_type": (str, False), "runtime": (dict, False),
          "engine_args": (dict, True), "default_sampling_params": (dict, False),
          "engine_input_source": (list, False), "final_output": (bool, False), "final_output_type": (str, False)}
_RUNTIME = {"devices": ((str, int), False), "max_batch_size": (int, False)}
_TALKER_ARGS = {"model_stage": (str, True), "worker_type": (str, False), "engine_output_type": (str, False),
                "custom_process_next_stage_input_func": (str, True), "gpu_memory_utilization": (float, False),
                "max_model_len": (int, False), "max_num_seqs": (int, False), "kv_cache_gib": (float, False),
                "enforce_eager": (bool, False), "async_scheduling": (bool, False),
                "cudagraph_mode": (str, False), "cudagraph_max_tokens": ((int, type(None)), False),
                "max_batched_tokens": ((int, type(None)), False), "high_priority_steps": (bool, False),
                "early_handover": (bool, False)}
_DECODER_ARGS = {"model_stage": (str, True), "worker_type": (str, False), "engine_output_type": (str, False),
                 "chunk_size": (int, False), "left_context_size": (int, False), "initial_chunk_size": (int, False),
                 "chunk_growth": (int, False), "initial_chunk_repeats": (int, False), "decode_mode": (str, False),
                 "max_batch_frames": (int, False)}
_SAMPLING = {"temperature": (float, False), "top_k": (int, False), "top_p": (float, False),
             "repetition_penalty": (float, False), "max_tokens": (int, False), "do_sample": (bool, False),
             "subtalker_do_sample": (bool, False), "subtalker_temperature": (float, False),
             "subtalker_top_k": (int, False), "subtalker_top_p": (float, False), "seed": (int, False)}
_TALKER_DEFAULTS = TalkerStageConfig()
_DECODER_DEFAULTS = DecoderStageConfig()


def _check(where: str, data: dict, schema: dict, path: str) -> None:
    for key in data:
        if key not in schema:
            raise StageConfigError(f"{where}: unknown key '{path}{key}' (known: {sorted(schema)})")
    for key, (kind, required) in schema.items():
        if key not in data:
            if required:
                raise StageConfigError(f"{where}: key '{path}{key}' is missing")
            continue
        value = data[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            continue
        if isinstance(value, bool) and bool not in kinds:
            raise StageConfigError(f"{where}: key '{path}{key}' must be {kind}, got {value!r}")
        if not isinstance(value, kinds):
            names = "/".join(k.__name__ for k in kinds)
            raise StageConfigError(f"{where}: key '{path}{key}' must be {names}, got {value!r}")


def _device(value: Any) -> str:
    text = str(value).strip().lower()
    if text in ("cpu", "auto", "meta"):
        return text
    if text.startswith("cuda"):
        return text
    first = text.split(",")[0]
    if not first.isdigit():
        raise ValueError(f"devices must be 'cpu', 'auto', 'cuda[:N]' or a GPU index, got {value!r}")
    return f"cuda:{first}"


def _import_processor(where: str, path: str, dotted: str) -> Callable:
    module_name, _, attr = dotted.rpartition(".")
    try:
        func = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise StageConfigError(f"{where}: '{path}' = {dotted!r} cannot be imported: {exc}") from exc
    if not callable(func):
        raise StageConfigError(f"{where}: '{path}' = {dotted!r} is not callable")
    return func


def _check_kind(where: str, config: StageConfig) -> None:
    """`async_chunk` and the processor must agree: a processor says whether it streams (`.streams`)."""
    processor = config.talker.processor
    streams = getattr(processor, "streams", None)
    name = getattr(processor, "__qualname__", repr(processor))
    if not isinstance(streams, bool):
        raise StageConfigError(f"{where}: the stage input processor {name} does not declare `streams` "
                               "(True: emits chunks while Stage 0 runs; False: once at the end)")
    if streams != config.async_chunk:
        kind = "streams chunks" if streams else "emits everything once Stage 0 finishes"
        raise StageConfigError(f"{where}: 'async_chunk' is {str(config.async_chunk).lower()} but the stage input "
                               f"processor {name} {kind}; use talker2code2wav_async_chunk with async_chunk: true "
                               "or talker2code2wav with async_chunk: false")


def _check_sources(where: str, stages: dict[int, dict]) -> None:
    graph = {sid: s.get("engine_input_source", []) for sid, s in stages.items()}
    for sid, sources in graph.items():
        for src in sources:
            if src not in graph:
                raise StageConfigError(f"{where}: stage {sid} engine_input_source names unknown stage {src}")
    visiting, done = set(), set()

    def visit(node: int, trail: list[int]) -> None:
        if node in done:
            return
        if node in visiting:
            cycle = " -> ".join(map(str, trail + [node]))
            raise StageConfigError(f"{where}: engine_input_source has a cycle: {cycle}")
        visiting.add(node)
        for src in graph[node]:
            visit(src, trail + [node])
        visiting.discard(node)
        done.add(node)

    for node in graph:
        visit(node, [])


def _stages(where: str, data: dict) -> tuple[dict, dict]:
    stages: dict[int, dict] = {}
    for i, stage in enumerate(data["stage_args"]):
        if not isinstance(stage, dict):
            raise StageConfigError(f"{where}: stage_args[{i}] must be a mapping")
        _check(where, stage, _STAGE, f"stage_args[{i}].")
        sid = stage["stage_id"]
        if sid in stages:
            raise StageConfigError(f"{where}: stage_id {sid} appears twice")
        stages[sid] = stage
    if 0 not in stages:
        raise StageConfigError(f"{where}: stage 0 (the talker) is missing from stage_args")
    if set(stages) - {0, 1}:
        raise StageConfigError(f"{where}: only stages 0 (talker) and 1 (code2wav) exist, got {sorted(stages)}")
    if 1 not in stages:
        raise StageConfigError(f"{where}: stage 1 (code2wav) is missing from stage_args")
    _check_sources(where, stages)
    if stages[1].get("engine_input_source", [0]) != [0]:
        raise StageConfigError(f"{where}: stage 1 must take its input from stage 0 (engine_input_source: [0])")
    return stages[0], stages[1]


def parse_stage_config(data: Any, where: str = "<stage config>") -> StageConfig:
    if not isinstance(data, dict):
        raise StageConfigError(f"{where}: expected a mapping at the top level")
    _check(where, data, _TOP, "")
    s0, s1 = _stages(where, data)
    p0, p1 = "stage_args[stage_id=0].", "stage_args[stage_id=1]."
    for prefix, stage, args_schema in ((p0, s0, _TALKER_ARGS), (p1, s1, _DECODER_ARGS)):
        _check(where, stage.get("runtime", {}), _RUNTIME, prefix + "runtime.")
        _check(where, stage["engine_args"], args_schema, prefix + "engine_args.")
    _check(where, s0.get("default_sampling_params", {}), _SAMPLING, p0 + "default_sampling_params.")
    if s0["engine_args"]["model_stage"] != "talker":
        raise StageConfigError(f"{where}: '{p0}engine_args.model_stage' must be 'talker'")
    if s1["engine_args"]["model_stage"] != "code2wav":
        raise StageConfigError(f"{where}: '{p1}engine_args.model_stage' must be 'code2wav'")

    def positive(prefix: str, table: dict, key: str, default, minimum=1):
        value = table.get(key, default)
        if value is not None and value < minimum:
            raise StageConfigError(f"{where}: '{prefix}{key}' must be >= {minimum}, got {value}")
        return value

    def device(prefix: str, stage: dict) -> str:
        try:
            return _device(stage.get("runtime", {}).get("devices", "auto"))
        except ValueError as exc:
            raise StageConfigError(f"{where}: '{prefix}runtime.devices': {exc}") from exc

    a0, a1, r0, r1 = s0["engine_args"], s1["engine_args"], s0.get("runtime", {}), s1.get("runtime", {})
    t, d = _TALKER_DEFAULTS, _DECODER_DEFAULTS
    utilization = a0.get("gpu_memory_utilization", t.gpu_memory_utilization)
    if not 0 < utilization <= 1:
        raise StageConfigError(f"{where}: '{p0}engine_args.gpu_memory_utilization' must be in (0, 1]")
    sampling = dict(s0.get("default_sampling_params", {}))
    for key in ("temperature", "top_p", "repetition_penalty"):
        if key in sampling and sampling[key] <= 0:
            raise StageConfigError(f"{where}: '{p0}default_sampling_params.{key}' must be > 0")
    if "max_tokens" in sampling:
        sampling["max_new_tokens"] = positive(p0 + "default_sampling_params.", sampling, "max_tokens", None)
        del sampling["max_tokens"]
    seqs = positive(p0 + "engine_args.", a0, "max_num_seqs", None)
    batch = positive(p0 + "runtime.", r0, "max_batch_size", None)
    if seqs is not None and batch is not None and seqs != batch:
        raise StageConfigError(f"{where}: '{p0}engine_args.max_num_seqs' ({seqs}) and '{p0}runtime.max_batch_size' "
                               f"({batch}) name the same limit differently; keep one")
    talker = TalkerStageConfig(
        device=device(p0, s0), max_num_seqs=seqs or batch or t.max_num_seqs,
        max_model_len=positive(p0 + "engine_args.", a0, "max_model_len", t.max_model_len, minimum=16),
        gpu_memory_utilization=float(utilization), kv_cache_gib=a0.get("kv_cache_gib", t.kv_cache_gib),
        enforce_eager=a0.get("enforce_eager", t.enforce_eager),
        async_scheduling=a0.get("async_scheduling", t.async_scheduling),
        cudagraph_mode=_cudagraph_mode(where, p0, a0.get("cudagraph_mode", t.cudagraph_mode)),
        cudagraph_max_tokens=positive(p0 + "engine_args.", a0, "cudagraph_max_tokens", t.cudagraph_max_tokens),
        max_batched_tokens=positive(p0 + "engine_args.", a0, "max_batched_tokens", t.max_batched_tokens),
        high_priority_steps=a0.get("high_priority_steps", t.high_priority_steps),
        early_handover=a0.get("early_handover", t.early_handover),
        processor=_import_processor(where, p0 + "engine_args.custom_process_next_stage_input_func",
                                    a0["custom_process_next_stage_input_func"]),
        sampling=sampling)
    mode = a1.get("decode_mode", d.decode_mode)
    if mode not in ("exact", "context"):
        raise StageConfigError(f"{where}: '{p1}engine_args.decode_mode' must be 'exact' or 'context', got {mode!r}")
    decoder = DecoderStageConfig(
        device=device(p1, s1), chunk_size=positive(p1 + "engine_args.", a1, "chunk_size", d.chunk_size),
        left_context_size=positive(p1 + "engine_args.", a1, "left_context_size", d.left_context_size, minimum=0),
        initial_chunk_size=positive(p1 + "engine_args.", a1, "initial_chunk_size", d.initial_chunk_size),
        decode_mode=mode, chunk_growth=positive(p1 + "engine_args.", a1, "chunk_growth", d.chunk_growth),
        initial_chunk_repeats=positive(p1 + "engine_args.", a1, "initial_chunk_repeats", d.initial_chunk_repeats),
        max_batch_size=positive(p1 + "runtime.", r1, "max_batch_size", d.max_batch_size),
        max_batch_frames=positive(p1 + "engine_args.", a1, "max_batch_frames", d.max_batch_frames))
    config = StageConfig(path=None, async_chunk=data["async_chunk"], model=data.get("model"), talker=talker,
                         decoder=decoder)
    _check_kind(where, config)
    return config


def load_stage_config(path: str | Path) -> StageConfig:
    path = Path(path)
    if not path.is_file():
        raise StageConfigError(f"{path}: stage config file not found")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise StageConfigError(f"{path}: malformed YAML: {exc}") from exc
    return replace(parse_stage_config(data, str(path)), path=path)


def engine_settings(stage_config: StageConfig | str | Path | None, **overrides: Any) -> StageConfig:
    """The one way settings are assembled: the defaults, or a YAML / StageConfig, then overrides."""
    if stage_config is None:
        config = StageConfig()
    elif isinstance(stage_config, StageConfig):
        config = stage_config
    else:
        config = load_stage_config(stage_config)
    return config.with_overrides(**overrides) if overrides else config


__all__ = ["ChunkSchedule", "batch_buckets", "DecoderStageConfig", "StageConfig", "StageConfigError", "TalkerStageConfig",
           "engine_settings", "load_stage_config", "parse_stage_config"]
