"""Stage configs (configs/*.yaml, the seed's schema) -> validated dataclasses.

A bad config fails at start-up with the file and the key path in the message: unknown keys, wrong
types, impossible values (chunk_size < 1, ...), a missing stage 0, a cycle in engine_input_source, a
stage input processor that does not import.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import yaml


class StageConfigError(ValueError):
    pass


# key -> (type(s), required)
_TOP = {"async_chunk": (bool, True), "model": (str, False), "stage_args": (list, True)}
_STAGE = {"stage_id": (int, True), "stage_type": (str, False), "runtime": (dict, False),
          "engine_args": (dict, True), "default_sampling_params": (dict, False),
          "engine_input_source": (list, False), "final_output": (bool, False), "final_output_type": (str, False)}
_RUNTIME = {"devices": ((str, int), False), "max_batch_size": (int, False)}
_TALKER_ARGS = {"model_stage": (str, True), "worker_type": (str, False), "engine_output_type": (str, False),
                "custom_process_next_stage_input_func": (str, True), "gpu_memory_utilization": (float, False),
                "max_model_len": (int, False), "max_num_seqs": (int, False), "kv_cache_gib": (float, False),
                "enforce_eager": (bool, False)}
_DECODER_ARGS = {"model_stage": (str, True), "worker_type": (str, False), "engine_output_type": (str, False),
                 "chunk_size": (int, False), "left_context_size": (int, False), "initial_chunk_size": (int, False),
                 "chunk_growth": (int, False), "decode_mode": (str, False)}
_SAMPLING = {"temperature": (float, False), "top_k": (int, False), "top_p": (float, False),
             "repetition_penalty": (float, False), "max_tokens": (int, False), "do_sample": (bool, False),
             "subtalker_do_sample": (bool, False), "subtalker_temperature": (float, False),
             "subtalker_top_k": (int, False), "subtalker_top_p": (float, False), "seed": (int, False)}


@dataclass(frozen=True)
class TalkerStageConfig:
    device: str = "auto"
    max_num_seqs: int = 16
    max_model_len: int = 4096
    gpu_memory_utilization: float = 0.3
    kv_cache_gib: float | None = None
    enforce_eager: bool | None = None
    processor: Callable = None  # type: ignore[assignment]
    sampling: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DecoderStageConfig:
    device: str = "auto"
    chunk_size: int = 25
    left_context_size: int = 25
    initial_chunk_size: int = 1
    chunk_growth: int = 1           # >1: chunks grow geometrically from the first to chunk_size
    decode_mode: str = "exact"      # exact (carried state) | context (the seed's left-context method)
    max_batch_size: int = 16


@dataclass(frozen=True)
class StageConfig:
    path: Path | None
    async_chunk: bool
    model: str | None
    talker: TalkerStageConfig
    decoder: DecoderStageConfig

    def engine_options(self, base):
        """Fold into EngineOptions (keeps anything the config does not set)."""
        t = self.talker
        return replace(base, device=None if t.device == "auto" else t.device, max_num_seqs=t.max_num_seqs,
                       max_model_len=t.max_model_len, gpu_memory_utilization=t.gpu_memory_utilization,
                       kv_cache_gib=t.kv_cache_gib if t.kv_cache_gib is not None else base.kv_cache_gib,
                       enforce_eager=t.enforce_eager if t.enforce_eager is not None else base.enforce_eager,
                       stage_config=self)


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
    if text in ("cpu", "auto"):
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


def parse_stage_config(data: Any, where: str = "<stage config>") -> StageConfig:
    if not isinstance(data, dict):
        raise StageConfigError(f"{where}: expected a mapping at the top level")
    _check(where, data, _TOP, "")
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

    s0, s1 = stages[0], stages[1]
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

    a0, a1, r0 = s0["engine_args"], s1["engine_args"], s0.get("runtime", {})
    utilization = a0.get("gpu_memory_utilization", 0.3)
    if not 0 < utilization <= 1:
        raise StageConfigError(f"{where}: '{p0}engine_args.gpu_memory_utilization' must be in (0, 1]")
    sampling = dict(s0.get("default_sampling_params", {}))
    for key in ("temperature", "top_p", "repetition_penalty"):
        if key in sampling and sampling[key] <= 0:
            raise StageConfigError(f"{where}: '{p0}default_sampling_params.{key}' must be > 0")
    if "max_tokens" in sampling:
        sampling["max_new_tokens"] = positive(p0 + "default_sampling_params.", sampling, "max_tokens", None)
        del sampling["max_tokens"]
    talker = TalkerStageConfig(
        device=device(p0, s0),
        max_num_seqs=positive(p0 + "engine_args.", a0, "max_num_seqs", None) or
        positive(p0 + "runtime.", r0, "max_batch_size", 16),
        max_model_len=positive(p0 + "engine_args.", a0, "max_model_len", 4096, minimum=16),
        gpu_memory_utilization=float(utilization), kv_cache_gib=a0.get("kv_cache_gib"),
        enforce_eager=a0.get("enforce_eager"),
        processor=_import_processor(where, p0 + "engine_args.custom_process_next_stage_input_func",
                                    a0["custom_process_next_stage_input_func"]),
        sampling=sampling)
    mode = a1.get("decode_mode", "exact")
    if mode not in ("exact", "context"):
        raise StageConfigError(f"{where}: '{p1}engine_args.decode_mode' must be 'exact' or 'context', got {mode!r}")
    decoder = DecoderStageConfig(
        device=device(p1, s1), chunk_size=positive(p1 + "engine_args.", a1, "chunk_size", 25),
        left_context_size=positive(p1 + "engine_args.", a1, "left_context_size", 25, minimum=0),
        initial_chunk_size=positive(p1 + "engine_args.", a1, "initial_chunk_size", 1), decode_mode=mode,
        chunk_growth=positive(p1 + "engine_args.", a1, "chunk_growth", 1),
        max_batch_size=positive(p1 + "runtime.", s1.get("runtime", {}), "max_batch_size", 16))
    return StageConfig(path=None, async_chunk=data["async_chunk"], model=data.get("model"), talker=talker,
                       decoder=decoder)


def load_stage_config(path: str | Path) -> StageConfig:
    path = Path(path)
    if not path.is_file():
        raise StageConfigError(f"{path}: stage config file not found")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise StageConfigError(f"{path}: malformed YAML: {exc}") from exc
    return replace(parse_stage_config(data, str(path)), path=path)
