"""The whole app's routes (API + fastrtc + the Gradio UI at `/`) against the live `--demo` app: every 4xx
has the one error shape, including paths only the UI would answer; liveness and readiness probes."""

from __future__ import annotations

import httpx
import pytest


@pytest.mark.parametrize("method, path", [("GET", "/nope"), ("GET", "/v1/nope"), ("POST", "/v1/audio/nope"),
                                          ("DELETE", "/v1/audio/speech"), ("POST", "/healthz")])
def test_unknown_routes_answer_in_the_one_shape(live_app, method, path):
    r = httpx.request(method, live_app + path, timeout=30)
    assert r.status_code in (404, 405), r.text
    body = r.json()
    assert set(body) == {"error"} and body["error"]["code"] in ("route_not_found", "method_not_allowed"), body
    assert body["error"]["type"] == "invalid_request_error"


def test_probes(live_app):
    health = httpx.get(live_app + "/healthz", timeout=30).json()
    assert health["status"] == "ok" and health["stage0"] and health["stage1"]
    assert httpx.get(live_app + "/readyz", timeout=30).json() == {"status": "ready"}
    assert httpx.get(live_app + "/", timeout=30).status_code == 200   # the UI is still served
