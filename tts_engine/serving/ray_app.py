"""Scale out on Ray Serve: one whole engine (both stages) per replica, the same routes as `app.py`.

    ray start --head                       # first machine (others: ray start --address HEAD:6379)
    serve run configs/serve.yaml           # GPU: one replica per GPU, autoscaled on ongoing requests
    serve run configs/serve_tiny_cpu.yaml  # two replicas of the --demo tiny model on CPU

Each replica is a `TTSReplica`: it builds the engine, the voice library (one shared folder), the serving
settings and `app.build_agent_api` (= `serving.server.build_api` + fastrtc's `POST /webrtc/offer`), and
serves that FastAPI app through Serve's ingress: the routes are defined in one place. Every response
carries `x-tts-replica` (the replica's id). Serve's health check calls `check_health`, which asks the
engine whether both stage threads run; an unhealthy or dead replica is replaced by Serve.

WebRTC session affinity uses Serve's own routing: a replica announces the `webrtc_id`s of the peer
connections it holds as its *multiplexed model ids*, and `SessionAffinityRouter` (this deployment's
request router) sends a request whose `serve_multiplexed_model_id` header names a session to the
replica holding it, and nowhere else; new offers go to the replica with the fewest sessions, stateless
requests to the less busy of two (power of two choices). Clients send the header
`serve_multiplexed_model_id: <webrtc_id>` with `/v1/realtime/say`, `interrupt` and `stats` (on the
offer it is optional: an offer is placed by session count either way). The Gradio UI is not served
here: `python app.py` is the single-process front end.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ray import serve
from ray.serve.config import RequestRouterConfig
from ray.serve.request_router import MultiplexMixin, PendingRequest, RequestRouter, RunningReplica

ROOT = Path(__file__).resolve().parents[2]
SESSION_HEADER = "serve_multiplexed_model_id"     # Serve's own header for multiplexed ids
REPLICA_HEADER = "x-tts-replica"
OFFER_ROUTE = "/webrtc/offer"
SESSION_WAIT_S = 3.0        # how long a request for an unknown session waits for its replica to be announced
ANNOUNCE_EVERY_S = 1.0      # how often a replica re-checks its sessions (closed connections are withdrawn)
log = logging.getLogger("tts_engine.serving.ray_app")

_REPLICA: TTSReplica | None = None   # the replica of this actor process (one per process)


# ---- routing -------------------------------------------------------------------------------------
class SessionAffinityRouter(MultiplexMixin, RequestRouter):
    """Strict session affinity over Serve's multiplexed-id bookkeeping.

    - a request naming a session (header `serve_multiplexed_model_id`) held by a replica goes to that
      replica only (it waits in Serve's queue while the replica is full: its audio cannot move);
    - an offer, or a request naming a session nobody holds, goes to the replicas holding the fewest
      sessions; a `say`/`interrupt`/`stats` for an unknown session first waits up to `SESSION_WAIT_S`
      (a replica's announcement of a fresh session takes a moment to reach every router), then goes
      anywhere and gets 404 `unknown_session`;
    - everything else: the less loaded of two random replicas.

    No FIFOMixin: the base router hands each chosen replica to exactly the request it was chosen for.
    """

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if pending_request is None:
            # A routing task with no request of its own: the base router (without FIFOMixin, which would hand
            # the replica to whichever request is first in line and break affinity) has nothing to give a
            # replica to, so answering here would spin on queue-length probes. Nothing: it backs off.
            return []
        candidates = list(candidate_replicas)
        if pending_request is not None:  # (always, past the early return)
            pending_request.routing_context.should_backoff = True   # an empty answer sleeps before the retry
            meta = pending_request.metadata
            session, offer = meta.multiplexed_model_id, meta.route.endswith(OFFER_ROUTE)
            if session:
                holders = [self._replicas[r] for r in self._multiplexed_model_id_to_replica_ids.get(session, ())
                           if r in self._replicas]
                if holders:
                    return [holders]
                if not offer and time.time() - pending_request.created_at < SESSION_WAIT_S:
                    return []
            if session or offer:
                fewest = self._get_replica_ids_with_fewest_multiplexed_models()
                candidates = [r for r in candidates if r.replica_id in fewest] or candidates
        if not candidates:
            return []
        return [random.sample(candidates, min(2, len(candidates)))]


# ---- the replica ---------------------------------------------------------------------------------
def _replica_asgi_app():
    """Serve's ingress builder: evaluated in the replica right after `TTSReplica.__init__`."""
    assert _REPLICA is not None, "TTSReplica.__init__ did not run in this process"
    return _REPLICA.api


class TTSReplica:
    """One engine, its voice library view, the serving routes and the WebRTC sessions it holds."""

    def __init__(self, options: dict[str, Any] | None = None):
        global _REPLICA
        import app as app_module
        from tts_engine import TTSEngine
        from tts_engine.serving.lifecycle import READY, Lifecycle
        from tts_engine.serving.settings import ServingSettings
        from tts_engine.serving.voice_library import VoiceLibrary

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        options = dict(options or {})
        context = serve.get_replica_context()
        self.replica_id = context.replica_id
        self.name = context.replica_id.unique_id
        self._scratch = Path(tempfile.mkdtemp(prefix="tts_replica_"))
        model, config = options.get("model"), options.get("config")
        if options.get("demo"):
            from tts_engine.tools.demo_checkpoint import build_demo_checkpoint
            # per process: replicas on one machine never write the same files (the build is deterministic)
            model = build_demo_checkpoint(self._scratch / "demo-base-0b6", "base", "0b6")
            config = config or "configs/qwen3_tts_tiny_cpu.yaml"
        config = _resolve(config)
        if model is None:
            from tts_engine.config import load_stage_config
            model = (load_stage_config(config).model if config else None) or app_module.DEFAULT_MODEL
        t0 = time.perf_counter()
        self.engine = engine = TTSEngine.from_pretrained(model, stage_config=config)
        self.library = VoiceLibrary(_resolve(options.get("voices") or "voices"), engine.config)
        app_module.ensure_sample_voice(engine, self.library)
        preroll_ms = options.get("preroll_ms")
        preroll_ms = preroll_ms if preroll_ms is not None else (0 if engine.device.type == "cuda" else 800)
        seqs = engine_max_num_seqs(config)
        defaults = ServingSettings()
        settings = ServingSettings(max_input_chars=int(options.get("max_input_chars", defaults.max_input_chars)),
                                   max_sessions=int(options.get("max_sessions", defaults.max_sessions)),
                                   max_concurrent=max(defaults.max_concurrent, seqs),
                                   preroll_s=preroll_ms / 1000)
        lifecycle = Lifecycle()
        self.api, warning = app_module.build_agent_api(engine, self.library, settings, lifecycle)
        if warning:
            log.warning(warning)
        self._install_middleware()
        warm_s = engine.warmup()           # the replica turns RUNNING (routable) only once warm
        lifecycle.set(READY)
        self._announced: frozenset[str] | None = None
        self._last_announce = 0.0
        self._stop = threading.Event()
        threading.Thread(target=self._announce_loop, name="announce-sessions", daemon=True).start()
        _REPLICA = self
        log.info("replica %s ready: engine %.1f s, warm-up %.1f s", self.name, time.perf_counter() - t0, warm_s)

    def _install_middleware(self) -> None:
        from fastapi import Request

        stream, name = self.api.state.stream, self.name

        @self.api.middleware("http")
        async def replica_header(request: Request, call_next):
            response = await call_next(request)
            response.headers[REPLICA_HEADER] = name
            if request.url.path == OFFER_ROUTE:
                self.announce(force=True)    # the new session is routable as soon as this reaches the routers
            return response

        self._stream = stream

    # sessions -> Serve's routing table (this replica's multiplexed ids)
    def sessions(self) -> frozenset[str]:
        for _ in range(3):
            try:
                return frozenset(self._stream.pcs)
            except RuntimeError:   # changed size while read from the announce thread
                continue
        return self._announced or frozenset()

    def announce(self, force: bool = False) -> None:
        from ray.serve._private.common import RequestRoutingInfo
        from ray.serve.context import _get_global_client

        ids = self.sessions()
        if ids == self._announced and not force and time.monotonic() - self._last_announce < 10:
            return
        try:
            _get_global_client().record_request_routing_info(
                RequestRoutingInfo(replica_id=self.replica_id, multiplexed_model_ids=sorted(ids)))
            self._announced, self._last_announce = ids, time.monotonic()
        except Exception as exc:  # noqa: BLE001 -- retried on the next tick
            log.warning("could not announce the sessions of replica %s: %s", self.name, exc)

    def _announce_loop(self) -> None:
        while not self._stop.wait(ANNOUNCE_EVERY_S):
            self.announce()

    # Serve calls this every health_check_period_s; raising marks the replica unhealthy -> replaced
    async def check_health(self) -> None:
        state = self.engine.health()
        if not state["healthy"]:
            raise RuntimeError(f"engine unhealthy: {state}")

    def __del__(self) -> None:
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.close()
        shutil.rmtree(getattr(self, "_scratch", ""), ignore_errors=True)


def _resolve(path: str | os.PathLike | None) -> Path | None:
    """Relative paths are taken from the repository root (Serve runs replicas in another folder)."""
    if path is None:
        return None
    path = Path(path).expanduser()
    return path if path.is_absolute() else ROOT / path


def engine_max_num_seqs(config: str | os.PathLike | None) -> int:
    """Stage 0's `max_num_seqs` (= `runtime.max_batch_size`): the requests one engine steps together."""
    from tts_engine.config import engine_settings

    return engine_settings(_resolve(config) if config else None).talker.max_num_seqs


TTSDeployment = serve.deployment(
    serve.ingress(_replica_asgi_app)(TTSReplica),
    name="TTSReplica",
    request_router_config=RequestRouterConfig(request_router_class=SessionAffinityRouter),
    health_check_period_s=5, health_check_timeout_s=30, graceful_shutdown_timeout_s=30,
)


def build(args: dict[str, Any]):
    """`import_path` of configs/serve*.yaml: the application, its options from the config's `args`
    (model, config, demo, voices, max_sessions, max_input_chars, preroll_ms).

    `max_ongoing_requests` follows the engine: Stage 0's `max_num_seqs` streams plus `max_sessions` for the
    short control calls (`say`, `interrupt`, `stats`) of the WebRTC sessions the replica holds, so those
    never queue behind synthesis. A config's `deployments:` entry may still override it."""
    args = dict(args or {})
    config = args.get("config") or ("configs/qwen3_tts_tiny_cpu.yaml" if args.get("demo") else None)
    from tts_engine.serving.settings import ServingSettings

    ongoing = engine_max_num_seqs(config) + int(args.get("max_sessions", ServingSettings().max_sessions))
    return TTSDeployment.options(max_ongoing_requests=ongoing).bind(args)
