"""Request bodies of mlx-serve-http, as pydantic models (so /openapi.json is true).

Contract:
    * Request models are strict (``"5"`` is not an int, ``1`` is not a bool) and bound every value to
      what the daemon accepts, so a bad request is answered 400 here and never reaches a daemon.
      Fields without a model field are kept (``extra="allow"``) for ``request_fields``: one that
      OpenAI or llama-server define and mlxd does not implement is refused (400 naming it) unless sent
      at its neutral value; a vendor extension nobody defines is ignored, logged and named in a header.
    * Bodies are read by ``json_body.parse_json`` (no lone surrogates, no integer outside int64, bounded
      nesting); JSON text inside a field (a tool call's ``arguments``) is held to the same rules.
    * Sampling fields left out take the serving daemon's defaults (its ``--temp`` etc.), not OpenAI's:
      ``sampling_overrides()`` returns only what the client set, ``build_sampling`` fills the rest.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from mlxd_protocol import Constraint
from mlxd_protocol.messages import MAX_LOGPROBS

from ..json_body import INT64_MAX, UnsafeJson, parse_json
from .request_parts import (  # noqa: F401  (re-exported: the other body modules build on these)
    MAX_CHOICES,
    MAX_TOKENS_LIMIT,
    FiniteFloat,
    JsonSchemaFormat,
    Prediction,
    PredictionPart,
    RequestBody,
    ResponseFormat,
    SpeculativeOptions,
    StopStrings,
    StreamedProgress,
    StreamOptions,
    StrictModel,
    TemplateKwargs,
    build_sampling,
    check_prompt,
    normalize_stop,
    shared_drafts,
)


class OpenAIGenerationFields(RequestBody):
    """Fields /v1/chat/completions and /v1/completions share (OpenAI's plus our extensions)."""

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS_LIMIT)
    temperature: FiniteFloat | None = Field(None, ge=0, le=2)
    top_p: FiniteFloat | None = Field(None, gt=0, le=1)
    stop: StopStrings = None
    seed: int | None = Field(None, ge=0)
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: FiniteFloat | None = Field(None, ge=-2, le=2)
    frequency_penalty: FiniteFloat | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, FiniteFloat] | None = None
    n: int = 1
    user: str | None = None
    # extensions
    top_k: int | None = Field(None, ge=0)
    min_p: FiniteFloat | None = Field(None, ge=0, le=1)
    repetition_penalty: FiniteFloat | None = Field(None, ge=0)
    repeat_penalty: FiniteFloat | None = Field(None, ge=0)  # llama-server's name for repetition_penalty
    ignore_eos: bool = False  # llama-server's, on every endpoint: keep generating past end-of-sequence tokens
    speculative: SpeculativeOptions | None = None
    response_format: ResponseFormat | None = None
    json_schema: dict | None = None  # llama-server's: the output follows this JSON schema ({}: any JSON)
    grammar: str | None = None  # llama-server's: a GBNF grammar the output follows
    cache_prompt: bool = True  # as llama-server's: False bypasses the daemon's prefix cache
    prediction: Prediction | None = None  # OpenAI's predicted outputs
    # llama-server's: the reply carries __verbose, its native answer (None: the gateway's --verbose-replies)
    verbose: bool | None = None
    # llama-server's name for the token limit on every endpoint (-1: until end of sequence); it wins
    n_predict: int | None = Field(None, ge=-1, le=MAX_TOKENS_LIMIT)
    # llama-server's: a stream sends prompt_progress chunks while the prompt is prefilled
    return_progress: StreamedProgress = False
    # llama-server's: every streamed chunk carries the timings so far (a whole reply always has them)
    timings_per_token: bool = False
    # llama-server's context shift (a daemon with --context-shift): prompt tokens kept (-1: all), and how
    # many after them go (0: half)
    n_keep: int = Field(0, ge=-1)
    n_discard: int = Field(0, ge=0)

    def prediction_text(self) -> str | None:
        return None if self.prediction is None else self.prediction.text()

    @field_validator("n_predict")
    @classmethod
    def _n_predict_predicts(cls, n_predict: int | None) -> int | None:
        if n_predict == 0:
            raise ValueError("must be -1 (until end of sequence) or >= 1")
        return n_predict

    def token_limit(self, server_default: int | None) -> int | None:
        """The most tokens to generate (None: until end of sequence), as llama-server reads it: ``n_predict``
        (-1: no limit), else ``max_completion_tokens``, else ``max_tokens``, else the gateway's
        ``--n-predict`` (``server_default``)."""
        if self.n_predict is not None:
            return None if self.n_predict == -1 else self.n_predict
        given = getattr(self, "max_completion_tokens", None) or self.max_tokens
        return given if given is not None else server_default

    @field_validator("response_format")
    @classmethod
    def _usable_format(cls, value: ResponseFormat | None) -> ResponseFormat | None:
        if value is not None:
            value.to_protocol()  # raises for a json_schema without a schema
        return value

    def constraint_fields_given(self) -> list[str]:
        """The fields asking for a constraint: response_format (but "text"), json_schema, grammar (non-empty)."""
        given = {
            "response_format": self.response_format is not None and self.response_format.type != "text",
            "json_schema": self.json_schema is not None,
            "grammar": bool(self.grammar),
        }
        return [name for name, asked in given.items() if asked]

    @model_validator(mode="after")
    def _one_constraint(self):
        given = self.constraint_fields_given()
        if len(given) > 1:
            raise ValueError(f"give one of response_format, json_schema, grammar; got {' and '.join(given)}")
        return self

    @model_validator(mode="after")
    def _one_repetition_penalty(self):
        both = (self.repetition_penalty, self.repeat_penalty)
        if None not in both and both[0] != both[1]:
            raise ValueError("repeat_penalty and repetition_penalty name the same setting: give one")
        return self

    def constraint_field(self) -> str:
        """The request field the constraint came from (named in a refusal of it)."""
        return next(iter(self.constraint_fields_given()), "response_format")

    def constraint(self) -> Constraint | None:
        """The protocol Constraint this request asks for (``response_format``, llama-server's
        ``json_schema`` or ``grammar``), or None."""
        if self.json_schema is not None:
            return Constraint(kind="json_schema", text=json.dumps(self.json_schema))
        if self.grammar:
            return Constraint(kind="gbnf", text=self.grammar)
        return self.response_format.to_protocol() if self.response_format is not None else None

    @field_validator("n")
    @classmethod
    def _choices_in_range(cls, n: int) -> int:
        if not 1 <= n <= MAX_CHOICES:
            raise ValueError(f"must be in [1, {MAX_CHOICES}]")
        return n

    @field_validator("logit_bias")
    @classmethod
    def _token_id_keys(cls, bias: dict[str, float] | None):
        for key, value in (bias or {}).items():
            # isdigit() alone accepts "²" and other digits int() refuses: ASCII digits only.
            if not (key.isascii() and key.isdigit()) or len(key) > 19 or int(key) > INT64_MAX:
                raise ValueError(f"keys must be token ids (non-negative integers as strings), got {key[:32]!r}")
            if not -100 <= value <= 100:
                raise ValueError(f"bias for token {key} must be in [-100, 100], got {value}")
        return bias

    def sampling_overrides(self, logprobs: int | None) -> dict:
        """The protocol sampling fields this request sets.

        Args:
            logprobs: How many alternatives to report per token (None: no logprobs).

        Returns:
            Protocol ``Sampling`` field -> value, only for fields the client gave.
        """
        given = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "repetition_penalty": self.repeat_penalty if self.repetition_penalty is None else self.repetition_penalty,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "seed": self.seed,
            "logprobs": logprobs,
            "logit_bias": {int(key): value for key, value in self.logit_bias.items()} if self.logit_bias else None,
        }
        return {name: value for name, value in given.items() if value is not None}


