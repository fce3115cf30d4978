"""No silent ignoring: a field OpenAI or llama-server define and mlxd does not implement is a 400 naming
it (unless sent at its neutral value); a vendor extension is ignored but named in a response header."""

from __future__ import annotations

import pytest

from mlxd_cli.serve_http.request_fields import IGNORED_FIELDS_HEADER

from .conftest import sse_events

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
COMPLETION = {"prompt": "Once upon a time", "max_tokens": 3}
LLAMA = {"prompt": "Once upon a time", "n_predict": 3}

REFUSED = [
    ("/v1/chat/completions", CHAT, "audio", {"voice": "alloy", "format": "wav"}),
    ("/v1/chat/completions", CHAT, "modalities", ["text", "audio"]),
    ("/v1/chat/completions", CHAT, "store", True),
    ("/chat/completions", CHAT, "return_progress", True),
    ("/v1/completions", COMPLETION, "web_search_options", {}),
    ("/completion", LLAMA, "mirostat", 2),
    ("/completion", LLAMA, "return_progress", True),
    ("/completion", LLAMA, "typical_p", 0.5),
    ("/completion", LLAMA, "image_data", [{"data": "xx", "id": 1}]),
    ("/completion", LLAMA, "min_keep", 5),
    ("/completion", LLAMA, "adaptive_target", 0.5),
    # llama-server takes its own fields on the OpenAI endpoints too
    ("/v1/chat/completions", CHAT, "mirostat", 2),
    ("/v1/completions", COMPLETION, "typical_p", 0.5),
    ("/v1/completions", COMPLETION, "dry_multiplier", 0.8),
    ("/v1/chat/completions", CHAT, "samplers", ["top_k"]),
    ("/v1/chat/completions", CHAT, "min_keep", 5),
    ("/v1/chat/completions", CHAT, "n_probs", 3),
    ("/v1/completions", COMPLETION, "post_sampling_probs", True),
    ("/v1/completions", COMPLETION, "repeat_last_n", 16),
    ("/completion", LLAMA, "echo", True),
    ("/completion", LLAMA, "reasoning_format", "deepseek"),
    ("/completion", LLAMA, "reasoning_budget_tokens", 64),
    ("/v1/chat/completions", CHAT, "grammar_lazy", True),
    ("/v1/chat/completions", CHAT, "reasoning_format", "auto"),
    ("/v1/completions", COMPLETION, "parse_tool_calls", True),
]

NEUTRAL = [
    (
        "/v1/completions",
        COMPLETION,
        {
            "modalities": ["text"],
            "store": False,
            "verbose": False,
            "service_tier": "auto",
            "metadata": {"a": "b"},
            "response_format": {"type": "text"},
        },
    ),
    (
        "/completion",
        LLAMA,
        {
            "mirostat": 0,
            "mirostat_tau": 5.0,
            "typical_p": 1.0,
            "tfs_z": 1.0,
            "n_probs": 0,
            "dry_multiplier": 0.0,
            "xtc_probability": 0.0,
            "repeat_last_n": 64,
            "n_keep": 0,
            "samplers": None,
            "id_slot": -1,
            "verbose": False,
            "backend_sampling": True,
            "min_keep": 1,
            "adaptive_target": -1,
            "adaptive_decay": 0.9,
            "n_cache_reuse": 256,
            "echo": False,
            "sse_ping_interval": 30,
            "reasoning_format": "none",
            "reasoning_budget_tokens": -1,
            "reasoning_budget_message": "enough",
            "grammar_lazy": False,
            "grammar_triggers": [],
            "chat_format": 0,
        },
    ),
    (
        "/v1/completions",
        COMPLETION,
        {
            "mirostat": 0,
            "mirostat_tau": 5.0,
            "typical_p": 1.0,
            "dry_multiplier": 0.0,
            "dry_base": 1.75,
            "min_keep": 0,
            "n_probs": 0,
            "n_keep": 4,
            "id_slot": 1,
            "return_tokens": True,
            "response_fields": ["content"],
            "post_sampling_probs": False,
        },
    ),
]


