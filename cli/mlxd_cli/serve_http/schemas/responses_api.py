"""OpenAI's Responses API (``/v1/responses``) as pydantic models: the request and the response object.

Contract:
    * ``ResponsesRequest`` is strict and bounded like the chat request (``requests.py``); fields OpenAI
      defines that mlxd does not implement stay in ``model_extra`` for the route's refusal table.
    * ``input`` is a string (one user message) or a list of items: messages (role user / system /
      developer / assistant; content a string or ``input_text`` / ``output_text`` parts), ``function_call``
      items (an earlier call of the model) and ``function_call_output`` items (the tool's answer). Any other
      item or part type is refused here, by its path in the body.
    * ``conversation_messages(items)`` turns items into the daemon's chat messages (the chat template's
      tool calls and tool messages); consecutive calls after an assistant message join that turn.
    * The answer is a ``ResponseObject`` whose ``output`` holds a ``message`` item (the text) and one
      ``function_call`` item per call; ``timings`` is an extension. Unset optional fields are left out.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Discriminator, Field, Tag, ValidationInfo, field_validator

from ..json_body import UnsafeJson, parse_json
from .requests import (
    MAX_TOKENS_LIMIT,
    ChatMessage,
    FiniteFloat,
    JsonSchemaFormat,
    RequestBody,
    ResponseFormat,
    SpeculativeOptions,
    StopStrings,
    StrictModel,
    Tool,
    ToolCallFunction,
    ToolCallIn,
    ToolFunction,
)

MAX_METADATA_PAIRS, MAX_METADATA_KEY_CHARS, MAX_METADATA_VALUE_CHARS = 16, 64, 512  # OpenAI's bounds
TEXT_PART_TYPES = ("input_text", "output_text")


# ---- input items -----------------------------------------------------------------------------


class TextPart(StrictModel):
    """A text part of a message: ``input_text`` (user, system) or ``output_text`` (an earlier answer)."""

    type: str
    text: str

    @field_validator("type")
    @classmethod
    def _text_only(cls, kind: str) -> str:
        if kind not in TEXT_PART_TYPES:
            raise ValueError(f"{kind[:40]!r} parts are not supported (only {' and '.join(TEXT_PART_TYPES)})")
        return kind


def _joined(content: str | list[TextPart]) -> str:
    return content if isinstance(content, str) else "".join(part.text for part in content)


class MessageItem(StrictModel):
    """A message of the conversation (``type`` may be left out, as OpenAI's easy input message)."""

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: list[TextPart] | str


class FunctionCallItem(StrictModel):
    """A function call the model made earlier (as the ``function_call`` output item it came as)."""

    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str  # JSON text

    @field_validator("arguments")
    @classmethod
    def _usable_arguments(cls, arguments: str) -> str:
        try:
            parse_json(arguments)  # held to the body's rules; text that is not JSON is passed on as text
        except json.JSONDecodeError:
            pass
        except UnsafeJson as error:
            raise ValueError(str(error)) from None
        return arguments


class FunctionCallOutputItem(StrictModel):
    """What the application's function answered to the call ``call_id``."""

    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: list[TextPart] | str


# Item type -> its tag; capitalised so error locations name the field, not the union member.
_ITEM_TAGS = {"message": "Message", "function_call": "FunctionCall", "function_call_output": "FunctionCallOutput"}


def _item_tag(item: Any) -> str | None:
    kind = item.get("type", "message") if isinstance(item, dict) else getattr(item, "type", "message")
    return _ITEM_TAGS.get(kind) if isinstance(kind, str) else None


InputItem = Annotated[
    Annotated[MessageItem, Tag("Message")]
    | Annotated[FunctionCallItem, Tag("FunctionCall")]
    | Annotated[FunctionCallOutputItem, Tag("FunctionCallOutput")],
    Discriminator(
        _item_tag,
        custom_error_type="item_type",
        custom_error_message="items are of type message, function_call or function_call_output only",
    ),
]


def conversation_messages(items: Sequence[MessageItem | FunctionCallItem | FunctionCallOutputItem]) -> list[dict]:
    """The daemon's chat messages for Responses input items.

    Args:
        items: Messages, earlier function calls and their outputs, in conversation order.

    Returns:
        Protocol chat messages: a function call joins the assistant message just before it (one turn
        with text and calls), else it starts an assistant turn of its own; an output is a ``tool`` message.
    """
    turns: list[ChatMessage] = []
    for item in items:
        if isinstance(item, MessageItem):
            turns.append(ChatMessage(role=item.role, content=_joined(item.content)))
        elif isinstance(item, FunctionCallItem):
            call = ToolCallIn(id=item.call_id, function=ToolCallFunction(name=item.name, arguments=item.arguments))
            if turns and turns[-1].role == "assistant":
                turns[-1].tool_calls = [*(turns[-1].tool_calls or ()), call]
            else:
                turns.append(ChatMessage(role="assistant", content="", tool_calls=[call]))
        else:
            turns.append(ChatMessage(role="tool", content=_joined(item.output), tool_call_id=item.call_id))
    return [turn.to_protocol() for turn in turns]


# ---- request ---------------------------------------------------------------------------------


class FunctionTool(StrictModel):
    """A function the model may call, in the Responses API's flat shape."""

    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None

    def to_protocol(self) -> dict:
        """The protocol's (chat-shaped) tool definition."""
        function = ToolFunction(name=self.name, description=self.description, parameters=self.parameters)
        return Tool(type="function", function=function).to_protocol()


class FunctionToolChoice(StrictModel):
    type: Literal["function"]
    name: str


class TextFormat(StrictModel):
    """``text.format``: plain text, any JSON object, or JSON following ``schema``."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict | None = Field(None, alias="schema")
    strict: bool | None = None

    def response_format(self) -> ResponseFormat:
        """The chat endpoint's ``response_format`` asking for the same constraint."""
        schema = JsonSchemaFormat(name=self.name, description=self.description, schema=self.schema_, strict=self.strict)
        return ResponseFormat(type=self.type, json_schema=schema if self.type == "json_schema" else None)


class TextConfig(StrictModel):
    format: TextFormat | None = None
    verbosity: str | None = None

    @field_validator("format")
    @classmethod
    def _usable_format(cls, value: TextFormat | None) -> TextFormat | None:
        if value is not None and value.type == "json_schema" and value.schema_ is None:
            raise ValueError('type "json_schema" needs a schema')
        return value

    @field_validator("verbosity")
    @classmethod
    def _no_verbosity(cls, verbosity: str | None) -> str | None:
        if verbosity is not None:
            raise ValueError("verbosity is not supported")
        return verbosity


class ResponsesStreamOptions(StrictModel):
    include_obfuscation: bool | None = None  # accepted: no obfuscation padding is ever sent


class ResponsesRequest(RequestBody):
    """``POST /v1/responses`` (OpenAI's fields, then mlxd's extensions, as on the chat endpoint)."""

    model: str | None = None
    input: list[InputItem] | str  # the list first: its errors name the item and field at fault
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS_LIMIT)
    temperature: FiniteFloat | None = Field(None, ge=0, le=2)
    top_p: FiniteFloat | None = Field(None, gt=0, le=1)
    text: TextConfig | None = None
    tools: list[FunctionTool] | None = Field(None, max_length=128)
    tool_choice: Literal["auto", "none", "required"] | FunctionToolChoice | None = None
    parallel_tool_calls: bool | None = None  # accepted: "required" asks for exactly one call, "auto" allows several
    stream: bool | None = None
    stream_options: ResponsesStreamOptions | None = None
    store: bool | None = None  # None: True, as OpenAI's
    previous_response_id: str | None = Field(None, min_length=1, max_length=128)
    metadata: dict[str, str] | None = None
    # extensions (as on /v1/chat/completions)
    top_k: int | None = Field(None, ge=0)
    min_p: FiniteFloat | None = Field(None, ge=0, le=1)
    repetition_penalty: FiniteFloat | None = Field(None, ge=0)
    presence_penalty: FiniteFloat | None = Field(None, ge=-2, le=2)
    frequency_penalty: FiniteFloat | None = Field(None, ge=-2, le=2)
    seed: int | None = Field(None, ge=0)
    stop: StopStrings = None
    speculative: SpeculativeOptions | None = None
    cache_prompt: bool = True

    @field_validator("input")
    @classmethod
    def _some_input(cls, value):
        if not value:
            raise ValueError("must not be empty")
        return value

    @field_validator("metadata")
    @classmethod
    def _bounded_metadata(cls, metadata: dict[str, str] | None):
        pairs = (metadata or {}).items()
        if len(pairs) > MAX_METADATA_PAIRS or any(
            len(key) > MAX_METADATA_KEY_CHARS or len(value) > MAX_METADATA_VALUE_CHARS for key, value in pairs
        ):
            raise ValueError(
                f"at most {MAX_METADATA_PAIRS} pairs, keys of at most {MAX_METADATA_KEY_CHARS} "
                f"characters, values of at most {MAX_METADATA_VALUE_CHARS}"
            )
        return metadata

    @field_validator("tool_choice")
    @classmethod
    def _tools_given(cls, choice, info: ValidationInfo):
        tools = info.data.get("tools")
        if choice not in (None, "none", "auto") and not tools:
            raise ValueError("needs tools")
        if isinstance(choice, FunctionToolChoice) and choice.name not in {
            tool.name
            for tool in tools  # type: ignore[union-attr]  # given: checked above
        }:
            raise ValueError(f"names {choice.name!r}, which is not among the tools")
        return choice

    def input_items(self) -> list[MessageItem | FunctionCallItem | FunctionCallOutputItem]:
        """``input`` as items (a string is one user message)."""
        return [MessageItem(role="user", content=self.input)] if isinstance(self.input, str) else list(self.input)

    def tool_fields(self) -> dict:
        """The protocol's tools / tool_choice / tool_name (empty without tools)."""
        if not self.tools:
            return {}
        tools = [tool.to_protocol() for tool in self.tools]
        if isinstance(self.tool_choice, FunctionToolChoice):
            return {"tools": tools, "tool_choice": "required", "tool_name": self.tool_choice.name}
        return {"tools": tools, "tool_choice": self.tool_choice}


