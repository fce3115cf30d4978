"""Bodies of Anthropic's Messages API (``/v1/messages``, ``/v1/messages/count_tokens``) as pydantic models.

Contract:
    * Strict, as ``requests.py``; unlike the OpenAI bodies, a field no model here names is refused (400
      naming it, ``extra="forbid"`` at every level), and a field Anthropic defines that mlxd does not honour
      (``thinking``, ``container``, ``mcp_servers``, a tool's ``input_examples``, ...) is refused with a
      400 saying why, unless sent at its neutral value (``{"type": "disabled"}``, ``[]``, null).
      ``cache_control`` (anywhere) and ``metadata`` are accepted and change nothing: the daemon's prefix
      cache needs no marker.
    * Content is a string or blocks: ``text``, ``tool_use`` (assistant), ``tool_result`` (user; its
      content a string or text blocks; ``is_error`` prefixes it with "Error: "). ``thinking`` and
      ``redacted_thinking`` blocks of earlier turns are dropped, as Anthropic itself drops them from the
      context. Any other block (``image``, ``document``, server-tool blocks) is refused, named.
    * ``chat_conversation()`` turns a body into the daemon's chat messages: ``system`` first, tool_use
      blocks as the assistant's ``tool_calls``, tool_result blocks as ``tool`` messages, consecutive turns
      of one role combined into one (as Anthropic does); a final assistant turn of text is continued
      (prefill). ``tool_fields()`` gives the protocol's tools / tool_choice / tool_name.
    * Responses mirror Anthropic's ``message`` object; usage counts ``input_tokens`` as the prompt tokens
      the daemon prefilled and ``cache_read_input_tokens`` as those its prefix cache supplied.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from mlxd_protocol import Constraint

from .requests import MAX_TOKENS_LIMIT, FiniteFloat, StopStrings

TOOL_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,128}$"
CONTENT_BLOCK_TYPES = ("text", "tool_use", "tool_result", "thinking", "redacted_thinking")


def unsupported(neutral: Callable[[Any], bool], why: str) -> AfterValidator:
    """The validator of a field taking any value: refused (``why``) unless ``neutral(value)``."""

    def check(value: Any) -> Any:
        if not neutral(value):
            raise ValueError(why)
        return value

    return AfterValidator(check)


def _absent(value: Any) -> bool:
    return value is None or value == [] or value == {}


# Fields Anthropic defines and mlxd does not honour, each accepted only at its neutral value.
NoCitations = Annotated[Any, unsupported(_absent, "citations are not supported")]
NoInputExamples = Annotated[Any, unsupported(_absent, "tool input examples are not supported")]
NoDeferredLoading = Annotated[
    Any, unsupported(lambda value: value in (None, False), "deferred tool loading is not supported")
]
DirectCallersOnly = Annotated[
    Any, unsupported(lambda value: value in (None, ["direct"]), "only direct tool calls are supported")
]
NoEffort = Annotated[Any, unsupported(lambda value: value is None, "effort levels are not supported")]
NoThinking = Annotated[
    Any, unsupported(lambda value: value in (None, {"type": "disabled"}), "extended thinking is not supported")
]
NoMcpServers = Annotated[Any, unsupported(_absent, "MCP servers are not supported")]
NoContextManagement = Annotated[Any, unsupported(_absent, "context management is not supported")]
StandardSpeed = Annotated[
    Any, unsupported(lambda value: value in (None, "standard"), 'only "standard" speed is served')
]
StandardTier = Annotated[
    Any,
    unsupported(
        lambda value: value in (None, "standard_only"), 'only "standard_only" is served (there is no priority capacity)'
    ),
]
NoContainer = Annotated[Any, unsupported(_absent, "containers are not supported")]
NoInferenceGeo = Annotated[Any, unsupported(lambda value: value is None, "inference_geo is not supported")]
NoDiagnostics = Annotated[Any, unsupported(_absent, "diagnostics are not supported")]


class AnthropicPart(BaseModel):
    """Base of every Anthropic body and part: strict types, unknown fields refused."""

    model_config = ConfigDict(strict=True, extra="forbid")


class CacheControl(AnthropicPart):
    """Accepted anywhere Anthropic allows it; no effect (the prefix cache is automatic)."""

    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


# ---- content blocks --------------------------------------------------------------------------


class TextBlockIn(AnthropicPart):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None
    citations: NoCitations = None


class ToolUseBlockIn(AnthropicPart):
    """A tool call the assistant made in an earlier turn."""

    type: Literal["tool_use"]
    id: str
    name: str
    input: dict
    cache_control: CacheControl | None = None


class ToolResultBlockIn(AnthropicPart):
    """The client's answer to a tool_use block."""

    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlockIn] = ""
    is_error: bool = False
    cache_control: CacheControl | None = None

    def text(self) -> str:
        text = self.content if isinstance(self.content, str) else "\n".join(block.text for block in self.content)
        return f"Error: {text}" if self.is_error else text


