"""OpenAI's Responses API through mlx-serve-http and the real openai client, on one daemon (the embedded
tiny model with a tool template, tests/daemon/tool_model.py): text equal to the chat endpoint's greedy
answer, the SSE event sequence, instructions, max_output_tokens -> incomplete, text.format json_schema,
function calls out and their outputs back in, store / previous_response_id / GET / DELETE / 404, the
store's bound, and fields refused by name."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from mlxd_cli.serve_http.request_fields import IGNORED_FIELDS_HEADER
from mlxd_cli.serve_http.responses_store import ResponsesStore, StoredResponse
from mlxd_cli.serve_http.schemas.responses_api import ResponseObject

from ..daemon.conftest import private_endpoint, start_daemon, stop_daemon
from ..daemon.tool_model import WEATHER_TOOL, make_tool_model
from .conftest import Gateway

QUESTION = "What is the capital of France?"
FLAT_WEATHER = {"type": "function", **WEATHER_TOOL["function"]}  # the Responses API's flat tool shape
SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "count"],
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
    },
}
GREEDY = {"temperature": 0, "max_output_tokens": 24}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    model = make_tool_model(tmp_path_factory.mktemp("responses-model"))
    endpoint = private_endpoint("r")
    process = start_daemon(endpoint, "-m", str(model), "--max-batch", "4")
    gateway = Gateway([endpoint])
    yield gateway
    gateway.stop()
    stop_daemon(process, endpoint)


@pytest.fixture(scope="module")
def client(gateway):
    with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def chat_text(client, messages: list[dict], max_tokens: int = 24) -> str:
    reply = client.chat.completions.create(model="m", messages=messages, max_tokens=max_tokens, temperature=0)
    return reply.choices[0].message.content


def test_text_response_equals_the_chat_answer(client):
    reply = client.responses.create(model="m", input=QUESTION, **GREEDY)
    assert reply.object == "response" and reply.id.startswith("resp_") and reply.status in ("completed", "incomplete")
    (message,) = reply.output
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert reply.output_text == chat_text(client, [{"role": "user", "content": QUESTION}]) != ""
    usage = reply.usage
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens and usage.output_tokens > 0
    assert usage.output_tokens_details.reasoning_tokens == 0 and usage.input_tokens_details.cached_tokens >= 0
    assert reply.model_extra["timings"]["predicted_n"] == usage.output_tokens  # the extension


def test_instructions_are_a_first_system_message(client):
    parts = [{"type": "input_text", "text": QUESTION}]
    reply = client.responses.create(
        model="m", input=[{"role": "user", "content": parts}], instructions="Answer in one word.", **GREEDY
    )
    assert reply.instructions == "Answer in one word."
    assert reply.output_text == chat_text(
        client, [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": QUESTION}]
    )


def test_streamed_events_in_order_and_their_deltas_make_the_text(client, gateway):
    whole = client.responses.create(model="m", input=QUESTION, **GREEDY)
    events = list(client.responses.create(model="m", input=QUESTION, stream=True, **GREEDY))
    kinds = [event.type for event in events]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = kinds.count("response.output_text.delta")
    assert deltas > 1 and kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed" if whole.status == "completed" else "response.incomplete",
    ]
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert text == whole.output_text == events[-4].text == events[-1].response.output_text
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    assert events[-1].response.usage.output_tokens == whole.usage.output_tokens
    assert client.responses.retrieve(events[-1].response.id).output_text == text  # stored once done
    # on the wire: each event is named by an "event:" line equal to its data's type
    with gateway.client.stream("POST", "/v1/responses", json={"input": QUESTION, "stream": True, **GREEDY}) as raw:
        lines = [line for line in raw.iter_lines() if line]
    names = [line.removeprefix("event: ") for line in lines[0::2]]
    assert names == [json.loads(line.removeprefix("data: "))["type"] for line in lines[1::2]]
    # the same sequence as the SDK's stream; how many tokens a delta carries depends on timing
    assert _without_repeated_deltas(names) == _without_repeated_deltas(kinds)


def _without_repeated_deltas(kinds: list[str]) -> list[str]:
    return [kind for i, kind in enumerate(kinds) if not (i and kind == kinds[i - 1] == "response.output_text.delta")]


def test_max_output_tokens_makes_an_incomplete_response(client):
    reply = client.responses.create(model="m", input=QUESTION, temperature=0, max_output_tokens=3)
    assert reply.status == "incomplete" and reply.incomplete_details.reason == "max_output_tokens"
    assert reply.usage.output_tokens == 3 and reply.output[0].status == "incomplete"
    last = list(client.responses.create(model="m", input=QUESTION, temperature=0, max_output_tokens=3, stream=True))[-1]
    assert last.type == "response.incomplete" and last.response.output_text == reply.output_text


def test_json_schema_format_gives_json_matching_it_with_prompt_lookup_on_or_off(client):
    texts = []
    for speculative in ("none", "prompt-lookup"):
        reply = client.responses.create(
            model="m",
            input="Give a name and a count as JSON.",
            temperature=0,
            max_output_tokens=60,
            text={"format": {"type": "json_schema", "name": "thing", "schema": SCHEMA, "strict": True}},
            extra_body={"speculative": {"kind": speculative}},
        )
        assert reply.status == "completed" and reply.text.format.type == "json_schema"
        jsonschema.validate(json.loads(reply.output_text), SCHEMA)
        texts.append(reply.output_text)
    assert texts[0] == texts[1]
    anything = client.responses.create(
        model="m", input="JSON please", temperature=0, max_output_tokens=40, text={"format": {"type": "json_object"}}
    )
    if anything.status == "completed":
        assert isinstance(json.loads(anything.output_text), dict)
    else:  # the tiny model may still be inside a value at the limit
        assert anything.incomplete_details.reason == "max_output_tokens" and anything.output_text.startswith("{")


def test_function_call_round_trip_by_previous_response_id_and_by_explicit_items(client):
    ask = "What is the weather in Paris?"
    first = client.responses.create(
        model="m", input=ask, tools=[FLAT_WEATHER], tool_choice="required", temperature=0, max_output_tokens=80
    )
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id.startswith("call_") and call.id.startswith("fc_")
    jsonschema.validate(json.loads(call.arguments), FLAT_WEATHER["parameters"])
    answer = {"type": "function_call_output", "call_id": call.call_id, "output": "18 degrees, sunny"}
    chained = client.responses.create(
        model="m", previous_response_id=first.id, input=[answer], tools=[FLAT_WEATHER], **GREEDY
    )
    assert chained.previous_response_id == first.id and chained.output[0].type == "message"
    explicit = client.responses.create(
        model="m",
        tools=[FLAT_WEATHER],
        **GREEDY,
        input=[
            {"role": "user", "content": ask},
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
            answer,
        ],
    )
    assert explicit.output_text == chained.output_text
    assert chained.usage.input_tokens_details.cached_tokens > 0  # the first turn's prompt, from the prefix cache


def test_a_named_function_streams_its_arguments(client):
    events = list(
        client.responses.create(
            model="m",
            input="Weather in Oslo?",
            tools=[FLAT_WEATHER],
            stream=True,
            tool_choice={"type": "function", "name": "get_weather"},
            temperature=0,
            max_output_tokens=80,
        )
    )
    kinds = [event.type for event in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    added, delta, done, item_done = events[2:6]
    assert added.item.type == "function_call" and added.item.arguments == "" and added.item.status == "in_progress"
    assert delta.delta == done.arguments == item_done.item.arguments and done.item_id == added.item.id
    jsonschema.validate(json.loads(done.arguments), FLAT_WEATHER["parameters"])
    assert events[-1].response.output[0].call_id == item_done.item.call_id


def test_store_previous_response_get_delete_and_unknown_ids(client):
    first = client.responses.create(model="m", input="My name is Ada.", **GREEDY)
    assert client.responses.retrieve(first.id).output_text == first.output_text
    second = client.responses.create(model="m", input="What is my name?", previous_response_id=first.id, **GREEDY)
    assert second.output_text == chat_text(
        client,
        [
            {"role": "user", "content": "My name is Ada."},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "What is my name?"},
        ],
    )
    client.responses.delete(first.id)
    for call in (
        lambda: client.responses.retrieve(first.id),
        lambda: client.responses.delete(first.id),
        lambda: client.responses.create(model="m", input="hi", previous_response_id=first.id, **GREEDY),
    ):
        with pytest.raises(openai.NotFoundError) as refused:
            call()
        assert first.id in refused.value.message
    unstored = client.responses.create(model="m", input="hi", store=False, temperature=0, max_output_tokens=2)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_the_store_is_bounded_and_evicts_the_least_recently_used():
    store = ResponsesStore(max_responses=2)
    entry = StoredResponse(ResponseObject(id="r", created_at=0, status="completed", model="m"), [])
    store.put("a", entry)
    store.put("b", entry)
    assert store.get("a") is entry  # a is now more recent than b
    store.put("c", entry)
    assert "b" not in store and "a" in store and "c" in store and len(store) == 2
    assert store.delete("a") and not store.delete("a") and store.get("a") is None


REFUSED = [
    ("reasoning", {"effort": "high"}),
    ("background", True),
    ("include", ["message.output_text.logprobs"]),
    ("truncation", "auto"),
    ("top_logprobs", 3),
    ("conversation", "conv_1"),
    ("max_tool_calls", 2),
    ("prompt", {"id": "pmpt_1"}),
    ("tools", [{"type": "web_search"}]),
    ("text", {"verbosity": "low"}),
    ("input", [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]),
    ("input", [{"type": "reasoning", "summary": []}]),
    ("response_format", {"type": "json_object"}),
    ("max_tokens", 5),
    ("tool_choice", "required"),
    ("max_output_tokens", 0),
]


@pytest.mark.parametrize("field, value", REFUSED, ids=[f"{field}={json.dumps(value)[:30]}" for field, value in REFUSED])
def test_unimplemented_fields_are_refused_by_name(gateway, field, value):
    response = gateway.client.post("/v1/responses", json={"input": "hi", "max_output_tokens": 2, field: value})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"].split(".")[0] == field and error["type"] == "invalid_request_error"


def test_fields_without_effect_are_accepted_and_vendor_fields_named(gateway):
    neutral = {
        "service_tier": "auto",
        "user": "u",
        "prompt_cache_key": "k",
        "safety_identifier": "s",
        "reasoning": {"effort": None},
        "truncation": "disabled",
        "include": [],
        "background": False,
        "metadata": {"task": "t"},
        "parallel_tool_calls": True,
        "stream_options": {"include_obfuscation": False},
    }
    response = gateway.client.post("/v1/responses", json={"input": "hi", "max_output_tokens": 2, **neutral})
    assert response.status_code == 200, response.text
    assert IGNORED_FIELDS_HEADER not in response.headers and response.json()["metadata"] == {"task": "t"}
    vendor = gateway.client.post("/v1/responses", json={"input": "hi", "max_output_tokens": 2, "my_knob": 1})
    assert vendor.status_code == 200 and vendor.headers[IGNORED_FIELDS_HEADER] == "my_knob"
