"""OpenAI-endpoint gaps closed, through the real openai client on the embedded model: system_fingerprint;
llama-server's grammar / json_schema on /v1/chat/completions and /v1/completions (an invalid grammar a 400);
tools with tool_choice "none" on a model without a tool format; text parts joined by a newline; n choices
(greedy equal, seeded ones seed + i, streamed by index); assistant prefill (continue_final_message)."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest

from ..daemon.tool_model import WEATHER_TOOL
from .conftest import sse_events

USER = "Repeat after me: the cat sat on the mat. The cat sat on the mat."
MESSAGES = [{"role": "user", "content": USER}]
YES_NO = 'root ::= answer " " answer\nanswer ::= "yes" | "no"'
SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["n"],
    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
}


def rendered(messages: list[dict], generation_prompt: bool) -> str:
    """The embedded model's chat template written out (its tokenizer_config.json), for /v1/completions."""
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if generation_prompt else "")


@pytest.fixture(scope="module")
def client(embedded_gateway):
    with openai.OpenAI(base_url=f"{embedded_gateway.url}/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def test_system_fingerprint_on_replies_and_chunks_is_stable(client):
    chat = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4, temperature=0)
    completion = client.completions.create(model="m", prompt="Once upon", max_tokens=4, temperature=0)
    # llama-server's shape, b<build>-<hash>: here b<mlxd release>-<hash of model and release>
    assert re.fullmatch(r"b[0-9A-Za-z.+_-]+-[0-9a-f]{12}", chat.system_fingerprint)
    assert completion.system_fingerprint == chat.system_fingerprint
    chunks = list(
        client.chat.completions.create(
            model="m",
            messages=MESSAGES,
            max_tokens=4,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    pieces = list(client.completions.create(model="m", prompt="Once upon", max_tokens=4, temperature=0, stream=True))
    assert {chunk.system_fingerprint for chunk in chunks + pieces} == {chat.system_fingerprint}


@pytest.mark.parametrize("stream", [False, True])
def test_grammar_on_chat_and_completions_is_followed(client, stream):
    def text_of(create, **fields):
        reply = create(model="m", max_tokens=12, temperature=0, stream=stream, extra_body={"grammar": YES_NO}, **fields)
        if not stream:
            choice = reply.choices[0]
            return choice.message.content if hasattr(choice, "message") else choice.text
        return "".join(
            (chunk.choices[0].delta.content or "") if hasattr(chunk.choices[0], "delta") else chunk.choices[0].text
            for chunk in reply
            if chunk.choices
        )

    for text in (
        text_of(client.chat.completions.create, messages=MESSAGES),
        text_of(client.completions.create, prompt="Once upon a time"),
    ):
        assert re.fullmatch(r"(yes|no) (yes|no)", text), text


def test_json_schema_field_on_chat_validates(client):
    reply = client.chat.completions.create(
        model="m", messages=MESSAGES, max_tokens=20, temperature=0, extra_body={"json_schema": SCHEMA}
    )
    jsonschema.validate(json.loads(reply.choices[0].message.content), SCHEMA)


@pytest.mark.parametrize(
    "path, body, param, words",
    [
        ("/v1/chat/completions", {"messages": MESSAGES, "grammar": "root ::= nowhere"}, "grammar", "nowhere"),
        ("/v1/completions", {"prompt": "x", "grammar": "root ::= nowhere"}, "grammar", "nowhere"),
        ("/v1/completions", {"prompt": "x", "json_schema": {"type": "strin"}}, "json_schema", "strin"),
        ("/v1/chat/completions", {"messages": MESSAGES, "grammar": YES_NO, "json_schema": {}}, None, "one of"),
        ("/v1/chat/completions", {"messages": MESSAGES, "continue_final_message": True}, None, "assistant"),
        ("/v1/chat/completions", {"messages": MESSAGES, "n": 0}, "n", "[1, 32]"),
    ],
)
def test_refusals_name_the_field(embedded_gateway, path, body, param, words):
    response = embedded_gateway.client.post(path, json={"max_tokens": 4, **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert words in error["message"]
    if param is not None:
        assert error["param"] == param


def test_tool_choice_none_on_a_model_without_tool_calls_is_the_plain_answer(client):
    plain = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=12, temperature=0)
    with_tools = client.chat.completions.create(
        model="m", messages=MESSAGES, max_tokens=12, temperature=0, tools=[WEATHER_TOOL], tool_choice="none"
    )
    assert with_tools.choices[0].message.content == plain.choices[0].message.content
    assert with_tools.choices[0].message.tool_calls is None
    with pytest.raises(openai.BadRequestError):  # "auto" could call a tool, and this model has no format for it
        client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4, tools=[WEATHER_TOOL])


def test_text_parts_are_joined_by_a_newline(client):
    parts = [{"type": "text", "text": "Repeat after me:"}, {"type": "text", "text": "the cat sat."}]
    joined = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": parts}], max_tokens=10, temperature=0
    )
    newline = client.chat.completions.create(
        model="m",
        max_tokens=10,
        temperature=0,
        messages=[{"role": "user", "content": "Repeat after me:\nthe cat sat."}],
    )
    glued = client.chat.completions.create(
        model="m", max_tokens=10, temperature=0, messages=[{"role": "user", "content": "Repeat after me:the cat sat."}]
    )
    assert joined.usage.prompt_tokens == newline.usage.prompt_tokens != glued.usage.prompt_tokens
    assert joined.choices[0].message.content == newline.choices[0].message.content


def test_greedy_choices_are_equal_and_usage_counts_the_prompt_once(client):
    one = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=10, temperature=0)
    three = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=10, temperature=0, n=3)
    assert [choice.index for choice in three.choices] == [0, 1, 2]
    assert {choice.message.content for choice in three.choices} == {one.choices[0].message.content}
    assert three.usage.prompt_tokens == one.usage.prompt_tokens
    assert three.usage.completion_tokens == 3 * one.usage.completion_tokens