class DroppedBlockIn(BaseModel):
    """A thinking or redacted_thinking block of an earlier turn: accepted and left out of the context."""

    model_config = ConfigDict(extra="allow")
    type: Literal["thinking", "redacted_thinking"]


ContentBlockIn = Annotated[
    TextBlockIn | ToolUseBlockIn | ToolResultBlockIn | DroppedBlockIn, Field(discriminator="type")
]


def _refuse_other_blocks(content: Any, allowed: tuple[str, ...], taken: str) -> None:
    """Name a content block of a type mlxd does not take (before pydantic's generic union error)."""
    if not isinstance(content, list):
        return
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if isinstance(kind, str) and kind not in allowed:
            raise ValueError(f'"{kind[:64]}" content blocks are not supported here ({taken})')


class MessageIn(AnthropicPart):
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlockIn]

    @field_validator("content", mode="before")
    @classmethod
    def _known_blocks(cls, content: Any) -> Any:
        # checked here, before pydantic tries each member of the unions, so the message names the block
        _refuse_other_blocks(content, CONTENT_BLOCK_TYPES, "text, tool_use and tool_result are")
        for block in content if isinstance(content, list) else ():
            if isinstance(block, dict) and block.get("type") == "tool_result":
                _refuse_other_blocks(block.get("content"), ("text",), "a tool_result holds text only")
        return content

    @model_validator(mode="after")
    def _blocks_fit_the_role(self):
        kinds = {block.type for block in self.content} if isinstance(self.content, list) else set()
        if "tool_use" in kinds and self.role != "assistant":
            raise ValueError("tool_use blocks belong in assistant messages")
        if "tool_result" in kinds and self.role != "user":
            raise ValueError("tool_result blocks belong in user messages")
        if self.role == "system" and kinds - {"text"}:
            raise ValueError("a system message holds text only")
        return self

    def to_chat(self) -> list[dict]:
        """This turn as the daemon's chat messages (tool results become ``tool`` messages, in order)."""
        if isinstance(self.content, str):
            return [{"role": self.role, "content": self.content}]
        chat: list[dict] = []
        texts: list[str] = []
        calls: list[dict] = []

        def flush() -> None:
            if texts or calls:
                message: dict = {"role": self.role, "content": "\n".join(texts)}
                if calls:
                    message["tool_calls"] = list(calls)
                chat.append(message)
                texts.clear()
                calls.clear()

        for block in self.content:
            if isinstance(block, TextBlockIn):
                texts.append(block.text)
            elif isinstance(block, ToolUseBlockIn):
                calls.append(
                    {"id": block.id, "type": "function", "function": {"name": block.name, "arguments": block.input}}
                )
            elif isinstance(block, ToolResultBlockIn):
                flush()
                chat.append({"role": "tool", "content": block.text(), "tool_call_id": block.tool_use_id})
        flush()
        return chat


# ---- tools -----------------------------------------------------------------------------------


