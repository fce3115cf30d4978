"""Tool calls: the model's own format (through its chat template), parsed with mlx-lm's tool parsers.

Contract: a Generate with ``tools`` needs a tokenizer for which mlx-lm knows a tool-call format
(``tokenizer.has_tool_calling``: start and end markers and a parser in ``mlx_lm/tool_parsers``); else it
is refused (``tool_support_problem``). The tools go to the chat template (``tool_choice`` "none": they do
not, and nothing is parsed). ``ToolCallSplitter`` sits on the request's text stream: text inside a
tool call (from the start marker to the end marker) is held back from the streamed content, and each
finished call is parsed with the model's mlx-lm parser into ``{"name", "arguments"}``; the Done carries
the content without the calls and the list of calls.

``tool_choice`` "required" or a named function is enforced with the grammar of structured output:
``required_call_grammar`` writes a Lark grammar (llguidance's, with an inline JSON schema) for exactly one
call in the model's format, ``start marker {"name": <one of the tools>, "arguments": <its parameters>}
end marker``. Only the JSON-in-markers format (mlx-lm's ``json_tools`` parser) has such a grammar here;
other formats are refused for "required" (they still work with "auto").

Worked example (json_tools): the model writes ``Sure.<tool_call>{"name": "get_weather", "arguments":
{"city": "Paris"}}</tool_call>``; the content is ``Sure.`` and the calls are
``[{"name": "get_weather", "arguments": {"city": "Paris"}}]``.
"""

from __future__ import annotations

import json
from typing import Any

from mlxd_engine import JSON_LAYOUT

JSON_TOOLS_PARSER = "mlx_lm.tool_parsers.json_tools"


def tool_support_problem(tokenizer) -> str | None:
    """Why this model cannot take tools (None when it can)."""
    if not getattr(tokenizer, "has_chat_template", False):
        return "this model cannot be given tools: it lacks a chat template"
    if not getattr(tokenizer, "has_tool_calling", False):
        return (
            "this model does not support tool calling: mlx-lm finds no tool-call format in its chat "
            "template or vocabulary"
        )
    return None


def _call_schema(tool: dict) -> dict:
    function = tool.get("function", tool)
    parameters = function.get("parameters") or {"type": "object"}
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["name", "arguments"],
        "properties": {"name": {"const": function["name"]}, "arguments": parameters},
    }


def required_call_grammar(tokenizer, tools: list[dict], name: str | None) -> str:
    """The Lark grammar of exactly one tool call (of the named function, or of any of ``tools``).

    Raises:
        ValueError: the named function is not among the tools, or the model's call format has no grammar here.
    """
    parser = getattr(tokenizer, "tool_parser", None)
    if getattr(parser, "__module__", None) != JSON_TOOLS_PARSER:
        raise ValueError(
            "tool_choice 'required' or a named function is supported only for models whose tool "
            "calls are JSON between markers (mlx-lm's json_tools format)"
        )
    chosen = [tool for tool in tools if name is None or tool.get("function", tool).get("name") == name]
    if not chosen:
        raise ValueError(f"tool_choice names {name!r}, which is not among the tools")
    schemas = [_call_schema(tool) for tool in chosen]
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    schema["x-guidance"] = JSON_LAYOUT  # JSON as json.dumps writes it, as in structured output
    # the markers on lines of their own, as the json_tools templates write them
    start, end = json.dumps(tokenizer.tool_call_start + "\n"), json.dumps("\n" + tokenizer.tool_call_end)
    return f"start: {start} %json {json.dumps(schema)} {end}\n"


class ToolCallSplitter:
    """Splits streamed text into content and tool calls (see the module docstring)."""

    def __init__(self, tokenizer, tools: list[dict]):
        self.start, self.end = tokenizer.tool_call_start, tokenizer.tool_call_end
        self.parser = tokenizer.tool_parser
        self.tools = tools
        self.calls: list[dict[str, Any]] = []
        self.content = ""  # everything shown as content so far
        self._pending = ""  # text not yet judged: a possible start of a marker, or a call in progress
        self._in_call = False

    def push(self, text: str) -> str:
        """Take streamed text; return the part that is content and safe to show now."""
        self._pending += text
        shown = []
        while True:
            if self._in_call:
                at = self._pending.find(self.end)
                if at < 0:
                    break
                self._finish_call(self._pending[:at])
                self._pending = self._pending[at + len(self.end) :]
                self._in_call = False
                continue
            at = self._pending.find(self.start)
            if at >= 0:
                shown.append(self._pending[:at])
                self._pending = self._pending[at + len(self.start) :]
                self._in_call = True
                continue
            keep = self._marker_prefix_length(self._pending)
            shown.append(self._pending[: len(self._pending) - keep])
            self._pending = self._pending[len(self._pending) - keep :]
            break
        piece = "".join(shown)
        self.content += piece
        return piece

    def finish(self) -> str:
        """End of output: a call left open is parsed as it stands (kept as content if it does not parse:
        cut off by max_tokens); held-back text that was no marker is content."""
        if self._in_call:
            self._finish_call(self._pending, closed=False)
            piece = ""
        else:
            piece = self._pending
        self._pending, self._in_call = "", False
        self.content += piece
        return piece

    def _marker_prefix_length(self, text: str) -> int:
        for size in range(min(len(self.start) - 1, len(text)), 0, -1):
            if self.start.startswith(text[-size:]):
                return size
        return 0

    def _finish_call(self, body: str, closed: bool = True) -> None:
        try:
            parsed = self.parser(body, self.tools)
        except Exception:  # noqa: BLE001 - a malformed or cut-off call: keep its text as content
            self.content += self.start + body + (self.end if closed else "")
            return
        for call in parsed if isinstance(parsed, list) else [parsed]:
            if isinstance(call, dict) and "name" in call:
                arguments = call.get("arguments", {})
                self.calls.append(
                    {
                        "name": str(call["name"]),
                        "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                    }
                )
