"""Thinking on / off in chat templates (``mlxd --reasoning``, ``chat_template_kwargs``): the rules, the
tokens a rendering gives, and the daemon's answers through the protocol."""

from __future__ import annotations

import datetime
import json

import jinja2
import pytest

from mlxd_daemon.edge import chat_tokens, render_chat, rendered_chat_tokens, without_bos_text
from mlxd_daemon.reasoning import (
    close_open_thinking,
    template_variables,
    thinking_off,
    today_variables,
    tool_list_variables,
)
from mlxd_protocol import Client, Generate, ProtocolError, Tokenize, new_request_id
from mlxd_protocol.codec import encode

from .conftest import STORIES, private_endpoint, start_daemon, stop_daemon

# a DeepSeek-R1-like template: its generation prompt opens a thinking block itself
FORCED_OPEN = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|><think>\n{% endif %}"
)
# a Qwen3-like template: enable_thinking false writes an empty block, anything else leaves it to the model
QWEN3_LIKE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and "
    "enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


def test_modes_set_enable_thinking_and_a_request_overrides_them():
    assert template_variables("auto", None) == template_variables("on", None) == {"enable_thinking": True}
    assert template_variables("off", {"enable_thinking": True, "x": 1}) == {"enable_thinking": True, "x": 1}
    assert thinking_off(template_variables("off", None)) and not thinking_off({})


@pytest.mark.parametrize(
    "prompt,template,expected",
    [
        ("<|assistant|><think>\n", FORCED_OPEN, "<|assistant|><think>\n</think>"),  # an open block is closed
        (
            "<|im_start|>assistant\n<think>\n\n</think>\n\n",
            QWEN3_LIKE,
            "<|im_start|>assistant\n<think>\n\n</think>\n\n",
        ),
        (
            "<|CHATBOT_TOKEN|>",
            "{{ '<|START_THINKING|>' }}{{ '<|END_THINKING|>' }}",
            "<|CHATBOT_TOKEN|><|START_THINKING|><|END_THINKING|>",
        ),  # a template that knows a block: an empty one
        ("<|im_start|>assistant\n", "no thinking here", "<|im_start|>assistant\n"),
        ("<|im_start|>assistant\n", None, "<|im_start|>assistant\n"),
    ],
)
def test_close_open_thinking(prompt, template, expected):
    assert close_open_thinking(prompt, template) == expected


def test_rendered_tokens_are_the_templates_own(embedded_model):
    """chat_tokens (render, then encode) gives what the tokenizer's own chat-template tokenizing gives."""
    tokenizer = embedded_model.tokenizer
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi, twice."}]
    assert chat_tokens(tokenizer, messages) == list(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    text = render_chat(tokenizer, messages, add_generation_prompt=False)
    assert text == tokenizer.apply_chat_template(messages, add_generation_prompt=False, tokenize=False)


@pytest.fixture(scope="module")
def thinking_daemon():
    """stories260K with a forced-open thinking template and --reasoning off."""
    if not STORIES.is_dir():
        pytest.skip(f"{STORIES} is not present")
    endpoint = private_endpoint("r")
    process = start_daemon(endpoint, "-m", str(STORIES), "--chat-template", FORCED_OPEN, "--reasoning", "off")
    yield endpoint
    stop_daemon(process, endpoint)


def test_the_daemon_closes_the_block_unless_the_request_asks_for_thinking(thinking_daemon):
    messages = [{"role": "user", "content": "What is today?"}]
    with Client(thinking_daemon, timeout_s=30) as client:
        closed = client.render_chat(messages)
        assert closed.endswith("<|assistant|><think>\n</think>")
        assert client.render_chat(messages, chat_template_kwargs={"enable_thinking": True}).endswith("<think>\n")
        assert not client.render_chat(messages, add_generation_prompt=False).endswith("</think>")
        tokens = client.tokenize(messages=messages)
        # the rendered text leaves out the BOS text the tokenizer adds itself (llama-server's /apply-template)
        assert tokens == client.tokenize(text=closed, add_special_tokens=True)
        # a Generate of the same messages is prompted with those tokens
        replies = list(client.generate(Generate(id=new_request_id(), messages=messages, max_tokens=1)))
        assert replies[-1].usage["prompt_tokens"] == len(tokens)
        opened = list(
            client.generate(
                Generate(
                    id=new_request_id(), messages=messages, max_tokens=1, chat_template_kwargs={"enable_thinking": True}
                )
            )
        )
        assert opened[-1].usage["prompt_tokens"] == len(
            client.tokenize(text=closed.removesuffix("</think>"), add_special_tokens=True)
        )


@pytest.mark.parametrize(
    "fields,problem",
    [
        ({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"tools": []}}, "set by the request"),
        ({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"not a name": 1}}, "identifiers"),
        ({"text": "x", "chat_template_kwargs": {"a": 1}}, "with messages only"),
        ({"text": "x", "return_text": True}, "with messages only"),
        ({"messages": [{"role": "user", "content": "x"}], "continue_final_message": True}, "the assistant's"),
    ],
)
def test_bad_template_fields_are_refused(fields, problem):
    with pytest.raises(ProtocolError, match=problem):
        encode(Tokenize(**fields))


