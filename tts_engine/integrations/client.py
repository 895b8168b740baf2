"""A client of the speech WebSocket (`/v1/audio/speech/stream`): one socket, many contexts.

    client = SpeechStreamClient("ws://127.0.0.1:7860/v1/audio/speech/stream")
    await client.start("turn-1", voice="alice", response_format="pcm", sample_rate=16000)
    await client.text("turn-1", "Hello there. ")
    await client.end("turn-1")
    async for event in client.events("turn-1"):      # audio events, then done (or an error)
        ...

Events are routed by `context_id` to one queue per context (or to `on_event`, when given, for every event:
the Pipecat adapter's style). Error events without a context (a malformed message) go to `on_event` or
are logged. The protocol is documented in the README.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

log = logging.getLogger(__name__)

EventHandler = Callable[[dict], Awaitable[None]]


class SpeechStreamError(RuntimeError):
    """An error event of the socket (`code` as in the server's error table)."""

    def __init__(self, event: dict):
        super().__init__(f"{event.get('code')}: {event.get('message')}")
        self.code, self.event = event.get("code"), event


def audio_bytes(event: dict) -> bytes:
    return base64.b64decode(event["audio"])


class SpeechStreamClient:
    def __init__(self, url: str, on_event: EventHandler | None = None, open_timeout: float = 10.0):
        self.url, self.on_event, self.open_timeout = url, on_event, open_timeout
        self._ws = None
        self._reader: asyncio.Task | None = None
        self._queues: dict[str, asyncio.Queue] = {}
        self._lock = asyncio.Lock()

    @property
    def connected(self) -> bool:
        return self._ws is not None and self._reader is not None and not self._reader.done()

    async def connect(self) -> None:
        async with self._lock:
            if self.connected:
                return
            from websockets.asyncio.client import connect

            self._ws = await connect(self.url, open_timeout=self.open_timeout, max_size=None)
            self._reader = asyncio.get_running_loop().create_task(self._read())

    async def close(self) -> None:
        reader, ws = self._reader, self._ws
        self._reader = self._ws = None
        if ws is not None:
            await ws.close()
        if reader is not None:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    # ---- messages --------------------------------------------------------------------------------
    async def start(self, context_id: str, *, voice: str | None = None, language: str = "auto",
                    instructions: str | None = None, response_format: str = "pcm", sample_rate: int | None = None,
                    **extra) -> None:
        self._queues[context_id] = asyncio.Queue()
        message = {"type": "start", "context_id": context_id, "voice": voice, "language": language,
                   "instructions": instructions, "response_format": response_format, "sample_rate": sample_rate,
                   **extra}
        await self._send({k: v for k, v in message.items() if v is not None})

    async def text(self, context_id: str, text: str) -> None:
        await self._send({"type": "text", "context_id": context_id, "text": text})

    async def flush(self, context_id: str) -> None:
        await self._send({"type": "flush", "context_id": context_id})

    async def end(self, context_id: str) -> None:
        await self._send({"type": "end", "context_id": context_id})

    async def cancel(self, context_id: str) -> None:
        await self._send({"type": "cancel", "context_id": context_id})

    async def events(self, context_id: str) -> AsyncIterator[dict]:
        """A context's events up to its `done`; an error event raises `SpeechStreamError`."""
        queue = self._queues.setdefault(context_id, asyncio.Queue())
        try:
            while True:
                event = await queue.get()
                if event is None:
                    raise ConnectionError("the speech socket closed")
                if event["type"] == "error":
                    raise SpeechStreamError(event)
                yield event
                if event["type"] == "done":
                    return
        finally:
            self._queues.pop(context_id, None)

    async def _send(self, message: dict) -> None:
        await self.connect()
        await self._ws.send(json.dumps(message))

    async def _read(self) -> None:
        try:
            async for raw in self._ws:
                event = json.loads(raw)
                if self.on_event is not None:
                    await self.on_event(event)
                    continue
                queue = self._queues.get(event.get("context_id", ""))
                if queue is not None:
                    queue.put_nowait(event)
                elif event.get("type") == "error":
                    log.warning("speech socket error: %s", event)
        except Exception as exc:  # noqa: BLE001 -- the socket closed: every waiting context hears it
            log.info("speech socket closed: %s", exc)
        finally:
            for queue in self._queues.values():
                queue.put_nowait(None)