# ---- /v1/chat/completions --------------------------------------------------------------------


class TextContentPart(StrictModel):
    type: Literal["text"]
    text: str


class ToolCallFunction(StrictModel):
    name: str
    arguments: str  # JSON text, as OpenAI sends it

    @field_validator("arguments")
    @classmethod
    def _usable_arguments(cls, arguments: str) -> str:
        try:
            parse_json(arguments)
        except json.JSONDecodeError:
            pass  # not JSON: passed on as text
        except UnsafeJson as error:
            raise ValueError(str(error)) from None
        return arguments


class ToolCallIn(StrictModel):
    """A tool call in an earlier assistant message (multi-turn tool use)."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(StrictModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextContentPart] | None = None  # null only for an assistant message with tool_calls
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _content_given(self):
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content is required (null only for an assistant message with tool_calls)")
        return self

    def to_protocol(self, part_separator: str = "\n") -> dict:
        """``{"role", "content"}`` for the daemon's chat template (text parts joined by ``part_separator``: a
        newline, as llama-server joins a message's parts for a template of string contents), plus earlier
        tool calls (arguments as objects, as chat templates expect) and a tool reply's ``tool_call_id``."""
        if isinstance(self.content, str):
            content = self.content
        else:
            content = part_separator.join(part.text for part in self.content or ())
        # Chat templates know "system"; "developer" is OpenAI's newer name for it.
        message: dict = {"role": "system" if self.role == "developer" else self.role, "content": content}
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": _arguments_object(call.function.arguments)},
                }
                for call in self.tool_calls
            ]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


