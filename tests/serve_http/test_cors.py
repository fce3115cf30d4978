"""CORS options of mlx-serve-http (``cors``): llama-server's --cors-methods / --cors-headers / --cors-credentials."""

from __future__ import annotations

import pytest

from .conftest import Gateway

PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "Authorization"}
COMPLETION = {"prompt": "Once upon a time", "n_predict": 2}


@pytest.fixture(scope="module")
def llama_cors_gateway(stories_endpoint):
    """The CORS llama-server has by default (what scripts/llama_server_compat.py passes)."""
    gateway = Gateway(
        [stories_endpoint],
        "--cors-origins",
        "*",
        "--cors-credentials",
        "--cors-methods",
        "GET, POST, DELETE, OPTIONS",
        "--cors-headers",
        "*",
        "--api-key",
        "secret",
    )
    yield gateway
    gateway.stop()


def test_preflight_with_credentials_echoes_the_origin(llama_cors_gateway):
    answer = llama_cors_gateway.client.options("/completions", headers={"Origin": "web.mydomain.fr", **PREFLIGHT})
    assert answer.status_code == 200  # without the API key: browsers send none on a preflight
    assert answer.headers["Access-Control-Allow-Origin"] == "web.mydomain.fr"
    assert answer.headers["Access-Control-Allow-Credentials"] == "true"
    assert answer.headers["Access-Control-Allow-Methods"] == "GET, POST, DELETE, OPTIONS"
    assert answer.headers["Access-Control-Allow-Headers"] == "*"
    # names as llama-server writes them, for clients that read them case-sensitively
    assert b"Access-Control-Allow-Origin" in [name for name, _ in answer.headers.raw]


def test_replies_carry_the_echoed_origin_errors_too(llama_cors_gateway):
    origin = {"Origin": "http://app.example"}
    refused = llama_cors_gateway.client.post("/completion", json=COMPLETION, headers=origin)
    assert refused.status_code == 401  # the browser can read why
    assert refused.headers["Access-Control-Allow-Origin"] == "http://app.example"
    answer = llama_cors_gateway.client.post(
        "/completion", json=COMPLETION, headers={**origin, "Authorization": "Bearer secret"}
    )
    assert answer.status_code == 200
    assert answer.headers["Access-Control-Allow-Origin"] == "http://app.example"
    assert answer.headers["Access-Control-Allow-Credentials"] == "true"
    assert "Origin" in answer.headers["Vary"]


def test_default_cors_is_strict(stories_endpoint):
    gateway = Gateway([stories_endpoint], "--cors-origins", "http://app.example")
    try:
        allowed = gateway.client.options("/completions", headers={"Origin": "http://app.example", **PREFLIGHT})
        assert allowed.status_code == 200
        assert allowed.headers["Access-Control-Allow-Origin"] == "http://app.example"
        assert allowed.headers["Access-Control-Allow-Credentials"] == "false"
        assert allowed.headers["Access-Control-Allow-Methods"] == "GET, POST, DELETE"
        other_method = gateway.client.options(
            "/completions",
            headers={"Origin": "http://app.example", "Access-Control-Request-Method": "PUT"},
        )
        assert other_method.status_code == 400 and "Access-Control-Allow-Origin" not in other_method.headers
        other_header = gateway.client.options(
            "/completions",
            headers={**PREFLIGHT, "Origin": "http://app.example", "Access-Control-Request-Headers": "X-Secret"},
        )
        assert other_header.status_code == 400
        foreign = gateway.client.options("/completions", headers={"Origin": "http://evil.example", **PREFLIGHT})
        assert foreign.status_code == 400 and "Access-Control-Allow-Origin" not in foreign.headers
        any_origin = Gateway([stories_endpoint], "--cors-origins", "*")
        try:
            reply = any_origin.client.get("/health", headers={"Origin": "http://app.example"})
            assert reply.headers["Access-Control-Allow-Origin"] == "*"  # no credentials: no echo
            assert "Access-Control-Allow-Credentials" not in reply.headers
        finally:
            any_origin.stop()
    finally:
        gateway.stop()
