"""The one error shape of every route, the status of each kind of mistake, body limits and slots.

Every error the app answers is OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``,
and each `code` has exactly one HTTP status (`STATUS`): a mistake is answered the same way on every
route. Engine and library errors are told apart by type (`translate`), never by their message text.
"""

from __future__ import annotations

import logging
import threading

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from tts_engine.request import (
    ConsumerTooSlow,
    EngineClosed,
    PromptTooLong,
    RequestError,
    StreamFailed,
    UnsupportedLanguage,
)
from tts_engine.serving.metrics import count_error
from tts_engine.serving.voice_library import VoiceLibraryError

log = logging.getLogger(__name__)

# code -> HTTP status. A new kind of mistake gets a row here.
STATUS: dict[str, int] = {
    # 400: the request names something wrong (error.param says which field)
    "invalid_json": 400, "missing_body": 400, "missing_field": 400, "invalid_value": 400,
    "invalid_request": 400, "empty_input": 400, "input_too_long": 400, "unsupported_speed": 400,
    "unsupported_language": 400, "unsupported_response_format": 400, "unsupported_stream_format": 400,
    "unsupported_sample_rate": 400,
    "unknown_voice": 400, "voice_required": 400, "incompatible_voice": 400, "instructions_required": 400,
    "invalid_voice_name": 400, "invalid_voice_request": 400, "invalid_audio": 400, "audio_silent": 400,
    "audio_too_short": 400, "transcript_too_long": 400, "cloning_unsupported": 400,
    # the WebSocket stream's message mistakes (in-band error events; the status is their kind)
    "invalid_message": 400, "unknown_message_type": 400, "context_not_started": 400, "unknown_context": 404,
    "context_exists": 409, "context_ended": 409, "message_too_large": 413, "too_many_contexts": 429,
    # 404 / 405: the URL names nothing
    "voice_not_found": 404, "unknown_session": 404, "route_not_found": 404, "method_not_allowed": 405,
    "client_too_slow": 408,   # only in-band (SSE error event, socket error): the status line was sent already
    "voice_exists": 409, "file_too_large": 413,
    # 5xx
    "internal_error": 500, "synthesis_failed": 500, "encoding_failed": 500, "voice_damaged": 500,
    "server_busy": 503, "too_many_sessions": 503, "engine_unavailable": 503,
}
RETRY_AFTER_S = 2


class ApiError(Exception):
    """An error answered in the one shape; its status comes from its `code` (see `STATUS`)."""

    def __init__(self, code: str, message: str, param: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        if code not in STATUS:
            raise ValueError(f"unknown error code {code!r}: add it to serving.errors.STATUS")
        self.code, self.message, self.param = code, message, param
        self.status = STATUS[code]
        self.headers = dict(headers or {})
        if self.status == 503:
            self.headers.setdefault("Retry-After", str(RETRY_AFTER_S))

    def body(self) -> dict:
        kind = "server_error" if self.status >= 500 else "invalid_request_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        count_error(self.code)
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)

    def in_band(self) -> dict:
        """The body of an error reported inside a stream already answered (an SSE event), counted."""
        count_error(self.code)
        return self.body()


