"""Anthropic's Messages API through mlx-serve-http and the real ``anthropic`` client: text equal to the chat
endpoint's greedy output, streaming (the SDK's and the raw event order), system, stop_sequences, max_tokens,
a tool_use round trip, count_tokens, x-api-key / bearer auth, and errors in Anthropic's shape. Model: the
embedded tiny model with the Qwen-style tool template (one daemon and one keyed gateway for the module)."""

from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import pytest

from ..daemon.conftest import private_endpoint, start_daemon, stop_daemon
from ..daemon.tool_model import TIME_TOOL, WEATHER_TOOL, make_tool_model
from .conftest import Gateway

KEY = "anthropic-test-key"
GREEDY = {"temperature": 0}  # newer SDKs dropped the sampling fields from create(); the API still takes them
QUESTION = [{"role": "user", "content": "Tell me a short story about a cat."}]
WEATHER = {
    "name": "get_weather",
    "description": WEATHER_TOOL["function"]["description"],
    "input_schema": WEATHER_TOOL["function"]["parameters"],
}
TIME = {"name": "get_time", "input_schema": TIME_TOOL["function"]["parameters"]}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    model = make_tool_model(tmp_path_factory.mktemp("anthropic-tool-model"))
    endpoint = private_endpoint("a")
    process = start_daemon(endpoint, "-m", str(model), "--max-batch", "4")
    running = Gateway([endpoint], "--api-key", KEY)
    yield running
    running.stop()
    stop_daemon(process, endpoint)


@pytest.fixture(scope="module")
def client(gateway):
    with anthropic.Anthropic(base_url=gateway.url, api_key=KEY, max_retries=0, timeout=120) as sdk:
        yield sdk


def chat_text(gateway, messages: list[dict], max_tokens: int) -> str:
    """The chat endpoint's greedy answer to the same conversation (the reference)."""
    reply = gateway.client.post(
        "/v1/chat/completions",
        headers={"Authorization": f"Bearer {KEY}"},
        json={"messages": messages, "max_tokens": max_tokens, "temperature": 0},
    )
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["message"]["content"]


def raw_events(gateway, body: dict) -> list[tuple[str, dict]]:
    """(event name, data) of a streamed /v1/messages answer, as sent."""
    events, name = [], None
    with gateway.client.stream(
        "POST", "/v1/messages", headers={"x-api-key": KEY}, json={**body, "stream": True}
    ) as reply:
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
        for line in reply.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: ") :])
                assert data["type"] == name
                events.append((name, data))
    return events


def assert_anthropic_error(response: httpx.Response, status: int, error_type: str, mentions: str = "") -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    assert body["error"]["type"] == error_type and mentions in body["error"]["message"], body