def test_seeded_choices_use_seed_plus_index(client):
    sampled = {"max_tokens": 16, "temperature": 1.0, "seed": 11}
    several = client.completions.create(model="m", prompt="Once upon a time", n=3, **sampled)
    texts = [choice.text for choice in several.choices]
    for index in (0, 2):
        alone = client.completions.create(model="m", prompt="Once upon a time", **{**sampled, "seed": 11 + index})
        assert alone.choices[0].text == texts[index]
    assert len(set(texts)) > 1


def test_streamed_choices_carry_their_index(embedded_gateway, client):
    reference = client.chat.completions.create(
        model="m", messages=MESSAGES, max_tokens=12, temperature=1.0, seed=5, n=2
    )
    with embedded_gateway.client.stream(
        "POST",
        "/v1/chat/completions",
        json={
            "messages": MESSAGES,
            "max_tokens": 12,
            "temperature": 1.0,
            "seed": 5,
            "n": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ) as response:
        events = sse_events(response.iter_lines())
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    chunks = events[:-1]
    texts, finishes = {0: "", 1: ""}, {}
    for chunk in chunks[:-1]:
        (choice,) = chunk["choices"]
        texts[choice["index"]] += choice["delta"].get("content") or ""
        if choice["finish_reason"]:
            finishes[choice["index"]] = choice["finish_reason"]
    assert texts == {choice.index: choice.message.content for choice in reference.choices}
    assert finishes == {choice.index: choice.finish_reason for choice in reference.choices}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == reference.usage.completion_tokens


def test_streamed_completion_choices(embedded_gateway):
    with embedded_gateway.client.stream(
        "POST",
        "/v1/completions",
        json={"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "n": 2, "stream": True},
    ) as response:
        events = sse_events(response.iter_lines())
    texts = {0: "", 1: ""}
    for chunk in events[:-1]:
        for choice in chunk["choices"]:
            texts[choice["index"]] += choice["text"]
    assert texts[0] == texts[1] != ""


def test_final_assistant_message_is_continued(client):
    prefill = [*MESSAGES, {"role": "assistant", "content": "the cat"}]
    continued = client.chat.completions.create(model="m", messages=prefill, max_tokens=12, temperature=0)
    as_text = client.completions.create(
        model="m", prompt=rendered(prefill, False)[: -len("<|im_end|>\n")], max_tokens=12, temperature=0
    )
    assert continued.choices[0].message.content == as_text.choices[0].text
    explicit = client.chat.completions.create(
        model="m",
        messages=prefill,
        max_tokens=12,
        temperature=0,
        extra_body={"continue_final_message": True, "add_generation_prompt": False},
    )
    assert explicit.choices[0].message.content == continued.choices[0].message.content


def test_continue_final_message_false_opens_a_new_turn(client):
    prefill = [*MESSAGES, {"role": "assistant", "content": "the cat"}]
    new_turn = client.chat.completions.create(
        model="m", messages=prefill, max_tokens=12, temperature=0, extra_body={"continue_final_message": False}
    )
    as_text = client.completions.create(model="m", prompt=rendered(prefill, True), max_tokens=12, temperature=0)
    assert new_turn.choices[0].message.content == as_text.choices[0].text


def test_two_final_assistant_messages_are_refused_unless_continued_explicitly(client):
    # llama-server's rule for its prefill heuristic: with two assistant messages at the end, which is continued?
    doubled = [*MESSAGES, {"role": "assistant", "content": "the cat"}, {"role": "assistant", "content": "sat"}]
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="m", messages=doubled, max_tokens=4, temperature=0)
    assert "2 or more assistant messages" in str(refused.value)
    explicit = client.chat.completions.create(
        model="m", messages=doubled, max_tokens=4, temperature=0, extra_body={"continue_final_message": True}
    )
    assert explicit.choices[0].finish_reason in ("stop", "length")
