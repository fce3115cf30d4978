"""llama-server's context shift through mlx-serve-http: ``--context-shift`` on the daemon, ``n_keep`` /
``n_discard`` on the request, ``truncated`` in the reply (stories260K, greedy)."""

from __future__ import annotations

import pytest

from ..daemon.conftest import STORIES, private_endpoint, start_daemon, stop_daemon
from .conftest import Gateway

MAX_KV = 64
TEXT = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park."


@pytest.fixture(scope="module")
def shifting_gateway():
    if not STORIES.is_dir():
        pytest.skip(f"{STORIES} is not present")
    endpoint = private_endpoint("s")
    process = start_daemon(
        endpoint, "-m", str(STORIES), "--max-batch", "2", "--max-kv-size", str(MAX_KV), "--context-shift"
    )
    gateway = Gateway([endpoint])
    yield gateway
    gateway.stop()
    stop_daemon(process, endpoint)


def complete(gateway, prompt, n_predict: int, **fields) -> dict:
    body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0, "return_tokens": True, "cache_prompt": False}
    response = gateway.client.post("/completion", json={**body, **fields})
    assert response.status_code == 200, response.text
    return response.json()


def test_a_full_context_is_shifted_and_the_reply_says_truncated(shifting_gateway):
    prompt = shifting_gateway.client.post("/tokenize", json={"content": TEXT, "add_special": True}).json()["tokens"]
    bos = prompt[0]
    first = MAX_KV - len(prompt) + 1  # tokens until the context is full: no shift yet
    before = complete(shifting_gateway, prompt, first)
    assert not before["truncated"] and before["timings"]["predicted_n"] == first
    shifted = complete(shifting_gateway, prompt, first + 12, n_keep=2, n_discard=20)
    assert shifted["truncated"] and shifted["timings"]["predicted_n"] == first + 12
    assert shifted["timings"]["prompt_n"] == len(prompt)
    assert shifted["generation_settings"]["n_keep"] == 2 and shifted["generation_settings"]["n_discard"] == 20
    # n_keep 2 and the BOS (llama-server counts it apart): 3 tokens stay, the 20 after them go, and the
    # output goes on as a fresh request on what is left
    context = prompt + before["tokens"]
    assert context[0] == bos
    kept = context[:3] + context[23:]
    after = complete(shifting_gateway, kept, 12)
    assert shifted["tokens"] == before["tokens"] + after["tokens"]


def test_the_openai_endpoints_take_n_keep_and_reject_a_bad_one(shifting_gateway):
    body = {"prompt": TEXT, "max_tokens": 80, "temperature": 0, "n_keep": -1}
    response = shifting_gateway.client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 80  # past the context of 64: shifted
    response = shifting_gateway.client.post("/v1/completions", json={**body, "n_keep": -2})
    assert response.status_code == 400 and response.json()["error"]["param"] == "n_keep"
