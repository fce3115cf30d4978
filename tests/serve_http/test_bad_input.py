"""Malformed requests get 4xx in OpenAI's error shape and leave the gateway and the daemon healthy;
--api-key, --max-body-bytes and --max-concurrency; a daemon's "overloaded" becomes 429."""

from __future__ import annotations

import json
import threading
import time

import pytest

from mlxd_protocol import Client

from ..daemon.conftest import STORIES, private_endpoint, start_daemon, stop_daemon
from .conftest import Gateway

OK_COMPLETION = {"prompt": "Once upon a time", "max_tokens": 4}
OK_CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
OK_LLAMA = {"prompt": "Once upon a time", "n_predict": 4}
LONG_PROMPT = "Lily and Ben went to the park. " * 80  # ~ 700 tokens: over stories260K's 512-token context


def with_(base: dict, **changes) -> dict:
    return {**base, **changes}


def without(base: dict, name: str) -> dict:
    return {key: value for key, value in base.items() if key != name}


# (case id, method, path, JSON body or raw bytes, expected status)
CASES = [
    ("not json", "POST", "/v1/completions", b"{not json", 400),
    ("empty body", "POST", "/v1/completions", b"", 400),
    ("body is a list", "POST", "/v1/completions", [OK_COMPLETION], 400),
    ("NaN temperature", "POST", "/v1/completions", b'{"prompt": "x", "temperature": NaN}', 400),
    ("missing prompt", "POST", "/v1/completions", without(OK_COMPLETION, "prompt"), 400),
    ("empty prompt", "POST", "/v1/completions", with_(OK_COMPLETION, prompt=""), 400),
    ("prompt is an int", "POST", "/v1/completions", with_(OK_COMPLETION, prompt=5), 400),
    ("empty token list", "POST", "/v1/completions", with_(OK_COMPLETION, prompt=[]), 400),
    ("negative token id", "POST", "/v1/completions", with_(OK_COMPLETION, prompt=[1, -3]), 400),
    ("token id outside vocab", "POST", "/v1/completions", with_(OK_COMPLETION, prompt=[1, 100000]), 400),
    ("two prompts", "POST", "/v1/completions", with_(OK_COMPLETION, prompt=["a", "b"]), 400),
    ("prompt over the context", "POST", "/v1/completions", with_(OK_COMPLETION, prompt=LONG_PROMPT), 400),
    ("max_tokens 0", "POST", "/v1/completions", with_(OK_COMPLETION, max_tokens=0), 400),
    ("max_tokens -1", "POST", "/v1/completions", with_(OK_COMPLETION, max_tokens=-1), 400),
    ("max_tokens 10**9", "POST", "/v1/completions", with_(OK_COMPLETION, max_tokens=10**9), 400),
    ("max_tokens string", "POST", "/v1/completions", with_(OK_COMPLETION, max_tokens="10"), 400),
    ("temperature -1", "POST", "/v1/completions", with_(OK_COMPLETION, temperature=-1), 400),
    ("top_p 2", "POST", "/v1/completions", with_(OK_COMPLETION, top_p=2), 400),
    ("top_p 0", "POST", "/v1/completions", with_(OK_COMPLETION, top_p=0), 400),
    ("stop is an int", "POST", "/v1/completions", with_(OK_COMPLETION, stop=5), 400),
    ("stop list of ints", "POST", "/v1/completions", with_(OK_COMPLETION, stop=[1, 2]), 400),
    ("too many stops", "POST", "/v1/completions", with_(OK_COMPLETION, stop=[f"s{i}" for i in range(65)]), 400),
    ("n 0", "POST", "/v1/completions", with_(OK_COMPLETION, n=0), 400),
    ("n 1000", "POST", "/v1/completions", with_(OK_COMPLETION, n=1000), 400),
    ("logit_bias non-integer key", "POST", "/v1/completions", with_(OK_COMPLETION, logit_bias={"abc": 1.0}), 400),
    ("logit_bias string value", "POST", "/v1/completions", with_(OK_COMPLETION, logit_bias={"5": "x"}), 400),
    ("logit_bias token outside vocab", "POST", "/v1/completions", with_(OK_COMPLETION, logit_bias={"99999": 1}), 400),
    ("stream is a string", "POST", "/v1/completions", with_(OK_COMPLETION, stream="yes"), 400),
    ("speculative kind unknown", "POST", "/v1/completions", with_(OK_COMPLETION, speculative={"kind": "magic"}), 400),
    (
        "max_draft too large",
        "POST",
        "/v1/completions",
        with_(OK_COMPLETION, speculative={"kind": "prompt-lookup", "max_draft": 1000}),
        400,
    ),
    ("echo", "POST", "/v1/completions", with_(OK_COMPLETION, echo=True), 400),
    ("logprobs 50", "POST", "/v1/completions", with_(OK_COMPLETION, logprobs=50), 400),
    ("presence_penalty 3", "POST", "/v1/completions", with_(OK_COMPLETION, presence_penalty=3), 400),
    ("seed negative", "POST", "/v1/completions", with_(OK_COMPLETION, seed=-4), 400),
    ("missing messages", "POST", "/v1/chat/completions", without(OK_CHAT, "messages"), 400),
    ("empty messages", "POST", "/v1/chat/completions", with_(OK_CHAT, messages=[]), 400),
    ("messages is a string", "POST", "/v1/chat/completions", with_(OK_CHAT, messages="hello"), 400),
    ("role is an int", "POST", "/v1/chat/completions", with_(OK_CHAT, messages=[{"role": 5, "content": "x"}]), 400),
    ("unknown role", "POST", "/v1/chat/completions", with_(OK_CHAT, messages=[{"role": "robot", "content": "x"}]), 400),
    ("message without content", "POST", "/v1/chat/completions", with_(OK_CHAT, messages=[{"role": "user"}]), 400),
    (
        "image content part",
        "POST",
        "/v1/chat/completions",
        with_(OK_CHAT, messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
        400,
    ),
    ("top_logprobs 99", "POST", "/v1/chat/completions", with_(OK_CHAT, logprobs=True, top_logprobs=99), 400),
    ("chat n 3", "POST", "/v1/chat/completions", with_(OK_CHAT, n=3), 400),
    ("llama empty prompt", "POST", "/completion", with_(OK_LLAMA, prompt=""), 400),
    ("llama n_predict 0", "POST", "/completion", with_(OK_LLAMA, n_predict=0), 400),
    ("llama n_predict -2", "POST", "/completion", with_(OK_LLAMA, n_predict=-2), 400),
    ("llama seed -5", "POST", "/completion", with_(OK_LLAMA, seed=-5), 400),
    ("llama stop is a dict", "POST", "/completion", with_(OK_LLAMA, stop={"a": 1}), 400),
    ("llama prompt over the context", "POST", "/completion", with_(OK_LLAMA, prompt=LONG_PROMPT), 400),
    ("tokenize content int", "POST", "/tokenize", {"content": 5}, 400),
    ("detokenize negative", "POST", "/detokenize", {"tokens": [-1]}, 400),
    ("detokenize outside vocab", "POST", "/detokenize", {"tokens": [99999]}, 400),
    ("detokenize not a list", "POST", "/detokenize", {"tokens": "abc"}, 400),
    ("unknown endpoint", "GET", "/v1/nope", None, 404),
    ("unknown POST endpoint", "POST", "/v2/chat", OK_CHAT, 404),
    ("wrong method", "GET", "/v1/completions", None, 405),
    ("wrong method on health", "DELETE", "/health", None, 405),
    ("body over the limit", "POST", "/v1/completions", with_(OK_COMPLETION, prompt="x" * (9 * 1024 * 1024)), 413),
]


def assert_openai_error(response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    # llama-server's context error carries its two numbers too
    extra = {"n_prompt_tokens", "n_ctx"} if body.get("error", {}).get("type") == "exceed_context_size_error" else set()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"} | extra, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert isinstance(body["error"]["type"], str) and body["error"]["type"]
    return body["error"]


def send(http, method: str, path: str, body):
    if body is None:
        return http.request(method, path)
    if isinstance(body, bytes):
        return http.request(method, path, content=body, headers={"content-type": "application/json"})
    return http.request(method, path, json=body)


@pytest.mark.parametrize("method, path, body, status", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_bad_request(stories_gateway, method, path, body, status):
    error = assert_openai_error(send(stories_gateway.client, method, path, body), status)
    if status == 400:  # a prompt over the context is llama-server's own type, which its clients test for
        assert error["type"] in (
            ("exceed_context_size_error",) if body_is_over_context(body) else ("invalid_request_error",)
        )


def body_is_over_context(body) -> bool:
    return isinstance(body, dict) and body.get("prompt") == LONG_PROMPT


def test_validation_errors_name_the_field(stories_gateway):
    http = stories_gateway.client
    error = assert_openai_error(http.post("/v1/completions", json=with_(OK_COMPLETION, max_tokens=0)), 400)
    assert error["param"] == "max_tokens" and "max_tokens" in error["message"]
    error = assert_openai_error(
        http.post("/v1/chat/completions", json=with_(OK_CHAT, messages=[{"role": 5, "content": "x"}])), 400
    )
    assert error["param"] == "messages.0.role"
    error = assert_openai_error(http.post("/v1/completions", json=with_(OK_COMPLETION, n=0)), 400)
    assert error["param"] == "n" and "[1, 32]" in error["message"]
    error = assert_openai_error(http.post("/v1/completions", json=with_(OK_COMPLETION, prompt=LONG_PROMPT)), 400)
    assert "context" in error["message"]
    error = assert_openai_error(
        http.post("/v1/completions", content=b"{oops", headers={"content-type": "application/json"}), 400
    )
    assert "JSON" in error["message"]


def test_still_healthy_after_bad_input(stories_gateway, stories_endpoint):
    http = stories_gateway.client
    for _, method, path, body, _ in CASES:
        send(http, method, path, body)
    assert http.get("/health").json() == {"status": "ok"}
    response = http.post("/v1/completions", json=OK_COMPLETION)
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 4
    with Client(stories_endpoint, timeout_s=5) as daemon:
        assert daemon.ping(5.0) and daemon.status().active == 0
    metrics = http.get("/metrics").text
    assert 'mlxd_http_requests_total{endpoint="/v1/completions",status="400"}' in metrics
    assert 'mlxd_http_requests_total{endpoint="other",status="404"}' in metrics


@pytest.fixture(scope="module")
def small_body_gateway(stories_endpoint):
    gateway = Gateway([stories_endpoint], "--max-body-bytes", "1000")
    yield gateway
    gateway.stop()


def test_body_limit_by_length_and_by_streamed_bytes(small_body_gateway):
    http = small_body_gateway.client
    assert http.post("/v1/completions", json=OK_COMPLETION).status_code == 200
    error = assert_openai_error(http.post("/v1/completions", json=with_(OK_COMPLETION, prompt="y" * 2000)), 413)
    assert "1000 bytes" in error["message"]

    def chunked():  # no Content-Length: the gateway must count what arrives
        yield b'{"prompt": "'
        for _ in range(4):
            yield b"z" * 400
        yield b'", "max_tokens": 2}'

    assert_openai_error(
        http.post("/v1/completions", content=chunked(), headers={"content-type": "application/json"}), 413
    )
    assert http.get("/health").status_code == 200


@pytest.fixture(scope="module")
def keyed_gateway(stories_endpoint):
    gateway = Gateway([stories_endpoint], "--api-key", "s3cret-key")
    yield gateway
    gateway.stop()


def test_api_key(keyed_gateway):
    http = keyed_gateway.client
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": "s3cret-key"},
        {"Authorization": "Bearer s3cret-key2"},
    ):
        assert_openai_error(http.post("/v1/completions", json=OK_COMPLETION, headers=headers), 401)
        assert_openai_error(http.get("/v1/models", headers=headers), 401)
    assert_openai_error(http.get("/metrics"), 401)
    assert_openai_error(http.post("/completion", content=b"{bad", headers={"content-type": "application/json"}), 401)
    assert http.get("/health").status_code == 200  # open, for load balancers
    assert http.get("/v1/health").json() == {"status": "ok"}  # llama-server's other name, open too
    good = {"Authorization": "Bearer s3cret-key"}
    assert http.post("/v1/completions", json=OK_COMPLETION, headers=good).status_code == 200
    assert http.get("/v1/models", headers=good).status_code == 200
    assert http.get("/metrics", headers=good).status_code == 200


@pytest.fixture(scope="module")
def single_slot_gateway(stories_endpoint):
    gateway = Gateway([stories_endpoint], "--max-concurrency", "1")
    yield gateway
    gateway.stop()


def test_max_concurrency_answers_429_at_once(single_slot_gateway):
    http = single_slot_gateway.client
    body = {"prompt": "Once upon a time", "max_tokens": 480, "stream": True}
    with http.stream("POST", "/v1/completions", json=body) as streaming:
        assert streaming.status_code == 200
        lines = streaming.iter_lines()  # kept: dropping the iterator would close the connection
        next(lines)  # the stream is running: it holds the only slot
        refused = http.post("/v1/completions", json=OK_COMPLETION)
        error = assert_openai_error(refused, 429)
        assert refused.headers["retry-after"] == "1" and error["type"] == "rate_limit_error"
        assert http.get("/health").status_code == 200  # never limited
    # Closing the stream frees the slot as soon as the gateway sees the disconnect.
    deadline = time.monotonic() + 5
    while (response := http.post("/v1/completions", json=OK_COMPLETION)).status_code == 429:
        assert time.monotonic() < deadline, "the slot was not released"
        time.sleep(0.05)
    assert response.status_code == 200


@pytest.mark.slow
def test_daemon_overloaded_becomes_429():
    if not STORIES.is_dir():
        pytest.skip(f"{STORIES} is not present")
    endpoint = private_endpoint("q")
    process = start_daemon(endpoint, "-m", str(STORIES), "--max-batch", "1", "--max-queue", "1")
    gateway = Gateway([endpoint])
    try:
        body = {"prompt": "Once upon a time", "max_tokens": 480, "stream": True}
        with gateway.client.stream("POST", "/v1/completions", json=body) as running:
            lines = running.iter_lines()  # kept: dropping the iterator would close the connection
            next(lines)  # decoding: the daemon's only row
            queued = threading.Thread(
                target=gateway.client.post,
                args=("/v1/completions",),
                kwargs={"json": {"prompt": "Lily", "max_tokens": 2}},
            )
            queued.start()
            with Client(endpoint) as daemon:
                deadline = time.monotonic() + 20
                while daemon.status().queued < 1 and time.monotonic() < deadline:  # the second one fills the queue
                    time.sleep(0.02)
            refused = gateway.client.post("/v1/completions", json=OK_COMPLETION)
            error = assert_openai_error(refused, 429)
            assert refused.headers["retry-after"] == "1" and error["code"] == "overloaded"
        queued.join(60)
        assert gateway.client.get("/health").status_code == 200
    finally:
        gateway.stop()
        stop_daemon(process, endpoint)


def test_error_bodies_are_json_even_for_raw_middleware_answers(small_body_gateway):
    response = small_body_gateway.client.post("/completion", content=b"x" * 5000)
    assert response.headers["content-type"] == "application/json"
    assert json.loads(response.content)["error"]["code"] == "request_too_large"