class ToolDefinition(AnthropicPart):
    """A client tool: name, description, input_schema (server tools are refused, by their type)."""

    name: str = Field(pattern=TOOL_NAME_PATTERN)
    description: str | None = None
    input_schema: dict
    type: Literal["custom"] | None = None
    cache_control: CacheControl | None = None
    strict: bool | None = None  # honoured with tool_choice any / tool (a grammar), refused otherwise
    input_examples: NoInputExamples = None
    defer_loading: NoDeferredLoading = None
    allowed_callers: DirectCallersOnly = None
    eager_input_streaming: bool | None = None  # input_json_delta comes whole, once the call is parsed

    @field_validator("input_schema")
    @classmethod
    def _object_schema(cls, schema: dict) -> dict:
        if schema.get("type") != "object":
            raise ValueError('must be a JSON schema of "type": "object"')
        return schema

    def to_protocol(self) -> dict:
        function = {"name": self.name, "parameters": self.input_schema}
        if self.description is not None:
            function["description"] = self.description
        return {"type": "function", "function": function}


class ToolChoice(AnthropicPart):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None  # honoured: only the first call is kept

    @model_validator(mode="after")
    def _name_with_tool(self):
        if (self.type == "tool") != (self.name is not None):
            raise ValueError('name is given with type "tool", and only then')
        return self


class OutputFormat(AnthropicPart):
    type: Literal["json_schema"]
    schema_: dict = Field(alias="schema")


class OutputConfig(AnthropicPart):
    format: OutputFormat | None = None  # structured output: a grammar the reply follows
    effort: NoEffort = None


class Metadata(AnthropicPart):
    user_id: str | None = None  # accepted, no effect


# ---- request bodies --------------------------------------------------------------------------


@dataclass
class ChatConversation:
    """What the daemon is asked: chat messages, and whether the last (an assistant's) is continued."""

    messages: list[dict]
    continue_final_message: bool


class MessagesInput(AnthropicPart):
    """What /v1/messages and /v1/messages/count_tokens share: the conversation and its tools."""

    model: str
    messages: list[MessageIn] = Field(min_length=1)
    system: str | list[TextBlockIn] | None = None
    tools: list[ToolDefinition] | None = Field(None, max_length=128)
    tool_choice: ToolChoice | None = None
    cache_control: CacheControl | None = None
    output_config: OutputConfig | None = None
    thinking: NoThinking = None
    mcp_servers: NoMcpServers = None
    context_management: NoContextManagement = None
    speed: StandardSpeed = None

    @field_validator("system", mode="before")
    @classmethod
    def _text_system(cls, system: Any) -> Any:
        _refuse_other_blocks(system, ("text",), "text only")
        return system

    @field_validator("tools", mode="before")
    @classmethod
    def _client_tools_only(cls, tools: Any) -> Any:
        for tool in tools if isinstance(tools, list) else ():
            kind = tool.get("type") if isinstance(tool, dict) else None
            if isinstance(kind, str) and kind != "custom":
                raise ValueError(
                    f'server tool "{kind[:64]}" is not supported (only client tools: name, description, input_schema)'
                )
        return tools

    @model_validator(mode="after")
    def _tool_choice_fits(self):
        names = {tool.name for tool in self.tools or ()}
        choice = self.tool_choice
        if choice is not None and choice.type in ("any", "tool") and not names:
            raise ValueError(f'tool_choice "{choice.type}" needs tools')
        if choice is not None and choice.type == "tool" and choice.name not in names:
            raise ValueError(f"tool_choice names {choice.name!r}, which is not among the tools")
        forced = choice is not None and choice.type in ("any", "tool")
        if not forced and any(tool.strict for tool in self.tools or ()):
            raise ValueError('tools: strict is only enforced with tool_choice "any" or "tool"')
        if forced and self.output_config is not None and self.output_config.format is not None:
            raise ValueError('output_config.format cannot be combined with tool_choice "any" or "tool"')
        return self

    def chat_conversation(self) -> ChatConversation:
        """The daemon's chat messages for this body (see the module docstring)."""
        chat: list[dict] = []
        if self.system:
            system = self.system if isinstance(self.system, str) else "\n".join(block.text for block in self.system)
            chat.append({"role": "system", "content": system})
        for message in self.messages:
            for turn in message.to_chat():
                previous = chat[-1] if chat else None
                if previous is not None and previous["role"] == turn["role"] and turn["role"] != "tool":
                    previous["content"] = "\n".join(part for part in (previous["content"], turn["content"]) if part)
                    if "tool_calls" in turn:
                        previous["tool_calls"] = [*previous.get("tool_calls", ()), *turn["tool_calls"]]
                else:
                    chat.append(turn)
        last = chat[-1] if chat else None
        prefill = (
            self.messages[-1].role == "assistant"
            and last is not None
            and last["role"] == "assistant"
            and "tool_calls" not in last
            and bool(last["content"])
        )
        return ChatConversation(chat, prefill)

    def tool_fields(self) -> dict:
        """The protocol's tools / tool_choice / tool_name (empty without tools, and for tool_choice "none")."""
        choice = self.tool_choice.type if self.tool_choice is not None else "auto"
        if not self.tools or choice == "none":
            return {}
        tools = [tool.to_protocol() for tool in self.tools]
        if choice == "tool":
            assert self.tool_choice is not None  # choice is its type
            return {"tools": tools, "tool_choice": "required", "tool_name": self.tool_choice.name}
        return {"tools": tools, "tool_choice": "required" if choice == "any" else "auto"}

    def constraint(self) -> Constraint | None:
        """The structured-output constraint of ``output_config.format``, or None."""
        output_format = self.output_config.format if self.output_config is not None else None
        return None if output_format is None else Constraint(kind="json_schema", text=json.dumps(output_format.schema_))