@pytest.mark.parametrize("path, base, field, value", REFUSED, ids=[f"{case[0]} {case[2]}" for case in REFUSED])
def test_unimplemented_field_is_refused_by_name(stories_gateway, path, base, field, value):
    response = stories_gateway.client.post(path, json={**base, field: value})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == field
    assert error["message"].startswith(f"{field}: ")
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize("path, base, fields", NEUTRAL, ids=[case[0] for case in NEUTRAL])
def test_neutral_values_are_accepted_without_a_header(stories_gateway, path, base, fields):
    response = stories_gateway.client.post(path, json={**base, **fields})
    assert response.status_code == 200, response.text
    assert IGNORED_FIELDS_HEADER not in response.headers


@pytest.mark.parametrize("path, base", [("/v1/completions", COMPLETION), ("/completion", LLAMA)])
def test_vendor_extension_is_ignored_and_named(stories_gateway, path, base):
    plain = stories_gateway.client.post(path, json={**base, "temperature": 0})
    extended = stories_gateway.client.post(path, json={**base, "temperature": 0, "zz_vendor_knob": 3, "aa_other": "x"})
    assert extended.status_code == 200, extended.text
    assert extended.headers[IGNORED_FIELDS_HEADER] == "aa_other, zz_vendor_knob"

    def text(body: dict) -> str:
        return body["content"] if path == "/completion" else body["choices"][0]["text"]

    assert text(extended.json()) == text(plain.json())  # the extension changed nothing


def test_streamed_answer_names_ignored_fields_too(stories_gateway):
    with stories_gateway.client.stream(
        "POST", "/v1/completions", json={**COMPLETION, "stream": True, "my_extension": 1}
    ) as response:
        assert response.status_code == 200
        assert response.headers[IGNORED_FIELDS_HEADER] == "my_extension"
        events = sse_events(response.iter_lines())
    assert events[-1] == "[DONE]"


def test_completion_takes_llama_servers_other_names_for_n_predict_and_n_probs(stories_gateway):
    def complete(**fields) -> dict:
        body = {"prompt": "Once upon a time", "temperature": 0, "ignore_eos": True, **fields}
        response = stories_gateway.client.post("/completion", json=body)
        assert response.status_code == 200, response.text
        assert IGNORED_FIELDS_HEADER not in response.headers
        return response.json()

    assert complete(max_tokens=5)["tokens_predicted"] == 5
    assert complete(max_tokens=5, max_completion_tokens=3)["tokens_predicted"] == 3
    assert complete(max_tokens=5, max_completion_tokens=3, n_predict=4)["tokens_predicted"] == 4
    probabilities = complete(n_predict=2, logprobs=3)["completion_probabilities"]
    assert len(probabilities) == 2 and all(len(entry["top_logprobs"]) == 3 for entry in probabilities)
    assert len(complete(n_predict=2, logprobs=3, n_probs=1)["completion_probabilities"][0]["top_logprobs"]) == 1
    refused = stories_gateway.client.post("/completion", json={"prompt": "Once", "max_tokens": -5})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "n_predict"


def test_llama_server_fields_are_honoured_on_the_openai_endpoints(stories_gateway):
    def completion(**fields) -> dict:
        body = {"prompt": "Once upon a time", "max_tokens": 64, "temperature": 0, **fields}
        response = stories_gateway.client.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        assert IGNORED_FIELDS_HEADER not in response.headers
        return response.json()

    # ignore_eos: a reply pushed to end-of-sequence at once keeps going to its limit
    eos_first = {"logit_bias": {"2": 100}, "max_tokens": 5}
    assert completion(**eos_first)["choices"][0]["finish_reason"] == "stop"
    ignoring = completion(**eos_first, ignore_eos=True)
    assert ignoring["choices"][0]["finish_reason"] == "length" and ignoring["usage"]["completion_tokens"] == 5
    # repeat_penalty is repetition_penalty's llama-server name
    plain = completion()["choices"][0]["text"]
    penalized = completion(repeat_penalty=3.0)["choices"][0]["text"]
    assert penalized != plain and penalized == completion(repetition_penalty=3.0)["choices"][0]["text"]
    both = {"prompt": "Once", "repeat_penalty": 1.2, "repetition_penalty": 1.3}
    refused = stories_gateway.client.post("/v1/completions", json=both)
    assert refused.status_code == 400 and "repeat_penalty" in refused.json()["error"]["message"]


@pytest.mark.parametrize("prediction", [{"type": "image", "content": "x"}, {"type": "content"}, "x"])
def test_a_malformed_prediction_is_a_400(stories_gateway, prediction):
    response = stories_gateway.client.post("/v1/completions", json={**COMPLETION, "prediction": prediction})
    assert response.status_code == 400 and "prediction" in response.text
