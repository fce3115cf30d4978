"""Hostile HTTP input at the gateway, on the embedded model: what used to be a 500 is a 400 with a JSON error;
no body names an exception, a file or a socket; Host, Origin, CORS and Content-Type are checked; clients
that trickle headers or a body are cut off."""

from __future__ import annotations

import json
import re
import socket
import time

import pytest

from mlxd_cli.serve_http.errors import INTERNAL_MESSAGE, from_daemon_failure
from mlxd_protocol import INTERNAL, DaemonError
from tests.daemon.conftest import private_endpoint, start_daemon, stop_daemon
from tests.serve_http.conftest import EMBEDDED, Gateway

pytestmark = pytest.mark.skipif(not (EMBEDDED / "config.json").is_file(), reason="the embedded model is not there")

ALLOWED_ORIGIN = "http://app.example"
TIMEOUT_S = 1.0  # the test gateway's --header-timeout and --body-timeout
CUT_OFF_WITHIN_S = 3.0
EXCEPTION_NAME = re.compile(r"\b\w*(Error|Exception)\b|Traceback")
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def daemon_endpoint():
    endpoint = private_endpoint("hh")
    daemon = start_daemon(endpoint, "-m", str(EMBEDDED), "--max-batch", "4")
    yield endpoint
    stop_daemon(daemon, endpoint)


@pytest.fixture(scope="module")
def gateway(daemon_endpoint):
    gateway = Gateway(
        [daemon_endpoint],
        "--cors-origins",
        ALLOWED_ORIGIN,
        "--allowed-hosts",
        "gateway.example",
        "--header-timeout",
        str(TIMEOUT_S),
        "--body-timeout",
        str(TIMEOUT_S),
    )
    yield gateway
    gateway.stop()


def post_raw(gateway: Gateway, path: str, text: str, **headers: str):
    """POST JSON text as written (``\\ud800`` escapes and huge integers survive)."""
    return gateway.client.post(path, content=text.encode(), headers={"content-type": "application/json", **headers})


def assert_clean_error(response, status: int, endpoint: str = "") -> dict:
    assert response.status_code == status, response.text[:300]
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "code"}
    assert not EXCEPTION_NAME.search(error["message"]), error
    assert "ipc://" not in response.text and "/tmp/" not in response.text and str(EMBEDDED) not in response.text
    if endpoint:
        assert endpoint.removeprefix("ipc://") not in response.text
    return error


DEEP_ARGUMENTS = "[" * 5000 + "]" * 5000
HUGE = 2**64
# (name, path, raw JSON body): each used to answer 500.
USED_TO_BE_500 = [
    ("surrogate in prompt", "/v1/completions", '{"prompt": "a\\ud800", "max_tokens": 2}'),
    ("surrogate in /completion", "/completion", '{"prompt": "\\udfff", "n_predict": 2}'),
    (
        "surrogate in chat",
        "/v1/chat/completions",
        '{"messages": [{"role": "user", "content": "\\ud800"}], "max_tokens": 2}',
    ),
    ("surrogate in tokenize", "/tokenize", '{"content": "\\ud800"}'),
    ("surrogate in a key", "/tokenize", '{"content": "a", "\\ud800": 1}'),
    ("seed 2^64", "/v1/completions", f'{{"prompt": "a", "max_tokens": 2, "seed": {HUGE}}}'),
    ("top_k 2^64", "/completion", f'{{"prompt": "a", "n_predict": 2, "top_k": {HUGE}}}'),
    ("token id 2^64", "/v1/completions", f'{{"prompt": [{HUGE}], "max_tokens": 2}}'),
    ("token id 2^64 on /completion", "/completion", f'{{"prompt": [1, {HUGE}], "n_predict": 2}}'),
    ("logit_bias key 2^64", "/v1/completions", f'{{"prompt": "a", "max_tokens": 2, "logit_bias": {{"{HUGE}": 1}}}}'),
    ("logit_bias key superscript two", "/v1/chat/completions", json.dumps({**CHAT, "logit_bias": {"\u00b2": 1}})),
    ("detokenize 2^64", "/detokenize", f'{{"tokens": [{HUGE}]}}'),
    ("detokenize 2^63", "/detokenize", f'{{"tokens": [{2**63}]}}'),
    (
        "tool_calls arguments 5,000 deep",
        "/v1/chat/completions",
        json.dumps(
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": DEEP_ARGUMENTS}}
                        ],
                    },
                    {"role": "user", "content": "hi"},
                ],
                "max_tokens": 2,
            }
        ),
    ),
    ("body 5,000 deep", "/v1/completions", '{"prompt": "a", "extra": ' + "[" * 5000 + "]" * 5000 + "}"),
    ("NaN", "/v1/completions", '{"prompt": "a", "max_tokens": 2, "temperature": NaN}'),
]