def translate(exc: BaseException) -> ApiError:
    """Any exception a route lets out -> the ApiError it is answered with (by type)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, RequestValidationError):
        return _validation_error(exc)
    if isinstance(exc, VoiceLibraryError):
        return ApiError(exc.code if exc.code in STATUS else "invalid_voice_request", str(exc), exc.param)
    if isinstance(exc, PromptTooLong):
        return ApiError("input_too_long", str(exc), "input")
    if isinstance(exc, UnsupportedLanguage):
        return ApiError("unsupported_language", str(exc), "language")
    if isinstance(exc, RequestError):
        return ApiError("invalid_request", str(exc), exc.param)
    if isinstance(exc, EngineClosed):
        return ApiError("engine_unavailable", f"the engine is not available: {exc}")
    if isinstance(exc, ConsumerTooSlow):
        return ApiError("client_too_slow", str(exc))
    if isinstance(exc, StreamFailed):
        return ApiError("synthesis_failed", f"synthesis failed: {exc}")
    if isinstance(exc, (HTTPException, StarletteHTTPException)):
        return _http_error(exc.status_code, str(exc.detail), getattr(exc, "headers", None))
    log.error("unexpected error", exc_info=exc)
    return ApiError("internal_error", f"internal error: {type(exc).__name__}: {exc}")


def _http_error(status: int, detail: str, headers: dict | None) -> ApiError:
    if status == 404:
        return ApiError("route_not_found", "no such route: see /docs for the API", headers=headers)
    if status == 405:
        return ApiError("method_not_allowed", "method not allowed on this route (see /docs)", headers=headers)
    if status == 413:
        return ApiError("file_too_large", detail, headers=headers)
    if status >= 500:
        return ApiError("internal_error", detail, headers=headers)
    return ApiError("invalid_request", detail, headers=headers)


def _validation_error(exc: RequestValidationError) -> ApiError:
    """Pydantic/FastAPI validation errors, answered 400 (as OpenAI and vLLM do), naming the field."""
    errors = list(exc.errors()) or [{"loc": (), "msg": "invalid request", "type": "invalid"}]
    parts, first_param, first_code = [], None, None
    for err in errors:
        loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path", "header", "cookie")]
        param = ".".join(loc) or None
        kind = err.get("type", "invalid")
        if kind == "json_invalid":
            message, param, code = f"request body is not valid JSON ({err.get('ctx', {}).get('error', '')})", None, \
                "invalid_json"
        elif kind == "missing" and param is None:
            message, code = "request body is missing", "missing_body"
        elif kind == "missing":
            message, code = f"{param} is required", "missing_field"
        elif kind in ("literal_error", "enum"):
            message = f"unsupported {param} {err.get('input')!r}: {err.get('msg', '')}"
            code = f"unsupported_{param}" if param in ("response_format", "stream_format") else "invalid_value"
        else:
            message, code = f"{param or 'request'}: {err.get('msg', 'invalid value')}", "invalid_value"
        parts.append(message)
        if first_code is None:
            first_param, first_code = param, code
    return ApiError(first_code, "; ".join(parts), param=first_param)


def route_class(max_body_bytes: int) -> type[APIRoute]:
    """Routes that answer their own errors in the one shape and refuse oversized bodies before
    reading them (so a router works the same in any host app)."""

    class ApiRoute(APIRoute):
        def get_route_handler(self):
            handler = super().get_route_handler()

            async def route(request: Request) -> Response:
                try:
                    request = await _limit_body(request, max_body_bytes)
                    return await handler(request)
                except Exception as exc:   # noqa: BLE001 -- every error leaves in the one shape
                    error = translate(exc)
                    if error.status >= 500:
                        log.error("%s %s failed: %s", request.method, request.url.path, error.message)
                    return error.response()

            return route

    return ApiRoute


def install_error_handlers(app: FastAPI) -> None:
    """The same shape for what no route of ours answers: unknown routes (404), wrong methods (405)."""

    async def handle(request: Request, exc: Exception) -> Response:
        return translate(exc).response()

    app.add_exception_handler(StarletteHTTPException, handle)
    app.add_exception_handler(RequestValidationError, handle)


async def _limit_body(request: Request, limit: int) -> Request:
    """413 for a body over `limit` bytes: at once from Content-Length, else while it is read. Bodies
    up to 4x the limit are read to the end first, so the client gets the 413 instead of a reset."""
    too_large = ApiError("file_too_large", f"request body is larger than {limit // (1024 * 1024)} MB")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        if int(declared) <= 4 * limit:
            await _drain(request.receive)
        raise too_large
    received = 0
    receive = request.receive

    async def limited_receive():
        nonlocal received
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > limit:
                if message.get("more_body", False):
                    await _drain(receive, 3 * limit)
                raise too_large
        return message

    return Request(request.scope, limited_receive, getattr(request, "_send", None) or _no_send)


async def _no_send(message) -> None:  # pragma: no cover - Request() needs a send callable
    raise RuntimeError("send is not available here")


async def _drain(receive, budget: int | None = None) -> None:
    read = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return
        read += len(message.get("body", b""))
        if not message.get("more_body", False) or (budget is not None and read > budget):
            return


class Slots:
    """Counts running synthesis/cloning requests against a limit read on every acquire (so it can be
    changed while serving); past it, 503 `server_busy` with Retry-After."""

    def __init__(self, settings, engine_batch: int = 0):
        self.settings = settings
        self.engine_batch = engine_batch      # what the engine steps at once: the default limit
        self.active = 0
        self._lock = threading.Lock()

    def acquire(self) -> None:
        with self._lock:
            limit = self.settings.concurrency_limit(self.engine_batch)
            if self.active >= limit:
                raise ApiError("server_busy", f"the server is busy ({self.active} requests running, limit {limit}); "
                                              "retry shortly")
            self.active += 1

    def release(self) -> None:
        with self._lock:
            self.active = max(0, self.active - 1)


class OneShapeMiddleware:
    """Rewrites the `{"detail": ...}` 4xx bodies of apps mounted beside ours (the Gradio UI at `/` answers
    unknown paths itself) into the one error shape, so every 4xx of the process looks the same."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start: dict | None = None
        body = b""

        async def send_wrapper(message):
            nonlocal start, body
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers") or [])
                json_body = headers.get(b"content-type", b"").startswith(b"application/json")
                if 400 <= message["status"] < 500 and json_body:
                    start = message     # hold it until the body shows whether it is the foreign shape
                    return
            elif message["type"] == "http.response.body" and start is not None:
                body += message.get("body", b"")
                if message.get("more_body", False):
                    return
                body = _reshaped(start["status"], body)
                headers = [(k, v) for k, v in start.get("headers") or [] if k.lower() != b"content-length"]
                headers.append((b"content-length", str(len(body)).encode()))
                await send({**start, "headers": headers})
                start = None
                return await send({"type": "http.response.body", "body": body})
            await send(message)

        await self.app(scope, receive, send_wrapper)


def _reshaped(status: int, body: bytes) -> bytes:
    import json

    try:
        data = json.loads(body)
    except ValueError:
        return body
    if not isinstance(data, dict) or "error" in data or set(data) != {"detail"}:
        return body
    detail = data["detail"] if isinstance(data["detail"], str) else json.dumps(data["detail"])
    error = _http_error(status, detail, None)
    return json.dumps(error.in_band()).encode()
