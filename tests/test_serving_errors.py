"""One error shape: every code has one status, engine errors are told apart by type (not message text),
and routes that do not exist answer in the same shape. No engine needed: a stub stands in for it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from tts_engine.request import EngineClosed, PromptTooLong, RequestAborted, RequestError, StreamFailed, resolve_language
from tts_engine.serving.errors import STATUS, ApiError, translate
from tts_engine.serving.server import build_api
from tts_engine.serving.voice_library import UnknownVoiceError, VoiceNotFoundError

LANGUAGES = ["auto", "english", "chinese", "german"]


def _shape(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["code"] == code, body
    assert body["error"]["type"] == ("server_error" if status >= 500 else "invalid_request_error")
    return body["error"]


def test_every_code_has_one_status_and_unknown_codes_are_refused():
    assert all(isinstance(status, int) and 400 <= status < 600 for status in STATUS.values())
    with pytest.raises(ValueError, match="unknown error code"):
        ApiError("made_up", "nope")
    busy = ApiError("server_busy", "busy")
    assert busy.status == 503 and busy.headers["Retry-After"]


@pytest.mark.parametrize("exc, status, code", [
    (PromptTooLong("text is too long"), 400, "input_too_long"),
    (RequestError("bad"), 400, "invalid_request"),
    (StreamFailed("prompt leaves no room under max_model_len"), 500, "synthesis_failed"),  # text is not matched
    (RequestAborted("request x was aborted"), 500, "synthesis_failed"),
    (EngineClosed("closed"), 503, "engine_unavailable"),
    (UnknownVoiceError("unknown voice 'x'"), 400, "unknown_voice"),
    (VoiceNotFoundError("no voice 'x'"), 404, "voice_not_found"),
    (KeyError("boom"), 500, "internal_error"),
])
def test_typed_errors_translate_by_type(exc, status, code):
    error = translate(exc)
    assert (error.status, error.code) == (status, code)


def test_one_language_resolver():
    assert resolve_language(None, LANGUAGES) == "auto" and resolve_language(" EN ", LANGUAGES) == "english"
    assert resolve_language("German", LANGUAGES) == "german" and resolve_language("zh", LANGUAGES) == "chinese"
    with pytest.raises(RequestError, match="unsupported language 'klingon'") as info:
        resolve_language("klingon", LANGUAGES)
    assert translate(info.value).code == "unsupported_language"


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    from tts_engine.serving.voice_library import VoiceLibrary

    config = SimpleNamespace(model_type="base", model_size="0b6", supported_languages=LANGUAGES,
                             supported_speakers=[], supports_instruct=False, speaker_encoder={"enc_dim": 8},
                             talker=SimpleNamespace(shape=SimpleNamespace(hidden_size=8), speakers={},
                                                    speaker_dialect={}))
    library = VoiceLibrary(tmp_path_factory.mktemp("voices"), config)
    return TestClient(build_api(SimpleNamespace(config=config), library))


def test_realtime_routes_answer_in_the_one_shape(client):
    r = client.post("/v1/realtime/say", content=b"{not json", headers={"content-type": "application/json"})
    _shape(r, 400, "invalid_json")                               # was FastAPI's 422 {"detail": [...]}
    assert _shape(client.post("/v1/realtime/say", json={"text": "hi"}), 400, "missing_field")["param"] == "webrtc_id"
    _shape(client.post("/v1/realtime/say", json={"webrtc_id": "nope", "text": "hi"}), 404, "unknown_session")
    _shape(client.post("/v1/realtime/interrupt", json={}), 400, "missing_field")
    _shape(client.get("/v1/realtime/stats/nope"), 404, "unknown_session")


def test_unknown_routes_and_methods_answer_in_the_one_shape(client):
    _shape(client.get("/v1/no/such/route"), 404, "route_not_found")
    _shape(client.put("/v1/audio/speech", json={}), 405, "method_not_allowed")


def test_unknown_voice_is_the_same_mistake_on_every_route(client):
    r = client.post("/v1/audio/speech", json={"input": "hi", "voice": "nobody"})
    assert _shape(r, 400, "unknown_voice")["param"] == "voice"
    _shape(client.get("/v1/audio/voices/nobody"), 404, "voice_not_found")


def test_concurrency_limit_follows_the_engine_batch_unless_set():
    """Unset, the HTTP limit is what the engine steps at once (64 on a GPU config), never under 8; set, it
    is the operator's number. A fixed 8 turned 120 of 128 streams away with 503 on an H200."""
    from types import SimpleNamespace

    from tts_engine.serving.errors import ApiError, Slots
    from tts_engine.serving.server import engine_batch
    from tts_engine.serving.settings import MIN_CONCURRENT, ServingSettings

    gpu_engine = SimpleNamespace(settings=SimpleNamespace(talker=SimpleNamespace(max_num_seqs=64)))
    assert engine_batch(gpu_engine) == 64 and engine_batch(object()) == 0
    assert ServingSettings().concurrency_limit(64) == 64
    assert ServingSettings().concurrency_limit(2) == MIN_CONCURRENT
    assert ServingSettings(max_concurrent=3).concurrency_limit(64) == 3
    assert ServingSettings().session_limit(64) == 64          # WebRTC sessions follow the batch as well
    assert ServingSettings().session_limit(0) == MIN_CONCURRENT
    assert ServingSettings(max_sessions=3).session_limit(64) == 3
    slots = Slots(ServingSettings(), engine_batch=64)
    for _ in range(64):
        slots.acquire()
    with pytest.raises(ApiError) as busy:
        slots.acquire()
    assert busy.value.code == "server_busy" and "limit 64" in str(busy.value)