def test_text_equals_the_chat_endpoint_with_a_system_prompt(client, gateway):
    system = "You are a poet."
    reference = chat_text(gateway, [{"role": "system", "content": system}, *QUESTION], 24)
    reply = client.messages.create(
        model="tiny", max_tokens=24, extra_body=GREEDY, system=system, messages=QUESTION, metadata={"user_id": "u1"}
    )
    assert reply.type == "message" and reply.role == "assistant" and reply.id.startswith("msg_")
    assert [block.type for block in reply.content] == ["text"] and reply.content[0].text == reference
    assert reply.stop_reason in ("end_turn", "max_tokens") and reply.stop_sequence is None
    assert reply.usage.output_tokens <= 24 and reply.usage.cache_creation_input_tokens == 0
    blocks = client.messages.create(
        model="tiny",
        max_tokens=24,
        extra_body=GREEDY,
        messages=QUESTION,
        system=[{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
    )
    assert blocks.content[0].text == reference  # system as text blocks is the same prompt
    assert blocks.usage.cache_read_input_tokens > 0  # the prefix cache served the repeated prompt
    assert (
        blocks.usage.input_tokens + blocks.usage.cache_read_input_tokens
        == reply.usage.input_tokens + reply.usage.cache_read_input_tokens
    )


def test_max_tokens_and_stop_sequences(client):
    limited = client.messages.create(model="tiny", max_tokens=3, extra_body=GREEDY, messages=QUESTION)
    assert limited.stop_reason == "max_tokens" and limited.usage.output_tokens == 3
    whole = client.messages.create(model="tiny", max_tokens=32, extra_body=GREEDY, messages=QUESTION).content[0].text
    word = next(word for word in whole.split()[2:] if len(word) > 2 and word.isalpha())
    stopped = client.messages.create(
        model="tiny", max_tokens=32, extra_body=GREEDY, messages=QUESTION, stop_sequences=["@@never@@", word]
    )
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == word
    assert stopped.content[0].text == whole[: whole.index(word)]


def test_streaming_with_the_sdk_and_the_raw_event_order(client, gateway):
    expected = client.messages.create(model="tiny", max_tokens=20, extra_body=GREEDY, messages=QUESTION)
    with client.messages.stream(model="tiny", max_tokens=20, extra_body=GREEDY, messages=QUESTION) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(texts) == expected.content[0].text == final.content[0].text and len(texts) > 1
    assert final.stop_reason == expected.stop_reason and final.usage.output_tokens == expected.usage.output_tokens
    events = raw_events(gateway, {"model": "tiny", "max_tokens": 20, "temperature": 0, "messages": QUESTION})
    names = [name for name, _ in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["id"].startswith("msg_")
    deltas = [data["delta"] for name, data in events if name == "content_block_delta"]
    assert all(delta["type"] == "text_delta" for delta in deltas)
    assert "".join(delta["text"] for delta in deltas) == expected.content[0].text
    message_delta = events[-2][1]
    assert message_delta["delta"]["stop_reason"] == expected.stop_reason
    assert message_delta["usage"]["output_tokens"] == expected.usage.output_tokens


def test_tool_use_round_trip(client):
    asked = [{"role": "user", "content": "What is the weather in Paris?"}]
    reply = client.messages.create(
        model="tiny",
        max_tokens=80,
        extra_body=GREEDY,
        messages=asked,
        tools=[WEATHER, TIME],
        tool_choice={"type": "any"},
    )
    assert reply.stop_reason == "tool_use"
    (call,) = [block for block in reply.content if block.type == "tool_use"]
    assert call.id.startswith("toolu_") and call.name in ("get_weather", "get_time")
    jsonschema.validate(call.input, {"get_weather": WEATHER, "get_time": TIME}[call.name]["input_schema"])
    history = [
        *asked,
        {"role": "assistant", "content": reply.content},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": call.id,
                    "content": [{"type": "text", "text": "18 degrees, sunny"}],
                }
            ],
        },
    ]
    answer = client.messages.create(model="tiny", max_tokens=16, extra_body=GREEDY, messages=history, tools=[WEATHER])
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use") and answer.usage.output_tokens > 0
    named = client.messages.create(
        model="tiny",
        max_tokens=80,
        extra_body=GREEDY,
        messages=asked,
        tools=[WEATHER, TIME],
        tool_choice={"type": "tool", "name": "get_time"},
    )
    assert [(block.type, block.name) for block in named.content] == [("tool_use", "get_time")]
    jsonschema.validate(named.content[0].input, TIME["input_schema"])