def _arguments_object(arguments: str):
    try:
        return parse_json(arguments)
    except (json.JSONDecodeError, UnsafeJson):
        return arguments


class ToolFunction(StrictModel):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class Tool(StrictModel):
    type: Literal["function"]
    function: ToolFunction

    def to_protocol(self) -> dict:
        function = {"name": self.function.name, "parameters": self.function.parameters or {"type": "object"}}
        if self.function.description is not None:
            function["description"] = self.function.description
        return {"type": "function", "function": function}


class NamedFunction(StrictModel):
    name: str


class NamedToolChoice(StrictModel):
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(OpenAIGenerationFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS_LIMIT)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[Tool] | None = Field(None, max_length=128)
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None  # accepted: "required" asks for exactly one call, "auto" allows several
    # vLLM's: continue the final (assistant) message instead of opening a new turn; None: continue it when
    # the last message is the assistant's (llama-server's assistant prefill)
    continue_final_message: bool | None = None
    add_generation_prompt: bool | None = None  # vLLM's: false only where the final message is continued
    chat_template_kwargs: TemplateKwargs = None

    @model_validator(mode="after")
    def _prefill_possible(self):
        last = self.messages[-1]
        if self.continue_final_message and last.role != "assistant":
            raise ValueError("continue_final_message: the last message must be the assistant's")
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt cannot both be true")
        if self.add_generation_prompt is False and not self.continues_final_message():
            raise ValueError(
                "add_generation_prompt: false is only supported with a final assistant message, which is then continued"
            )
        if (
            self.continue_final_message is None
            and self.continues_final_message()
            and len(self.messages) >= 2
            and self.messages[-2].role == "assistant"
        ):
            # llama-server's rule for its prefill heuristic: which of the two would be continued is unclear
            raise ValueError(
                "cannot have 2 or more assistant messages at the end of the list "
                "(the last one is continued; send continue_final_message: true to continue it anyway)"
            )
        return self

    def protocol_messages(self) -> list[dict]:
        """The messages for the daemon's chat template. The text parts of a continued final message (assistant
        prefill) are joined by a blank line, as llama-server renders the message it continues
        (``common_chat_msg::render_content``); every other message's by a newline."""
        messages = [message.to_protocol() for message in self.messages]
        if self.continues_final_message():
            messages[-1] = self.messages[-1].to_protocol(part_separator="\n\n")
        return messages

    def continues_final_message(self) -> bool:
        """Whether the last message is continued (assistant prefill) rather than followed by a new turn."""
        last = self.messages[-1]
        if last.role != "assistant" or last.content is None or self.add_generation_prompt:
            return False
        return self.continue_final_message is not False

    @field_validator("tool_choice")
    @classmethod
    def _tools_given(cls, choice, info: ValidationInfo):
        tools = info.data.get("tools")
        if choice not in (None, "none", "auto") and not tools:
            raise ValueError("needs tools")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in {
            t.function.name
            for t in tools  # type: ignore[union-attr]  # given: checked above
        }:
            raise ValueError(f"names {choice.function.name!r}, which is not among the tools")
        return choice

    def tool_fields(self) -> dict:
        """The protocol's tools / tool_choice / tool_name for this request (empty without tools, and for
        tool_choice "none": no call can happen, so any model takes the request)."""
        if not self.tools or self.tool_choice == "none":
            return {}
        if isinstance(self.tool_choice, NamedToolChoice):
            return {
                "tools": [tool.to_protocol() for tool in self.tools],
                "tool_choice": "required",
                "tool_name": self.tool_choice.function.name,
            }
        return {"tools": [tool.to_protocol() for tool in self.tools], "tool_choice": self.tool_choice}


