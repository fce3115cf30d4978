"""Embeddings through mlx-serve-http on the embedded model: OpenAI's /v1/embeddings with the real openai
client (equal to mlx-lm's own last hidden state, mean-pooled and L2-normalized; batches, token inputs,
base64, dimensions, an input over the context a 400) and llama-server's /embedding (pooled, and a vector per
token from a daemon started with --pooling none)."""

from __future__ import annotations

import base64
import struct

import numpy as np
import openai
import pytest

from ..daemon.conftest import private_endpoint, start_daemon, stop_daemon
from .conftest import EMBEDDED, Gateway

TEXTS = ["The cat sat on the mat.", "Once upon a time there was a little dog who liked to run.", "Hi"]
CONTEXT = 16384  # the embedded model's max_position_embeddings


@pytest.fixture(scope="module")
def reference():
    """mlx-lm's own model: token ids -> its last hidden state [T, H] (``model.model``: after the final norm)."""
    import mlx.core as mx
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(EMBEDDED))

    def hidden(tokens: list[int]) -> np.ndarray:
        return np.array(model.model(mx.array([tokens]))[0].astype(mx.float32))

    hidden.tokenizer = tokenizer
    return hidden


def mean_normalized(states: np.ndarray) -> np.ndarray:
    pooled = states.mean(axis=0)
    return pooled / np.linalg.norm(pooled)


@pytest.fixture(scope="module")
def client(embedded_gateway):
    with openai.OpenAI(base_url=f"{embedded_gateway.url}/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def tokens_of(gateway, text: str) -> list[int]:
    return gateway.client.post("/tokenize", json={"content": text, "add_special": True}).json()["tokens"]


def test_vector_is_the_normalized_mean_of_the_last_hidden_state(client, embedded_gateway, reference):
    reply = client.embeddings.create(model="m", input=TEXTS[0], encoding_format="float")
    tokens = tokens_of(embedded_gateway, TEXTS[0])
    expected = mean_normalized(reference(tokens))
    (item,) = reply.data
    assert item.index == 0 and item.object == "embedding" and len(item.embedding) == expected.size
    np.testing.assert_allclose(item.embedding, expected, atol=2e-5)
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == len(tokens)


def test_batch_of_inputs_each_equals_its_own_vector(client, embedded_gateway, reference):
    reply = client.embeddings.create(model="m", input=TEXTS, encoding_format="float")
    assert [item.index for item in reply.data] == [0, 1, 2]
    counts = []
    for item, text in zip(reply.data, TEXTS):
        tokens = tokens_of(embedded_gateway, text)
        counts.append(len(tokens))
        np.testing.assert_allclose(item.embedding, mean_normalized(reference(tokens)), atol=2e-5)
    assert reply.usage.prompt_tokens == sum(counts)


def test_token_inputs_equal_text_inputs(client, embedded_gateway):
    by_text = client.embeddings.create(model="m", input=TEXTS[:2], encoding_format="float")
    token_lists = [tokens_of(embedded_gateway, text) for text in TEXTS[:2]]
    by_tokens = client.embeddings.create(model="m", input=token_lists, encoding_format="float")
    one_list = client.embeddings.create(model="m", input=token_lists[1], encoding_format="float")
    for text_item, token_item in zip(by_text.data, by_tokens.data):
        np.testing.assert_allclose(token_item.embedding, text_item.embedding, atol=1e-6)
    np.testing.assert_allclose(one_list.data[0].embedding, by_text.data[1].embedding, atol=1e-6)


def test_base64_is_little_endian_float32(client, embedded_gateway):
    floats = client.embeddings.create(model="m", input=TEXTS[1], encoding_format="float").data[0].embedding
    raw = embedded_gateway.client.post("/v1/embeddings", json={"input": TEXTS[1], "encoding_format": "base64"})
    encoded = raw.json()["data"][0]["embedding"]
    decoded = struct.unpack(f"<{len(floats)}f", base64.b64decode(encoded))
    np.testing.assert_allclose(decoded, floats, atol=1e-7)
    default = client.embeddings.create(model="m", input=TEXTS[1])  # the SDK asks for base64 and decodes it
    np.testing.assert_allclose(default.data[0].embedding, floats, atol=1e-7)


def test_dimensions_only_the_models_own(client):
    size = len(client.embeddings.create(model="m", input="x", encoding_format="float").data[0].embedding)
    same = client.embeddings.create(model="m", input="x", dimensions=size, encoding_format="float")
    assert len(same.data[0].embedding) == size
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model="m", input="x", dimensions=size // 2)
    assert refused.value.body["param"] == "dimensions" and str(size) in refused.value.body["message"]


def test_input_over_the_context_is_400_naming_the_limit(embedded_gateway):
    response = embedded_gateway.client.post("/v1/embeddings", json={"input": [[5] * (CONTEXT + 1)]})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "input" and str(CONTEXT) in error["message"] and str(CONTEXT + 1) in error["message"]


@pytest.mark.parametrize(
    "body",
    [
        {"input": ""},
        {"input": []},
        {"input": ["a", ""]},
        {"input": [1, -2]},
        {"input": ["a"] * 2049},
        {"input": [[99999]]},
    ],
)
def test_bad_inputs_are_400(embedded_gateway, body):
    response = embedded_gateway.client.post("/v1/embeddings", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "input"


def test_llama_embedding_shape_and_normalization(embedded_gateway, client, reference):
    pooled = client.embeddings.create(model="m", input=TEXTS[:2], encoding_format="float")
    for path in ("/embedding", "/embeddings"):
        body = embedded_gateway.client.post(path, json={"content": TEXTS[:2]}).json()
        assert [entry["index"] for entry in body] == [0, 1]
        for entry, item in zip(body, pooled.data):
            (vector,) = entry["embedding"]
            np.testing.assert_allclose(vector, item.embedding, atol=1e-6)
    raw = embedded_gateway.client.post("/embedding", json={"content": TEXTS[0], "embd_normalize": -1}).json()
    tokens = tokens_of(embedded_gateway, TEXTS[0])
    np.testing.assert_allclose(raw[0]["embedding"][0], reference(tokens).mean(axis=0), atol=2e-5)
    assert embedded_gateway.client.post("/embedding", json={"content": "x", "embd_normalize": 1}).status_code == 400


@pytest.fixture(scope="module")
def per_token_gateway():
    endpoint = private_endpoint("p")
    process = start_daemon(
        endpoint, "-m", str(EMBEDDED), "--max-batch", "2", "--pooling", "none", "--prefill-chunk", "16"
    )
    gateway = Gateway([endpoint])
    yield gateway
    gateway.stop()
    stop_daemon(process, endpoint)


def test_pooling_none_gives_a_vector_per_token(per_token_gateway, reference):
    text = TEXTS[1]  # longer than one 16-token forward: computed in pieces through the prompt cache
    tokens = tokens_of(per_token_gateway, text)
    body = per_token_gateway.client.post("/embedding", json={"content": [text, "Hi"]}).json()
    assert len(body) == 2 and len(body[0]["embedding"]) == len(tokens) > 16
    np.testing.assert_allclose(body[0]["embedding"], reference(tokens), atol=1e-4)
    refused = per_token_gateway.client.post("/v1/embeddings", json={"input": text})
    assert refused.status_code == 400 and "--pooling" in refused.json()["error"]["message"]
