"""Scale out on Ray Serve: one whole engine (both stages) per replica, the same routes as `app.py`.

    export PYTHONPATH=$PWD RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=tts_engine.serving.ray_app:proxy_middlewares
    ray start --head                       # first machine (others: ray start --address HEAD:6379)
    serve run configs/serve.yaml           # GPU: one replica per GPU, autoscaled on ongoing requests
    serve run configs/serve_tiny_cpu.yaml  # two replicas of the --demo tiny model on CPU

Each replica is a `TTSReplica`: it builds the engine, the voice library (one shared folder), the serving
settings and `webrtc.build_agent_api` (= `server.build_api` + fastrtc's `POST /webrtc/offer`), and
serves that FastAPI app through Serve's ingress: the routes are defined in one place. Every response
carries `x-tts-replica` (the replica's id). Serve's health check calls `check_health`, which asks the
engine whether both stage threads run; an unhealthy or dead replica is replaced by Serve.

WebRTC session affinity uses Serve's own routing: a replica announces the `webrtc_id`s of the peer
connections it holds as its *multiplexed model ids*, and `SessionAffinityRouter` (this deployment's
request router) sends a request whose `serve_multiplexed_model_id` header names a session to the
replica holding it, and nowhere else. Agents send `serve_multiplexed_model_id: <webrtc_id>` with every
call of a session, the offer included: the router places a new session on the replica with the fewest
sessions and remembers it until the replica's announcement arrives. Requests without the header go to
the less busy of two replicas, and leave `session_reserve` places of each replica free for session calls
(`room_for_synthesis`). `ReplicaLossMiddleware` runs in Serve's HTTP proxy (Serve's proxy
callback) and turns a replica lost mid-request into a 503 or an SSE error event. The Gradio UI is not
served here: `python app.py` is the single-process front end.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray import serve
from ray.serve.config import RequestRouterConfig
from ray.serve.request_router import MultiplexMixin, PendingRequest, RequestRouter, RunningReplica

if TYPE_CHECKING:
    from ray.serve._private.common import ReplicaID, RequestMetadata

ROOT = Path(__file__).resolve().parents[2]
SESSION_HEADER = "serve_multiplexed_model_id"     # Serve's own header for multiplexed ids: the webrtc_id
REPLICA_HEADER = "x-tts-replica"
OFFER_ROUTE = "/webrtc/offer"
PLACEMENT_TTL_S = 30.0      # how long a router remembers where it placed a session its replica has not announced
ANNOUNCE_EVERY_S = 1.0      # how often a replica re-checks its sessions (closed connections are withdrawn)
log = logging.getLogger("tts_engine.serving.ray_app")

_REPLICA: TTSReplica | None = None   # the replica of this actor process (one per process)


# ---- routing -------------------------------------------------------------------------------------
class SessionAffinityRouter(MultiplexMixin, RequestRouter):
    """Strict session affinity over Serve's multiplexed-id bookkeeping.

    Where a request may go (`eligible`):
    - it names a session (header `serve_multiplexed_model_id: <webrtc_id>`) that a replica announced: that
      replica only (while it is full the request waits in Serve's queue: the peer connection cannot move);
    - it names a session nobody announced (the offer that opens it, or a call right after the offer, before
      the announcement reached this router): the replica this router placed the session on, else one of the
      replicas with the fewest sessions, remembered for `PLACEMENT_TTL_S` or until the announcement comes.
      A session that was never opened lands on a replica that answers 404 `unknown_session`;
    - no session: any replica; Serve then takes the one with the shorter queue of two.

    The path of a request is not visible here (Serve's metadata carries the route prefix only), so the offer
    is told apart by nothing but its header: agents send the header on the offer too.

    Serve's base router runs a pool of routing tasks; a task routes for the request it took from the queue,
    or for none when other tasks already took them all (`pending_request=None`). Without `FIFOMixin` the
    base hands a chosen replica only to the exact request it was chosen for, so a task without a request
    finds replicas for nobody, and one that answers nothing backs off forever while counting as a running
    task: requests queue up behind it and the proxy stalls. `FIFOMixin` would hand the replica to whichever
    request is first in line, which breaks affinity. Here a task without a request routes on behalf of the
    oldest waiting request it can place, and a replica found by any task goes to its own request or else to
    the first waiting request that may go to that replica (`_fulfill_next_pending_request`).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._placed: dict[str, tuple[ReplicaID, float]] = {}   # session -> (replica id, when placed), not yet announced
        self.session_reserve = 0
        self._synthesis: dict[ReplicaID, set[str]] = {}   # replica -> internal ids of requests without a session on it

    def initialize_state(self, session_reserve: int = 0, **kwargs) -> None:
        """Serve passes the deployment's `request_router_kwargs` here (`session_router`)."""
        super().initialize_state(**kwargs)
        self.session_reserve = session_reserve

    def eligible(self, request: PendingRequest, candidates: list[RunningReplica]) -> list[RunningReplica]:
        """The replicas among `candidates` that `request` may go to now."""
        session = request.metadata.multiplexed_model_id
        if not session:
            return [r for r in candidates if self.room_for_synthesis(r)]
        home = self._home(session)
        return [r for r in candidates if r.replica_id == home]

    def room_for_synthesis(self, replica: RunningReplica) -> bool:
        """Requests without a session (HTTP synthesis) leave `session_reserve` of a replica's
        `max_ongoing_requests` free, so a session's `say` / `interrupt` / `stats` gets onto its replica at once
        while synthesis fills every replica (else it waits in Serve's queue behind all of it: a barge-in
        seconds late). Counted here, per request: added when a request is handed its replica (synchronous, so
        two routing tasks never both take the last place) and dropped when Serve reports it completed (the
        hook Serve offers for capacity tokens), sent or not."""
        if self.session_reserve <= 0:
            return True
        limit = max(1, replica.max_ongoing_requests - self.session_reserve)
        return len(self._synthesis.get(replica.replica_id, ())) < limit

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        super().on_request_completed(replica_id, internal_request_id)
        held = self._synthesis.get(replica_id)
        if held is not None:
            held.discard(internal_request_id)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._synthesis.pop(replica_id, None)

    def _home(self, session: str) -> ReplicaID | None:
        """The id of the replica that holds (or will hold) `session`, placing it if nobody does."""
        # a holder that died is dropped from `_replicas` at once, from the announced ids only on the controller's
        # next update: its sessions are gone, so such a session is placed anew (and answered 404 there)
        holders = [rid for rid in self._multiplexed_model_id_to_replica_ids.get(session, ()) if rid in self._replicas]
        now = time.monotonic()
        if holders:
            self._placed.pop(session, None)
            return holders[0]
        placed = self._placed.get(session)
        if placed is not None and placed[0] in self._replicas and now - placed[1] < PLACEMENT_TTL_S:
            return placed[0]
        for name, (_, when) in list(self._placed.items()):
            if now - when >= PLACEMENT_TTL_S:
                del self._placed[name]
        if not self._replicas:
            return None
        load = self.session_counts()
        fewest = min(load.values())
        home = random.choice([rid for rid, n in load.items() if n == fewest])
        self._placed[session] = (home, now)
        return home

    def session_counts(self) -> dict[ReplicaID, int]:
        """Sessions per running replica: those it announced plus those placed on it here and not announced yet
        (each session counted once)."""
        load = {rid: len(replica.multiplexed_model_ids) for rid, replica in self._replicas.items()}
        announced = self._multiplexed_model_id_to_replica_ids
        for name, (rid, _) in self._placed.items():
            if rid in load and not announced.get(name):
                load[rid] += 1
        return load

    def _waiting(self) -> list[PendingRequest]:
        """Requests not yet given a replica, oldest first (cancelled and fulfilled ones dropped from the front)."""
        queue = self._pending_requests_to_fulfill
        while queue and queue[0].future.done():
            queue.popleft()
        return [pr for pr in queue if not pr.future.done()]

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        """Serve's hook: the replicas a routing task may pick from now (Serve takes the shortest queue of them)."""
        if pending_request is not None and not pending_request.future.done():
            pending_request.routing_context.should_backoff = True   # nothing eligible: sleep before the retry
            chosen = self.eligible(pending_request, candidate_replicas)
            if chosen:
                return [_two(chosen)]
            # Its own request has no place now (synthesis on full replicas, a session whose replica is full).
            # Serve runs 2 routing tasks per replica and each keeps to its request: with more such requests
            # waiting than tasks, a session's call behind them would wait for one of them to get a place. So
            # route for another waiting request that can go now; the replica found goes to it
            # (`_fulfill_next_pending_request`), and this task's request stays queued for any task to place.
            for request in self._waiting():
                if request is not pending_request:
                    chosen = self.eligible(request, candidate_replicas)
                    if chosen:
                        return [_two(chosen)]
            return []
        # A routing task with no request of its own (or whose request another task placed): route for the
        # oldest waiting request that can be placed now.
        waiting = self._waiting()
        for request in waiting:
            chosen = self.eligible(request, candidate_replicas)
            if chosen:
                return [_two(chosen)]
        # Nothing waits (the task then sees it has nothing to do and ends), or what waits has no replica to go
        # to yet: back off and look again.
        return [] if waiting else [list(candidate_replicas)]

    def _fulfill_next_pending_request(self, replica: RunningReplica,
                                      request_metadata: RequestMetadata | None = None) -> None:
        """Overrides the base router's hand-over (see the class docstring): a routing task found `replica`."""
        own = self._get_pending_request_matching_internal_request_id(request_metadata)
        # chosen for this request by `choose_replicas`, but another task may have filled its synthesis places since
        if own is not None and self.eligible(own, [replica]):
            self._hand_over(own, replica)
            return
        for request in self._waiting():
            if self.eligible(request, [replica]):
                self._hand_over(request, replica)
                return

    def _hand_over(self, request: PendingRequest, replica: RunningReplica) -> None:
        self._record_queue_wait_time(request)
        if not request.metadata.multiplexed_model_id:
            self._synthesis.setdefault(replica.replica_id, set()).add(request.metadata.internal_request_id)
        request.future.set_result(replica)
        self._remove_pending_request_from_indices(request)


def _two(replicas: list[RunningReplica]) -> list[RunningReplica]:
    """Power of two choices: Serve sends the request to the one with the shorter queue."""
    return random.sample(replicas, 2) if len(replicas) > 2 else list(replicas)


# ---- Serve's HTTP proxy: a replica lost mid-request ------------------------------------------------
PROXY_CALLBACK = "tts_engine.serving.ray_app:proxy_middlewares"   # RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH


class ReplicaLossMiddleware:
    """Runs inside Serve's HTTP proxy (Serve's proxy callback, not a proxy of ours) and makes a lost replica
    answer clearly.

    When the replica process serving a request dies, Serve's proxy (2.55) sends nothing before the status line
    (uvicorn then answers a bare `500 Internal Server Error` in plain text) and, once the status line went out,
    just stops the body. Here, in the one error shape: nothing answered yet -> 503 `engine_unavailable` with
    `Retry-After` (a retry reaches a live replica); an SSE stream cut short -> a last `error` event (the same
    event our SSE route sends for a failure mid-stream), then the stream ends. A raw audio stream cut short
    stays cut short (the connection closes without the final chunk): appending bytes would corrupt the audio,
    and a clean end would pass for a complete file.
    """

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        seen = {"started": False, "ended": False, "sse": False}

        async def watch(message) -> None:
            if message["type"] == "http.response.start":
                seen["started"] = True
                kind = dict(message.get("headers") or ()).get(b"content-type", b"")
                seen["sse"] = kind.startswith(b"text/event-stream")
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                seen["ended"] = True
            await send(message)

        await self.app(scope, receive, watch)
        if seen["ended"]:
            return
        from fastapi.responses import JSONResponse

        from tts_engine.serving.errors import ApiError

        error = ApiError("engine_unavailable", "the replica serving this request stopped before it finished "
                                               "(its process died); retry: Serve routes it to a live replica")
        if not seen["started"]:
            log.warning("%s %s: no answer from the replica; answered 503", scope.get("method"), scope.get("path"))
            # built here, not error.response(): the proxy's metrics are never scraped (each replica counts its own)
            response = JSONResponse(error.body(), status_code=error.status, headers=error.headers)
            await response(scope, receive, send)
        elif seen["sse"]:
            log.warning("%s: SSE stream cut short by a lost replica; error event sent", scope.get("path"))
            event = json.dumps({"type": "error", **error.body()}, separators=(",", ":"))
            await send({"type": "http.response.body", "body": f"data: {event}\n\n".encode(), "more_body": False})


def proxy_middlewares() -> list:
    """Serve's HTTP proxy callback (`RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH`, set where Ray starts)."""
    from starlette.middleware import Middleware

    return [Middleware(ReplicaLossMiddleware)]


# ---- the replica ---------------------------------------------------------------------------------
def _replica_asgi_app():
    """Serve's ingress builder: evaluated in the replica right after `TTSReplica.__init__`."""
    assert _REPLICA is not None, "TTSReplica.__init__ did not run in this process"
    return _REPLICA.api


class TTSReplica:
    """One engine, its voice library view, the serving routes and the WebRTC sessions it holds."""

    def __init__(self, options: dict[str, Any] | None = None):
        global _REPLICA
        from tts_engine import TTSEngine
        from tts_engine.serving.lifecycle import READY, Lifecycle
        from tts_engine.serving.sample_voice import ensure_sample_voice
        from tts_engine.serving.settings import DEFAULT_MODEL, ServingSettings, preroll_seconds
        from tts_engine.serving.voice_library import VoiceLibrary
        from tts_engine.serving.webrtc import build_agent_api

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
            model = (load_stage_config(config).model if config else None) or DEFAULT_MODEL
        t0 = time.perf_counter()
        self.engine = engine = TTSEngine.from_pretrained(model, stage_config=config)
        self.library = VoiceLibrary(_resolve(options.get("voices") or "voices"), engine.config)
        ensure_sample_voice(engine, self.library)
        defaults = ServingSettings()
        settings = ServingSettings(max_input_chars=int(options.get("max_input_chars", defaults.max_input_chars)),
                                   max_sessions=options.get("max_sessions", defaults.max_sessions),
                                   max_concurrent=options.get("max_concurrent", _serve_admission(context)),
                                   preroll_s=preroll_seconds(options.get("preroll_ms"), engine.device.type == "cuda"))
        lifecycle = Lifecycle()
        self.api, warning = build_agent_api(engine, self.library, settings, lifecycle)
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


def _serve_admission(context) -> int | None:
    """The replica admits every synthesis request Serve lets onto it (`max_ongoing_requests`): past that,
    Serve's router queues requests until a replica has room, which is Serve's backpressure. Admitting only
    the engine's batch, as `app.py` does, turned half of 128 streams on one replica away with 503 while Serve
    held them as in flight (H200, 2026-12-01); requests past the batch wait in the engine's own queue."""
    config = getattr(context, "_deployment_config", None)   # Serve 2.55 keeps it private; None: engine's batch
    return getattr(config, "max_ongoing_requests", None)


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
    (model, config, demo, voices, max_sessions, max_concurrent, max_input_chars, preroll_ms).

    `max_ongoing_requests` follows the engine: Stage 0's `max_num_seqs` streams plus `max_sessions` for the
    short control calls (`say`, `interrupt`, `stats`) of the WebRTC sessions the replica holds. The router
    keeps those `max_sessions` places for session calls (`SessionAffinityRouter.room_for_synthesis`): HTTP
    synthesis past `max_num_seqs` on every replica waits in Serve's queue, and a session's calls still get in
    at once. The replica admits what Serve sends it (`_serve_admission`; `max_concurrent` in args
    overrides), so overload queues in Serve instead of ending in 503. A config's `deployments:` entry may
    still override `max_ongoing_requests`."""
    args = dict(args or {})
    config = args.get("config") or ("configs/qwen3_tts_tiny_cpu.yaml" if args.get("demo") else None)
    from tts_engine.serving.settings import ServingSettings

    seqs = engine_max_num_seqs(config)
    sessions = ServingSettings(max_sessions=args.get("max_sessions")).session_limit(seqs)
    return TTSDeployment.options(max_ongoing_requests=seqs + sessions,
                                 request_router_config=session_router(sessions)).bind(args)


def session_router(session_reserve: int) -> RequestRouterConfig:
    """This deployment's request router, keeping `session_reserve` places of every replica for session calls."""
    return RequestRouterConfig(request_router_class=SessionAffinityRouter,
                               request_router_kwargs={"session_reserve": session_reserve})
