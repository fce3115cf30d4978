"""Issue 24's acceptance on a real chat model (SmolLM2-135M-Instruct 4-bit) through the real openai client:
response_format json_schema replies validate (nested objects, arrays, enums, required fields, bounded
numbers), streaming and not, with prompt lookup on and off giving identical greedy output; eight concurrent
constrained and free requests in one batch each equal their run alone."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import openai
import pytest

from ..daemon.conftest import private_endpoint, start_daemon, stop_daemon
from ..model_paths import SMOLLM2
from .conftest import Gateway

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not SMOLLM2.is_dir(), reason=f"{SMOLLM2} is not present")]

PERSON = "Alice Smith is 34 years old, lives in Paris, France, and likes chess and tennis."
CASES = {
    "nested": {
        "type": "object",
        "additionalProperties": False,
        "required": ["name", "address"],
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "address": {
                "type": "object",
                "additionalProperties": False,
                "required": ["city", "country"],
                "properties": {
                    "city": {"type": "string", "maxLength": 30},
                    "country": {"type": "string", "maxLength": 30},
                },
            },
        },
    },
    "array": {
        "type": "object",
        "additionalProperties": False,
        "required": ["hobbies"],
        "properties": {
            "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 20}, "minItems": 1, "maxItems": 4}
        },
    },
    "enum": {
        "type": "object",
        "additionalProperties": False,
        "required": ["mood"],
        "properties": {"mood": {"enum": ["happy", "sad", "neutral"]}},
    },
    "bounded numbers": {
        "type": "object",
        "additionalProperties": False,
        "required": ["age", "score"],
        "properties": {
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "score": {"type": "number", "minimum": 0, "maximum": 10},
        },
    },
}
MAX_TOKENS = 60


def fmt(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}


def messages(name: str) -> list[dict]:
    return [{"role": "user", "content": f"Return these fields as JSON ({name}): {PERSON}"}]


@pytest.fixture(scope="module")
def smollm2_gateway():
    endpoint = private_endpoint("s")
    process = start_daemon(endpoint, "-m", str(SMOLLM2), "--max-batch", "8", timeout_s=300)
    gateway = Gateway([endpoint])
    yield gateway
    gateway.stop()
    stop_daemon(process, endpoint)


@pytest.fixture(scope="module")
def client(smollm2_gateway):
    with openai.OpenAI(base_url=f"{smollm2_gateway.url}/v1", api_key="unused", max_retries=0, timeout=300) as c:
        yield c


@pytest.mark.parametrize("name", CASES)
def test_json_schema_replies_validate_streaming_or_not_prompt_lookup_on_or_off(client, name):
    schema = CASES[name]
    replies = []
    for kind in ("none", "prompt-lookup"):
        reply = client.chat.completions.create(
            model="m",
            messages=messages(name),
            max_tokens=MAX_TOKENS,
            temperature=0,
            response_format=fmt(schema),
            extra_body={"speculative": {"kind": kind}},
        )
        assert reply.choices[0].finish_reason == "stop", reply.choices[0].message.content
        jsonschema.validate(json.loads(reply.choices[0].message.content), schema)
        replies.append(reply.choices[0].message.content)
        if kind == "prompt-lookup":  # speculation ran (not turned off for structured output)
            assert reply.model_extra["timings"]["draft_kind"] == "prompt-lookup"
    stream = client.chat.completions.create(
        model="m",
        messages=messages(name),
        max_tokens=MAX_TOKENS,
        temperature=0,
        response_format=fmt(schema),
        stream=True,
        extra_body={"speculative": {"kind": "prompt-lookup"}},
    )
    replies.append("".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices))
    assert replies[0] == replies[1] == replies[2]


def test_eight_concurrent_constrained_and_free_requests_each_equal_alone(smollm2_gateway, client):
    names = list(CASES)
    bodies = []
    for i in range(8):
        name = names[i % len(names)]
        extra = {"response_format": fmt(CASES[name])} if i % 2 == 0 else {}
        bodies.append({"messages": messages(name), "max_tokens": 32, "temperature": 0, **extra})
    alone = [client.chat.completions.create(model="m", **body).choices[0].message.content for body in bodies]

    async def together():
        async with openai.AsyncOpenAI(
            base_url=f"{smollm2_gateway.url}/v1", api_key="unused", max_retries=0, timeout=300
        ) as async_client:
            replies = await asyncio.gather(
                *(async_client.chat.completions.create(model="m", **body) for body in bodies)
            )
        return [reply.choices[0].message.content for reply in replies]

    assert asyncio.run(together()) == alone
    for i in range(0, 8, 2):
        assert alone[i].startswith("{")
