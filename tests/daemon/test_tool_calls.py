"""Tool calls through the daemon: the chat template gets the tools, mlx-lm's parser reads the calls,
"required" and a named function are enforced by the grammar; the splitter keeps call text out of the
streamed content. Model: the embedded tiny model with a Qwen-style tool template (``tool_model.py``)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from mlxd_protocol import INVALID, Client, DaemonError, Done, Generate, new_request_id

from .conftest import private_endpoint, start_daemon, stop_daemon
from .tool_model import TIME_TOOL, WEATHER_TOOL, make_tool_model

MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def tool_daemon(tmp_path_factory):
    model = make_tool_model(tmp_path_factory.mktemp("tool-model"))
    endpoint = private_endpoint("t")
    process = start_daemon(endpoint, "-m", str(model), "--max-batch", "4")
    yield endpoint, model
    stop_daemon(process, endpoint)


def generate(endpoint: str, stream: bool = True, **fields) -> tuple[Done, str]:
    with Client(endpoint, timeout_s=60) as client:
        replies = list(
            client.generate(Generate(id=new_request_id(), messages=MESSAGES, max_tokens=80, stream=stream, **fields))
        )
    return replies[-1], "".join(reply.text for reply in replies[:-1])


@pytest.mark.parametrize("stream", [True, False])
def test_required_tool_call_is_parsed_with_valid_arguments(tool_daemon, stream):
    done, streamed = generate(tool_daemon[0], stream, tools=[WEATHER_TOOL, TIME_TOOL], tool_choice="required")
    assert done.finish_reason == "stop" and len(done.tool_calls) == 1
    call = done.tool_calls[0]
    tool = {"get_weather": WEATHER_TOOL, "get_time": TIME_TOOL}[call["name"]]
    jsonschema.validate(json.loads(call["arguments"]), tool["function"]["parameters"])
    assert done.text == "" and "<tool_call>" not in streamed  # the call text is not content


def test_named_function_is_the_one_called(tool_daemon):
    done, _ = generate(tool_daemon[0], tools=[WEATHER_TOOL, TIME_TOOL], tool_name="get_time")
    assert [call["name"] for call in done.tool_calls] == ["get_time"]
    jsonschema.validate(json.loads(done.tool_calls[0]["arguments"]), TIME_TOOL["function"]["parameters"])


def test_auto_and_none(tool_daemon):
    auto, _ = generate(tool_daemon[0], tools=[WEATHER_TOOL])
    assert auto.tool_calls is not None  # parsed (the tiny model may or may not call)
    none, _ = generate(tool_daemon[0], tools=[WEATHER_TOOL], tool_choice="none")
    assert none.tool_calls is None
    assert none.usage["prompt_tokens"] < auto.usage["prompt_tokens"]  # the tools were not offered


def test_model_without_tool_calling_is_refused(stories_daemon):
    with pytest.raises(DaemonError) as caught:
        generate(stories_daemon, tools=[WEATHER_TOOL])
    assert caught.value.code == INVALID and "tools: " in str(caught.value)


def test_splitter_holds_call_text_back_across_chunk_boundaries(tool_daemon):
    from mlxd_daemon.tool_calls import ToolCallSplitter
    from mlxd_engine import load

    tokenizer = load(tool_daemon[1]).tokenizer
    text = (
        'Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}\n</tool_call> ok'
    )
    for size in (1, 3, 7, len(text)):
        splitter = ToolCallSplitter(tokenizer, [WEATHER_TOOL])
        shown = "".join(splitter.push(text[i : i + size]) for i in range(0, len(text), size)) + splitter.finish()
        assert shown == splitter.content == "Sure.  ok"
        assert splitter.calls == [{"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "celsius"}'}]
    splitter = ToolCallSplitter(tokenizer, [WEATHER_TOOL])
    assert splitter.push("a <tool") == "a " and splitter.finish() == "<tool"  # a marker that never came