# a FireFunction-v2-like template: the tools come as the text of a `functions` variable, the date as `datetime`
FUNCTIONS_TEMPLATE = (
    "{% set suffix = 'Available functions:\\n' + functions + '\\nToday is ' + datetime + '.' %}"
    "<|system|>{{ suffix }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
)


def test_server_given_template_variables_only_where_the_template_reads_them():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert tool_list_variables(FUNCTIONS_TEMPLATE, tools) == {"functions": json.dumps(tools, indent=2)}
    assert tool_list_variables(FUNCTIONS_TEMPLATE, None) == {"functions": ""}
    # "functions" in the text but not a variable the template reads
    assert tool_list_variables("{{ 'call functions' }}{% set functions = 1 %}{{ functions }}", tools) == {}
    assert tool_list_variables(QWEN3_LIKE, tools) == {} and tool_list_variables(None, tools) == {}
    assert set(today_variables(FUNCTIONS_TEMPLATE)) == {"datetime"}


class _Renderer:
    """The least of a tokenizer ``render_chat`` needs: a template and its rendering with jinja2."""

    chat_template = FUNCTIONS_TEMPLATE

    def apply_chat_template(self, messages, add_generation_prompt, tokenize, **variables):
        return jinja2.Environment().from_string(self.chat_template).render(messages=messages, **variables)


def test_a_functions_template_renders_the_tools_and_todays_date():
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    text = render_chat(_Renderer(), [{"role": "user", "content": "hi"}], tools)
    assert '"name": "get_weather"' in text and datetime.date.today().strftime("%b %d %Y") in text
    assert "Available functions:\n\nToday" in render_chat(_Renderer(), [{"role": "user", "content": "hi"}])


def test_a_chat_starts_with_one_bos_where_the_tokenizer_adds_it():
    """llama-server's rule: the template's leading BOS text is dropped and the BOS id put first, so a template
    without ``bos_token`` gets BOS too, and one with it gets it once."""
    from transformers import AutoTokenizer

    if not STORIES.is_dir():
        pytest.skip(f"{STORIES} is not present")
    tokenizer = AutoTokenizer.from_pretrained(str(STORIES))
    bos = tokenizer.bos_token_id
    plain = rendered_chat_tokens(tokenizer, "This is not a chat template, it is")
    assert plain == [bos, *tokenizer.encode("This is not a chat template, it is", add_special_tokens=False)]
    assert rendered_chat_tokens(tokenizer, "<s>This is not a chat template, it is") == plain
    assert without_bos_text(tokenizer, "<s>hi") == "hi" and without_bos_text(tokenizer, "hi") == "hi"