# ---- /v1/completions -------------------------------------------------------------------------


class CompletionRequest(OpenAIGenerationFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _one_non_empty_prompt(cls, prompt):
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            if len(prompt) != 1:
                raise ValueError("only one prompt per request is supported")
            prompt = prompt[0]
        return check_prompt(prompt)

    @field_validator("echo", "best_of", "suffix")
    @classmethod
    def _unsupported_options(cls, value, info: ValidationInfo):
        # Refused rather than ignored: each would change what the client gets back.
        problems = {
            "echo": value is True and "echo is not supported",
            "best_of": value not in (None, 1) and "only best_of=1 is supported",
            "suffix": bool(value) and "suffix (fill-in-the-middle) is not supported",
        }
        problem = problems[info.field_name]  # type: ignore[index]  # a field validator's field_name is set
        if problem:
            raise ValueError(problem)
        return value


# ---- /completion (llama-server) --------------------------------------------------------------


class LlamaCompletionRequest(RequestBody):
    prompt: str | list[int]
    n_predict: int = Field(-1, ge=-1, le=MAX_TOKENS_LIMIT)
    temperature: FiniteFloat | None = Field(None, ge=0)
    top_k: int | None = Field(None, ge=0)
    top_p: FiniteFloat | None = Field(None, gt=0, le=1)
    min_p: FiniteFloat | None = Field(None, ge=0, le=1)
    repeat_penalty: FiniteFloat | None = Field(None, ge=0)
    presence_penalty: FiniteFloat | None = None
    frequency_penalty: FiniteFloat | None = None
    stop: StopStrings = None
    seed: int | None = Field(None, ge=-1)
    stream: bool = False
    cache_prompt: bool = True  # False: prefill the whole prompt and keep nothing in the daemon's prefix cache
    ignore_eos: bool = False
    speculative: SpeculativeOptions | None = None
    json_schema: dict | None = None  # llama-server: the output follows this JSON schema ({} : any JSON)
    grammar: str | None = None  # llama-server: a GBNF grammar the output follows
    n_keep: int = Field(0, ge=-1)  # a context shift (daemon --context-shift) keeps these prompt tokens (-1: all)
    n_discard: int = Field(0, ge=0)  # ... and drops this many after them (0: half)

    @field_validator("prompt")
    @classmethod
    def _non_empty_prompt(cls, prompt):
        return check_prompt(prompt)

    @field_validator("grammar")
    @classmethod
    def _one_constraint(cls, grammar: str | None, info: ValidationInfo):
        if grammar and info.data.get("json_schema") is not None:
            raise ValueError("give json_schema or grammar, not both")
        return grammar

    def constraint(self) -> Constraint | None:
        """The protocol Constraint this request asks for (``json_schema`` or ``grammar``), or None."""
        if self.json_schema is not None:
            return Constraint(kind="json_schema", text=json.dumps(self.json_schema))
        if self.grammar:
            return Constraint(kind="gbnf", text=self.grammar)
        return None

    @field_validator("n_predict")
    @classmethod
    def _predict_something(cls, n_predict: int) -> int:
        if n_predict == 0:
            raise ValueError("must be -1 (until end of sequence) or >= 1")
        return n_predict

    def sampling_overrides(self) -> dict:
        """The protocol sampling fields this request sets (seed -1 means random: no seed)."""
        given = {
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "min_p": self.min_p,
            "repetition_penalty": self.repeat_penalty,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "seed": self.seed if self.seed != -1 else None,
        }
        return {name: value for name, value in given.items() if value is not None}
