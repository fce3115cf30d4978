"""Limits are enforced with clear 4xx errors and leave the server healthy."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from mlxd_protocol import Generate, ProtocolError, encode
from tests.daemon.conftest import STORIES, private_endpoint, start_daemon, stop_daemon
from tests.serve_http.conftest import Gateway

pytestmark = pytest.mark.skipif(not STORIES.is_dir(), reason=f"{STORIES} is not present")


@pytest.fixture()
def limited_gateway():
    endpoint = private_endpoint("l")
    daemon = start_daemon(endpoint, "-m", str(STORIES), "--max-batch", "4")
    gateway = Gateway([endpoint], "--max-requests-per-client", "2")
    yield gateway
    gateway.stop()
    stop_daemon(daemon, endpoint)


def test_protocol_refuses_too_many_or_too_long_stop_strings():
    with pytest.raises(ProtocolError, match="at most 64"):
        encode(Generate(id="a", prompt="x", stop=["s"] * 65))
    with pytest.raises(ProtocolError, match="at most 1024 characters"):
        encode(Generate(id="a", prompt="x", stop=["s" * 1025]))


def test_gateway_limits(limited_gateway):
    url = limited_gateway.url
    with httpx.Client(base_url=url, timeout=60) as client:
        cases = [
            ({"prompt": "Once", "max_tokens": 4, "stop": ["s"] * 65}, 400),
            ({"prompt": "Once", "max_tokens": 4, "stop": ["s" * 1025]}, 400),
            ({"prompt": "Once " * 2000, "max_tokens": 4}, 400),  # longer than the 512-token context
            ({"prompt": "Once", "max_tokens": 0}, 400),
            ({"prompt": "Once", "max_tokens": 10**9}, 400),
        ]
        for body, status in cases:
            reply = client.post("/v1/completions", json=body)
            assert reply.status_code == status, (body, reply.text)
            assert "error" in reply.json()
        big = client.post(
            "/v1/completions", content=b"{" + b" " * (9 * 2**20) + b"}", headers={"content-type": "application/json"}
        )
        assert big.status_code == 413

    async def three_streams():
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            body = {"prompt": "Once upon a time", "max_tokens": 200, "stream": True}
            async with (
                client.stream("POST", "/v1/completions", json=body) as first,
                client.stream("POST", "/v1/completions", json=body) as second,
            ):
                assert first.status_code == 200 and second.status_code == 200
                third = await client.post("/v1/completions", json={"prompt": "Once", "max_tokens": 2})
                return third

    third = asyncio.run(three_streams())
    assert third.status_code == 429 and "requests in flight" in third.json()["error"]["message"]
    with httpx.Client(base_url=url, timeout=30) as client:
        assert client.get("/health").status_code == 200
        assert client.post("/v1/completions", json={"prompt": "Once", "max_tokens": 2}).status_code == 200
