"""Structured output through mlx-serve-http on the fast test models: OpenAI response_format (json_object,
json_schema) on both generation endpoints through the real openai client, llama-server json_schema and
GBNF grammar on /completion, streaming or not, prompt lookup on and off; rejected schemas are 400s."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from .conftest import sse_events

SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "count"],
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
    },
}
JSON_SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA, "strict": True}}
OFF = {"speculative": {"kind": "none"}}
ON = {"speculative": {"kind": "prompt-lookup"}}


@pytest.fixture(scope="module")
def stories_openai(stories_gateway):
    with openai.OpenAI(base_url=f"{stories_gateway.url}/v1", api_key="unused", max_retries=0, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def chat_openai(templated_stories_gateway):
    with openai.OpenAI(
        base_url=f"{templated_stories_gateway.url}/v1", api_key="unused", max_retries=0, timeout=120
    ) as client:
        yield client


def test_completions_json_schema_validates_and_prompt_lookup_keeps_it(stories_openai):
    texts = []
    for speculative in (OFF, ON):
        reply = stories_openai.completions.create(
            model="m",
            prompt="Once upon a time",
            max_tokens=60,
            temperature=0,
            extra_body={"response_format": JSON_SCHEMA_FORMAT, **speculative},
        )
        assert reply.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(reply.choices[0].text), SCHEMA)
        texts.append(reply.choices[0].text)
    assert texts[0] == texts[1]


def test_chat_json_schema_streaming_equals_non_streaming(chat_openai):
    messages = [{"role": "user", "content": "Give a name and a count as JSON."}]
    whole = chat_openai.chat.completions.create(
        model="m", messages=messages, max_tokens=60, temperature=0, response_format=JSON_SCHEMA_FORMAT, extra_body=ON
    )
    jsonschema.validate(json.loads(whole.choices[0].message.content), SCHEMA)
    stream = chat_openai.chat.completions.create(
        model="m",
        messages=messages,
        max_tokens=60,
        temperature=0,
        response_format=JSON_SCHEMA_FORMAT,
        stream=True,
        extra_body=OFF,
    )
    chunks = list(stream)
    assert (
        "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
        == whole.choices[0].message.content
    )
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_chat_json_object(chat_openai):
    reply = chat_openai.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "JSON please"}],
        max_tokens=60,
        temperature=0,
        response_format={"type": "json_object"},
    )
    if reply.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(reply.choices[0].message.content), dict)
    else:  # the tiny model may still be inside a value at max_tokens: then it says so
        assert reply.choices[0].finish_reason == "length"
        assert reply.choices[0].message.content.startswith("{")


def test_json_object_with_a_schema_follows_the_schema(stories_openai):
    # llama-server's extension: a schema inside a json_object response_format constrains the reply to it
    reply = stories_openai.completions.create(
        model="m",
        prompt="Once upon a time",
        max_tokens=6,
        temperature=0,
        extra_body={"response_format": {"type": "json_object", "schema": {"const": "42"}}},
    )
    assert reply.choices[0].text == '"42"' and reply.choices[0].finish_reason == "stop"


def test_max_tokens_inside_a_value_is_length(stories_openai):
    schema = {"type": "object", "required": ["story"], "properties": {"story": {"type": "string"}}}
    reply = stories_openai.completions.create(
        model="m",
        prompt="Once upon a time",
        max_tokens=6,
        temperature=0,
        extra_body={"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}},
    )
    assert reply.choices[0].finish_reason == "length"
    with pytest.raises(ValueError):
        json.loads(reply.choices[0].text)


def test_llama_json_schema_and_grammar(stories_gateway):
    http = stories_gateway.client
    body = http.post("/completion", json={"prompt": "Once upon a time", "n_predict": 60, "json_schema": SCHEMA}).json()
    jsonschema.validate(json.loads(body["content"]), SCHEMA)
    assert body["stop_type"] == "eos"
    grammar = 'root ::= answer " " answer\nanswer ::= "yes" | "no"'
    body = http.post("/completion", json={"prompt": "Once upon a time", "n_predict": 20, "grammar": grammar}).json()
    words = body["content"].split(" ")
    assert len(words) == 2 and set(words) <= {"yes", "no"}
    with http.stream(
        "POST", "/completion", json={"prompt": "Once upon a time", "n_predict": 20, "grammar": grammar, "stream": True}
    ) as response:
        events = sse_events(response.iter_lines())
    assert "".join(event["content"] for event in events) == body["content"]


@pytest.mark.parametrize(
    "path, body, param, words",
    [
        ("/completion", {"prompt": "x", "grammar": "root ::= nowhere"}, "grammar", "nowhere"),
        ("/completion", {"prompt": "x", "json_schema": {"type": "strin"}}, "json_schema", "strin"),
        ("/completion", {"prompt": "x", "json_schema": {}, "grammar": 'root ::= "a"'}, "grammar", "not both"),
        (
            "/v1/completions",
            {
                "prompt": "x",
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "n", "schema": {"type": "object", "properties": {"a": {"type": "strin"}}}},
                },
            },
            "response_format",
            "strin",
        ),
        ("/v1/completions", {"prompt": "x", "response_format": {"type": "json_schema"}}, "response_format", "schema"),
        ("/v1/completions", {"prompt": "x", "response_format": {"type": "xml"}}, "response_format", ""),
        (
            "/v1/completions",
            {"prompt": "x", "response_format": {"type": "json_object", "schema": {"type": "hiccup"}}},
            "response_format",
            "hiccup",
        ),
        (
            "/v1/completions",
            {"prompt": "x", "response_format": {"type": "json_object", "schema": 123}},
            "response_format",
            "",
        ),
    ],
)
def test_rejected_schema_or_grammar_is_400_naming_the_field(stories_gateway, path, body, param, words):
    response = stories_gateway.client.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] is not None and error["param"].split(".")[0] == param, error
    assert words in error["message"] and "internal" not in error["message"].lower()