class MessagesRequest(MessagesInput):
    """POST /v1/messages."""

    max_tokens: int = Field(ge=1, le=MAX_TOKENS_LIMIT)
    stop_sequences: StopStrings = None
    temperature: FiniteFloat | None = Field(None, ge=0, le=1)
    top_p: FiniteFloat | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    stream: bool = False
    metadata: Metadata | None = None
    service_tier: StandardTier = None
    container: NoContainer = None
    inference_geo: NoInferenceGeo = None
    diagnostics: NoDiagnostics = None

    @field_validator("stop_sequences")
    @classmethod
    def _a_list(cls, stop: Any) -> Any:
        if isinstance(stop, str):
            raise ValueError("must be a list of strings")
        return stop

    def sampling_overrides(self) -> dict:
        """The protocol sampling fields this request sets (the rest are the daemon's defaults)."""
        given = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}
        return {name: value for name, value in given.items() if value is not None}

    def keeps_one_call(self) -> bool:
        """Whether only the model's first tool call is answered (``disable_parallel_tool_use``)."""
        return bool(self.tool_choice is not None and self.tool_choice.disable_parallel_tool_use)


class CountTokensRequest(MessagesInput):
    """POST /v1/messages/count_tokens."""


# ---- responses -------------------------------------------------------------------------------


class TextContent(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ToolUseContent(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str  # "toolu_..."
    name: str
    input: dict


class MessageUsage(BaseModel):
    input_tokens: int  # prompt tokens prefilled (the rest came from the prefix cache)
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0  # prompt tokens the daemon's prefix cache supplied


StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class AnthropicMessage(BaseModel):
    """Anthropic's ``message`` object (also, empty, in the stream's message_start)."""

    id: str  # "msg_..."
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[TextContent | ToolUseContent]
    stop_reason: StopReason | None
    stop_sequence: str | None = None
    usage: MessageUsage


class TokenCount(BaseModel):
    input_tokens: int


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicErrorResponse(BaseModel):
    type: Literal["error"] = "error"
    error: AnthropicErrorDetail