def test_streamed_tool_use_is_an_input_json_delta(client):
    with client.messages.stream(
        model="tiny",
        max_tokens=80,
        extra_body=GREEDY,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert "input_json" in kinds and final.stop_reason == "tool_use"
    (call,) = final.content
    assert call.type == "tool_use" and call.name == "get_weather"
    jsonschema.validate(call.input, WEATHER["input_schema"])


def test_count_tokens_is_the_prompt_of_a_real_call(client):
    conversation = {
        "system": "Answer briefly.",
        "tools": [WEATHER],
        "messages": [{"role": "user", "content": "Is it cold in Lima today?"}],
    }
    counted = client.messages.count_tokens(model="tiny", **conversation)
    reply = client.messages.create(model="tiny", max_tokens=4, extra_body=GREEDY, **conversation)
    assert counted.input_tokens == reply.usage.input_tokens + reply.usage.cache_read_input_tokens
    plain = client.messages.count_tokens(model="tiny", messages=conversation["messages"])
    assert plain.input_tokens < counted.input_tokens  # the tool definitions are part of the prompt


def test_assistant_prefill_is_continued(client):
    prefilled = [*QUESTION, {"role": "assistant", "content": "Once upon a time"}]
    reply = client.messages.create(model="tiny", max_tokens=8, extra_body=GREEDY, messages=prefilled)
    assert reply.usage.output_tokens > 0 and reply.stop_reason in ("end_turn", "max_tokens")
    counted = client.messages.count_tokens(model="tiny", messages=prefilled)  # the prefill counted exactly
    assert counted.input_tokens == reply.usage.input_tokens + reply.usage.cache_read_input_tokens


def test_x_api_key_and_bearer_auth_and_anthropic_401(gateway):
    body = {"model": "tiny", "max_tokens": 2, "messages": QUESTION}
    with anthropic.Anthropic(base_url=gateway.url, auth_token=KEY, api_key=None, max_retries=0) as bearer:
        assert bearer.messages.create(**body).usage.output_tokens > 0
    with anthropic.Anthropic(base_url=gateway.url, api_key="wrong", max_retries=0) as wrong:
        with pytest.raises(anthropic.AuthenticationError):
            wrong.messages.create(**body)
    assert_anthropic_error(gateway.client.post("/v1/messages", json=body), 401, "authentication_error", "x-api-key")
    assert_anthropic_error(
        gateway.client.post(
            "/v1/messages/count_tokens", headers={"x-api-key": "no"}, json={"model": "tiny", "messages": QUESTION}
        ),
        401,
        "authentication_error",
    )
    assert gateway.client.get("/v1/models", headers={"x-api-key": KEY}).status_code == 200  # every path
    assert "error" in gateway.client.get("/v1/models").json()  # OpenAI's shape off the Messages paths
    accepted = gateway.client.post(
        "/v1/messages",
        json=body,
        headers={"x-api-key": KEY, "anthropic-version": "2023-06-01", "anthropic-beta": "token-counting-2024-11-01"},
    )
    assert accepted.status_code == 200, accepted.text


@pytest.mark.parametrize(
    "change, mentions",
    [
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": "x"}}]}]},
            '"image" content blocks',
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "document", "source": {}}]}
                        ],
                    }
                ]
            },
            '"document" content blocks',
        ),
        ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, "thinking: extended thinking"),
        ({"mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]}, "mcp_servers"),
        ({"container": "c1"}, "container"),
        ({"service_tier": "auto"}, "service_tier"),
        ({"output_config": {"effort": "high"}}, "output_config.effort"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "web_search_20250305"),
        ({"tools": [{**WEATHER, "input_examples": [{"city": "Oslo"}]}]}, "input_examples"),
        ({"no_such_field": 1}, "no_such_field"),
        ({"temperature": 1.5}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice"),
        ({"tool_choice": {"type": "any"}}, "needs tools"),
    ],
)
def test_bad_requests_are_anthropic_400s(client, change, mentions):
    body = {"model": "tiny", "max_tokens": 4, "messages": QUESTION, **change}
    with pytest.raises(anthropic.BadRequestError) as raised:
        client.messages.create(
            **{name: body.pop(name) for name in ("model", "max_tokens", "messages")}, extra_body=body
        )
    assert raised.value.status_code == 400 and raised.value.body["type"] == "error"
    assert raised.value.body["error"]["type"] == "invalid_request_error" and mentions in raised.value.message


def test_validation_and_routing_errors_have_anthropic_shape(gateway):
    http, key = gateway.client, {"x-api-key": KEY}
    assert_anthropic_error(
        http.post("/v1/messages", headers=key, json={"model": "m", "messages": QUESTION}),
        400,
        "invalid_request_error",
        "max_tokens",
    )
    assert_anthropic_error(
        http.post("/v1/messages", headers={**key, "content-type": "application/json"}, content=b"{bad"),
        400,
        "invalid_request_error",
        "JSON",
    )
    assert_anthropic_error(
        http.post("/v1/messages/count_tokens", headers=key, json={"model": "m", "messages": []}),
        400,
        "invalid_request_error",
        "messages",
    )
    assert_anthropic_error(http.get("/v1/messages", headers=key), 405, "invalid_request_error")
    assert_anthropic_error(http.post("/v1/messages/nope", headers=key, json={}), 404, "not_found_error")