# ---- response --------------------------------------------------------------------------------


def _exclude_none(value: Any) -> bool:
    return value is None


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list = Field(default_factory=list)
    logprobs: list = Field(default_factory=list)


class OutputMessage(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[OutputText]


class FunctionCallOutput(BaseModel):
    """A ``function_call`` output item: the model asks the application to run ``name``."""

    id: str
    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str  # JSON text
    status: Literal["in_progress", "completed", "incomplete"] = "completed"


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens taken from the prefix cache


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseObject(BaseModel):
    """OpenAI's response object (``"object": "response"``), also the snapshot streamed events carry."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    model: str
    output: list[OutputMessage | FunctionCallOutput] = Field(default_factory=list)
    usage: ResponseUsage | None = None
    error: dict | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    parallel_tool_calls: bool = True
    tool_choice: str | dict = "auto"
    tools: list[dict] = Field(default_factory=list)
    text: dict = Field(default_factory=lambda: {"format": {"type": "text"}})
    truncation: Literal["disabled"] = "disabled"
    previous_response_id: str | None = None
    store: bool = True
    metadata: dict[str, str] = Field(default_factory=dict)
    timings: dict | None = Field(None, exclude_if=_exclude_none, description="the daemon's timings (extension)")


class DeletedResponse(BaseModel):
    id: str
    object: Literal["response"] = "response"
    deleted: bool = True
