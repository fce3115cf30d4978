"""llama-server's /cors-proxy (``--ui-mcp-proxy``): off by default (403); on, a GET or POST forwarded to a
real HTTP server here with only the headers the client names, URLs it cannot forward refused with 400."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from .conftest import Gateway

KEY = "sk-proxy"
AUTH = {"Authorization": f"Bearer {KEY}"}


class Capture(BaseHTTPRequestHandler):
    """Records each request (method, path, headers, body) and answers 201 with a JSON body."""

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.server.seen.append((self.command, self.path, dict(self.headers), self.rfile.read(length)))  # type: ignore[attr-defined]
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Set-Cookie", "target=1")
        self.end_headers()
        self.wfile.write(b'{"ok": true}')

    do_GET = do_POST = _answer

    def log_message(self, format, *args) -> None:
        pass


@pytest.fixture(scope="module")
def target():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Capture)
    server.seen = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def proxy_gateway(stories_endpoint):
    gateway = Gateway([stories_endpoint], "--api-key", KEY, "--ui-mcp-proxy")
    yield gateway
    gateway.stop()


def test_proxy_forwards_only_the_named_headers(proxy_gateway, target):
    url = f"http://127.0.0.1:{target.server_port}/mcp?x=1"
    headers = {
        **AUTH,
        "Cookie": "session=secret",
        "Proxy-Authorization": "Basic secret",
        "x-llama-server-proxy-header-accept": "application/json",
        "x-llama-server-proxy-header-authorization": "Bearer explicit",
    }
    answer = proxy_gateway.client.get("/cors-proxy", params={"url": url}, headers=headers)
    assert answer.status_code == 201 and answer.json() == {"ok": True}
    assert answer.headers["content-type"] == "application/json" and "set-cookie" not in answer.headers
    method, path, seen, _ = target.seen[-1]
    seen = {name.lower(): value for name, value in seen.items()}
    assert (method, path) == ("GET", "/mcp?x=1")
    assert seen["accept"] == "application/json" and seen["authorization"] == "Bearer explicit"
    assert (
        "cookie" not in seen and "proxy-authorization" not in seen and "x-llama-server-proxy-header-accept" not in seen
    )
    posted = proxy_gateway.client.post(
        "/cors-proxy", params={"url": url}, headers={**AUTH, "content-type": "application/json"}, content=b'{"a": 1}'
    )
    assert posted.status_code == 201 and target.seen[-1][0] == "POST" and target.seen[-1][3] == b'{"a": 1}'
    assert target.seen[-1][2].get("Authorization") is None  # the gateway's own API key is never forwarded


def test_proxy_needs_the_api_key_and_a_url_it_can_forward(proxy_gateway, target):
    url = f"http://127.0.0.1:{target.server_port}/"
    assert proxy_gateway.client.get("/cors-proxy", params={"url": url}).status_code == 401
    for bad in ("", "file:///etc/passwd", "ftp://127.0.0.1/", "http://", f"http://u:p@127.0.0.1:{target.server_port}/"):
        answer = proxy_gateway.client.get("/cors-proxy", params={"url": bad}, headers=AUTH)
        assert answer.status_code == 400 and answer.json()["error"]["param"] == "url", bad
    closed = proxy_gateway.client.get("/cors-proxy", params={"url": "http://127.0.0.1:9/"}, headers=AUTH)
    assert closed.status_code == 502 and "reached" in closed.json()["error"]["message"]


def test_proxy_is_off_by_default(stories_gateway, target):
    url = f"http://127.0.0.1:{target.server_port}/"
    for method in ("GET", "POST"):
        answer = stories_gateway.client.request(method, "/cors-proxy", params={"url": url})
        assert answer.status_code == 403 and answer.json()["error"]["type"] == "feature_disabled"
    assert stories_gateway.client.get("/props").json()["cors_proxy_enabled"] is False
