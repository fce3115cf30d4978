"""OpenAI tools through mlx-serve-http and the real openai client: message.tool_calls, streamed
delta.tool_calls, finish_reason "tool_calls", "required" and a named function enforced, multi-turn tool
replies accepted, a model without tool calling answered 400. Model: the embedded tiny model with a
Qwen-style tool template (SmolLM2's template has no tools)."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from ..daemon.conftest import private_endpoint, start_daemon, stop_daemon
from ..daemon.tool_model import TIME_TOOL, WEATHER_TOOL, make_tool_model
from .conftest import Gateway

MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
PARAMETERS = {"get_weather": WEATHER_TOOL["function"]["parameters"], "get_time": TIME_TOOL["function"]["parameters"]}


@pytest.fixture(scope="module")
def tool_gateway(tmp_path_factory):
    model = make_tool_model(tmp_path_factory.mktemp("tool-model"))
    endpoint = private_endpoint("g")
    process = start_daemon(endpoint, "-m", str(model), "--max-batch", "4")
    gateway = Gateway([endpoint])
    yield gateway
    gateway.stop()
    stop_daemon(process, endpoint)


@pytest.fixture(scope="module")
def client(tool_gateway):
    with openai.OpenAI(base_url=f"{tool_gateway.url}/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def test_required_gives_a_parsed_call_with_valid_arguments(client):
    reply = client.chat.completions.create(
        model="m",
        messages=MESSAGES,
        max_tokens=80,
        temperature=0,
        tools=[WEATHER_TOOL, TIME_TOOL],
        tool_choice="required",
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), PARAMETERS[call.function.name])


def test_named_function_streamed_as_delta_tool_calls(client):
    stream = client.chat.completions.create(
        model="m",
        messages=MESSAGES,
        max_tokens=80,
        temperature=0,
        tools=[WEATHER_TOOL, TIME_TOOL],
        stream=True,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    chunks = [chunk for chunk in stream if chunk.choices]
    calls = [call for chunk in chunks for call in chunk.choices[0].delta.tool_calls or ()]
    assert [call.function.name for call in calls] == ["get_weather"] and calls[0].index == 0
    jsonschema.validate(json.loads(calls[0].function.arguments), PARAMETERS["get_weather"])
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks) == ""


def test_multi_turn_with_a_tool_reply_and_auto(client):
    history = MESSAGES + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"},
    ]
    reply = client.chat.completions.create(
        model="m", messages=history, max_tokens=20, temperature=0, tools=[WEATHER_TOOL]
    )
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")


@pytest.mark.parametrize(
    "body, param",
    [
        ({"tool_choice": "required"}, "tool_choice"),  # no tools
        ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": [{"type": "retrieval"}]}, "tools"),
    ],
)
def test_bad_tool_requests_are_400(tool_gateway, body, param):
    response = tool_gateway.client.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 4, **body})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"].split(".")[0] == param


def test_a_model_without_tool_calling_gets_400(embedded_gateway):
    response = embedded_gateway.client.post(
        "/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 4, "tools": [WEATHER_TOOL]}
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "tools" and "does not support tool calling" in error["message"]
