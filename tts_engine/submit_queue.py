"""How `TTSEngine.generate`'s requests reach the engine's submit (validation, the prompt's build, both stages told).

By default one thread of the engine's own takes every request waiting at once and submits them together, so a
burst's prompts are built in one `PromptBuilder.build_many` (BENCHMARKS.md, fifteenth pass: closed 64 first chunk
p95 128-189 vs 174-228 ms with a submit a request on the event loop's executor). The other ways stay as switches for
the bench: one request at a time on a pool of the engine's own (`threads`), or on the loop's executor (None).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from tts_engine.models.qwen3_tts.prompt import PromptInputs
    from tts_engine.request import SpeechRequest, VoicePrompt
    from tts_engine.stages.route import Route


@dataclasses.dataclass
class Submission:
    """One request to submit: what `TTSEngine._submit_many` takes. `prepared`: its `_prompt_inputs`, made already (a
    voice cloned from `ref_audio` on another thread)."""

    request: "SpeechRequest"
    deliver: Callable[[object], None]
    request_id: str | None = None
    prepared: "tuple[PromptInputs, VoicePrompt | None] | None" = None


# submits requests that arrived together: for each, in order, (route, voice) or the exception that stopped it
SubmitMany = Callable[[list[Submission]], list]


@dataclasses.dataclass
class _Waiting:
    """A submission waiting for a submit thread, its caller's future and the flag the caller sets on giving up."""

    submission: Submission
    future: Future
    abandoned: threading.Event


class SubmitQueue:
    def __init__(self, submit_many: SubmitMany, abort: Callable[[str], None], threads: int | None = 1,
                 batched: bool = True):
        self.submit_many = submit_many
        self._abort = abort
        self._pool: ThreadPoolExecutor | None = None
        self._waiting: list[_Waiting] = []
        self._lock = threading.Lock()
        self.threads = threads
        self.batched = batched

    @property
    def threads(self) -> int | None:
        """The engine's own submit threads (None: the event loop's default executor)."""
        return self._threads

    @threads.setter
    def threads(self, value: int | None) -> None:
        self._threads = value
        old, self._pool = self._pool, ThreadPoolExecutor(value, thread_name_prefix="tts-submit") if value else None
        if old is not None:
            old.shutdown(wait=False)     # the submits already on it still run

    @property
    def serial(self) -> bool:
        """Whether a request's submit can wait for another's (a pool of the engine's own, or batches): a request that
        clones its voice from an uploaded clip is then cloned first, elsewhere, so no other submit waits for a clone."""
        return self.threads is not None or self.batched

    @property
    def waiting(self) -> int:
        """Submissions waiting for a submit thread (batched)."""
        return len(self._waiting)

    async def submit(self, submission: Submission, abandoned: threading.Event) -> "Route":
        """Submit on a submit thread and return the request's route. A caller that gives up meanwhile sets `abandoned`
        and aborts the request itself: then either its abort finds the route, or the submit thread sees the flag after
        registering it and aborts."""
        loop = asyncio.get_running_loop()
        if not self.batched:
            return await loop.run_in_executor(self._pool, self._submit_one, submission, abandoned)
        waiting = _Waiting(submission, Future(), abandoned)
        with self._lock:
            self._waiting.append(waiting)
        try:
            loop.run_in_executor(self._pool, self._submit_waiting)
        except RuntimeError:                  # the pool shut down meanwhile (`threads` changed)
            if waiting.future.cancel():       # still waiting: nobody will submit it
                raise
        return await asyncio.wrap_future(waiting.future)

    def close(self) -> None:
        """Let the threads end once the submits they hold are done."""
        self.threads = None

    def _submit_one(self, submission: Submission, abandoned: threading.Event) -> "Route":
        result = self.submit_many([submission])[0]
        if isinstance(result, BaseException):
            raise result
        route, _ = result
        if abandoned.is_set():
            self._abort(route.request_id)
        return route

    def _submit_waiting(self) -> None:
        """Take every submission waiting and submit them together. The thread that finds none waiting (another took
        its submission with theirs) returns at once."""
        with self._lock:
            taken, self._waiting = self._waiting, []
        live = [waiting for waiting in taken if waiting.future.set_running_or_notify_cancel()]
        if not live:
            return
        try:
            results = self.submit_many([waiting.submission for waiting in live])
        except BaseException as exc:          # nothing may be left waiting forever
            results = [exc] * len(live)
        for waiting, result in zip(live, results):
            if isinstance(result, BaseException):
                waiting.future.set_exception(result)
                continue
            route, _ = result
            if waiting.abandoned.is_set():
                self._abort(route.request_id)
            waiting.future.set_result(route)