@pytest.mark.parametrize("name, path, text", USED_TO_BE_500, ids=[case[0] for case in USED_TO_BE_500])
def test_inputs_that_used_to_be_500_are_400_json(gateway, daemon_endpoint, name, path, text):
    assert_clean_error(post_raw(gateway, path, text), 400, daemon_endpoint)


def test_the_gateway_still_serves_after_the_hostile_inputs(gateway):
    answer = gateway.client.post("/v1/chat/completions", json=CHAT)
    assert answer.status_code == 200 and gateway.client.get("/health").status_code == 200


def test_an_unknown_field_outside_latin1_is_named_safely_in_the_header(gateway):
    answer = gateway.client.post(
        "/v1/completions", json={"prompt": "a", "max_tokens": 2, "\u4e2d\u6587": 1, "x\r\nSet-Cookie: a=b": 2}
    )
    assert answer.status_code == 200, answer.text
    header = answer.headers["x-mlxd-ignored-fields"]
    assert header.isascii() and "%E4%B8%AD%E6%96%87" in header and "\r" not in header
    assert "set-cookie" not in answer.headers


def test_model_is_the_checkpoint_name_never_a_path(gateway):
    name = EMBEDDED.name
    assert gateway.client.post("/v1/completions", json={"prompt": "a", "max_tokens": 2}).json()["model"] == name
    assert gateway.client.post("/v1/chat/completions", json=CHAT).json()["model"] == name
    assert gateway.client.post("/completion", json={"prompt": "a", "n_predict": 2}).json()["model"] == name
    assert [card["id"] for card in gateway.client.get("/v1/models").json()["data"]] == [name]
    with gateway.client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as stream:
        chunks = [json.loads(line[6:]) for line in stream.iter_lines() if line.startswith("data: {")]
    assert chunks and {chunk["model"] for chunk in chunks} == {name}


def test_alias_names_the_model(daemon_endpoint):
    aliased = Gateway([daemon_endpoint], "--alias", "tiny-chat")
    try:
        assert aliased.client.post("/v1/chat/completions", json=CHAT).json()["model"] == "tiny-chat"
        assert aliased.client.get("/v1/models").json()["data"][0]["id"] == "tiny-chat"
    finally:
        aliased.stop()


def test_500_bodies_are_generic():
    failure = DaemonError(INTERNAL, 'Traceback (most recent call last): File "/home/u/x.py" ValueError: state 7')
    error = from_daemon_failure(failure)
    assert error.status == 500 and error.message == INTERNAL_MESSAGE
    assert from_daemon_failure(RuntimeError("/srv/secret/path boom")).message == INTERNAL_MESSAGE


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::1]", "gateway.example"])
def test_allowed_host_names_pass(gateway, host):
    assert gateway.client.get("/health", headers={"host": f"{host}:{gateway.port}"}).status_code == 200


@pytest.mark.parametrize("host", ["evil.example", "evil.example:80", "127.0.0.1.evil.example", "10.0.0.7"])
def test_other_host_names_are_refused(gateway, host):
    assert_clean_error(gateway.client.get("/health", headers={"host": host}), 400)
    assert_clean_error(gateway.client.post("/v1/chat/completions", json=CHAT, headers={"host": host}), 400)


