"""Limits of the serving layer: one dataclass, one default per setting.

`app.py`'s command line takes its defaults from here; the routes read the settings on every request,
so a test (or an operator's hook) can change them while serving.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


def aliases_from_env(value: str | None = None) -> dict[str, str]:
    """`TTS_VOICE_ALIASES="alloy=sample,nova=alice"` -> {"alloy": "sample", "nova": "alice"}."""
    value = os.environ.get("TTS_VOICE_ALIASES", "") if value is None else value
    pairs = (item.split("=", 1) for item in value.split(",") if "=" in item)
    return {k.strip().lower(): v.strip() for k, v in pairs if k.strip() and v.strip()}


DEFAULT_MODEL = "Qwen/Qwen3-TTS-12Hz-0.6B-Base"   # what app.py and the Serve replicas load when nothing says
MIN_CONCURRENT = 8


def preroll_seconds(configured_ms: int | None, on_gpu: bool) -> float:
    """WebRTC pre-roll: what was asked for, else none on a GPU (many times real time) and 800 ms on a CPU,
    whose engine runs only a little faster than real time (and slower under load)."""
    return (configured_ms if configured_ms is not None else (0 if on_gpu else 800)) / 1000


@dataclass
class ServingSettings:
    max_input_chars: int = 5000               # longer text -> 400 input_too_long (HTTP, UI, realtime)
    # HTTP synthesis + cloning requests at once; more -> 503. None: the engine's batch (Stage 0's max_num_seqs,
    # 64 on a GPU), at least MIN_CONCURRENT: a fixed 8 turned 120 of 128 streams away on an H200 that steps 64
    max_concurrent: int | None = None
    # WebRTC sessions at once (agents + UI); more -> 503. None: the engine's batch (at least MIN_CONCURRENT), so
    # every session can speak at once; a fixed 8 refused half of 16 agents on an H200 that steps 64
    max_sessions: int | None = None
    session_time_limit_s: int = 900           # how long a WebRTC connection may stay open
    # an answered offer whose peer has not connected (ICE + DTLS) by then is closed and frees its slot; fastrtc's
    # own limit is a fixed 30 s, so a peer gone mid-handshake held a session slot that long
    session_connect_timeout_s: float = 10.0
    max_upload_bytes: int = 20 * 1024 * 1024  # reference clip upload; larger -> 413
    max_new_tokens: int | None = None         # default frame cap per request (12.5 frames = 1 s); None: stage config
    max_request_new_tokens: int = 8192        # largest `max_new_tokens` a request may ask for
    preroll_s: float = 0.0                    # audio held back before WebRTC playback starts (slow machines)
    max_buffered_s: float = 30.0              # audio a streaming client may fall behind before its request stops
    drain_s: float = 30.0                     # on SIGTERM: how long running streams may take to finish
    # other voice names (OpenAI's alloy, nova, ...) -> library voices or preset speakers; env TTS_VOICE_ALIASES
    voice_aliases: dict[str, str] = field(default_factory=aliases_from_env)
    ws_max_contexts: int = 5                  # contexts open at once on one /v1/audio/speech/stream socket
    ws_max_message_bytes: int = 64 * 1024     # largest client message on the socket; larger -> error event

    @property
    def max_body_bytes(self) -> int:
        """Largest request body any route reads (an upload plus its form fields)."""
        return self.max_upload_bytes + 1024 * 1024

    def concurrency_limit(self, engine_batch: int) -> int:
        """`max_concurrent`, or when unset the engine's batch (at least MIN_CONCURRENT)."""
        return _limit(self.max_concurrent, engine_batch)

    def session_limit(self, engine_batch: int) -> int:
        """`max_sessions`, or when unset the engine's batch (at least MIN_CONCURRENT)."""
        return _limit(self.max_sessions, engine_batch)


def _limit(configured: int | None, engine_batch: int) -> int:
    if configured is not None:
        return max(1, int(configured))
    return max(MIN_CONCURRENT, int(engine_batch))