def test_cors_only_for_the_allowed_origin(gateway):
    preflight = {"access-control-request-method": "POST", "access-control-request-headers": "content-type"}
    allowed = gateway.client.options("/v1/chat/completions", headers={"origin": ALLOWED_ORIGIN, **preflight})
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
    answer = gateway.client.post("/v1/chat/completions", json=CHAT, headers={"origin": ALLOWED_ORIGIN})
    assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
    foreign = gateway.client.options("/v1/chat/completions", headers={"origin": "http://evil.example", **preflight})
    assert "access-control-allow-origin" not in foreign.headers and foreign.status_code < 500
    # A simple request (no preflight) from a foreign page is refused before it reaches the daemon.
    simple = gateway.client.post("/v1/chat/completions", json=CHAT, headers={"origin": "http://evil.example"})
    assert_clean_error(simple, 403)
    assert "access-control-allow-origin" not in simple.headers


def test_no_cors_without_cors_origins(daemon_endpoint):
    plain = Gateway([daemon_endpoint])
    try:
        preflight = plain.client.options(
            "/v1/chat/completions", headers={"origin": "http://app.example", "access-control-request-method": "POST"}
        )
        assert "access-control-allow-origin" not in preflight.headers and preflight.status_code < 500
        assert_clean_error(
            plain.client.post("/v1/chat/completions", json=CHAT, headers={"origin": "http://app.example"}), 403
        )
        same_origin = plain.client.post("/v1/chat/completions", json=CHAT, headers={"origin": plain.url})
        assert same_origin.status_code == 200  # the gateway's own /docs page
    finally:
        plain.stop()


@pytest.mark.parametrize(
    "content_type", ["text/plain", "text/plain;charset=UTF-8", "multipart/form-data; boundary=x", "application/xml"]
)
def test_a_body_not_declared_json_is_415(gateway, content_type):
    answer = gateway.client.post(
        "/v1/chat/completions", content=json.dumps(CHAT), headers={"content-type": content_type}
    )
    assert_clean_error(answer, 415)


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json",
        "application/json; charset=utf-8",
        "application/vnd.api+json",
        "application/x-www-form-urlencoded",
        None,
    ],
)
def test_json_bodies_are_read(gateway, content_type):
    headers = {"content-type": content_type} if content_type else {}
    answer = gateway.client.post("/v1/chat/completions", content=json.dumps(CHAT), headers=headers)
    assert answer.status_code == 200, answer.text


def _trickle(sock: socket.socket, data: bytes, pause_s: float, limit_s: float) -> float | None:
    """Send ``data`` a byte at a time; seconds until the server closed the connection (None: it did not)."""
    start = time.monotonic()
    sock.settimeout(pause_s)
    for byte in data:
        try:
            sock.sendall(bytes([byte]))
            if sock.recv(65536) == b"":
                return time.monotonic() - start
        except TimeoutError:
            pass  # nothing to read yet: keep trickling
        except OSError:  # reset or broken pipe: closed
            return time.monotonic() - start
        if time.monotonic() - start > limit_s:
            return None
    return None


def test_a_client_trickling_headers_is_cut_off(gateway):
    request = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" * 10
    with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
        closed_after = _trickle(sock, request, 0.2, CUT_OFF_WITHIN_S + 2)
    assert closed_after is not None and closed_after < CUT_OFF_WITHIN_S, closed_after


def test_a_client_trickling_its_body_gets_408_and_is_cut_off(gateway):
    body = json.dumps(CHAT).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{gateway.port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
        sock.sendall(head)
        start = time.monotonic()
        received = b""
        sock.settimeout(0.2)
        for byte in body:
            try:
                sock.sendall(bytes([byte]))
                chunk = sock.recv(65536)
                received += chunk
                if not chunk or b"\r\n\r\n" in received and b"}}" in received:
                    break
            except TimeoutError:
                pass
            except OSError:
                break
            if time.monotonic() - start > CUT_OFF_WITHIN_S + 2:
                break
        elapsed = time.monotonic() - start
    assert received.startswith(b"HTTP/1.1 408"), received[:200]
    assert b'"request_timeout"' in received and elapsed < CUT_OFF_WITHIN_S


def test_a_kept_alive_connection_trickling_its_next_headers_is_cut_off(gateway):
    first = (f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{gateway.port}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
        sock.sendall(first)
        sock.settimeout(5)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        closed_after = _trickle(sock, b"GET /health HTTP/1.1\r\nX-Slow: " + b"a" * 200, 0.2, CUT_OFF_WITHIN_S + 2)
    assert closed_after is not None and closed_after < CUT_OFF_WITHIN_S, closed_after
