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
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from mlxd_protocol import Constraint, Sampling, Speculative
from mlxd_protocol.field_checks import MAX_LIST_ITEMS
from mlxd_protocol.messages import (
    MAX_DRAFT_LIMIT,
    MAX_EMBED_INPUTS,
    MAX_LOGPROBS,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    check_template_kwargs,
)

from ..json_body import INT64_MAX, UnsafeJson, parse_json

MAX_TOKENS_LIMIT = MAX_LIST_ITEMS  # the protocol's bound on max_tokens; larger is refused
MAX_CHOICES = 32  # n: each choice is a generation of its own on the daemons
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
# Sampling fields the daemon reports as its defaults (Status.options["sampling"]).
_SAMPLING_FIELDS = frozenset(Sampling.__dataclass_fields__)


class StrictModel(BaseModel):
    """Base of nested request parts: strict types, unknown fields ignored."""

    model_config = ConfigDict(strict=True, extra="ignore")


class RequestBody(StrictModel):
    """Base of request bodies: strict types; fields without a model field are kept for ``request_fields``."""

    model_config = ConfigDict(strict=True, extra="allow")


# ---- shared request parts --------------------------------------------------------------------


def _template_kwargs(value: dict | None) -> dict | None:
    if value is not None:
        check_template_kwargs(value)  # the protocol's rule, checked here for a 400 that names the field
    return value


# vLLM's and llama-server's chat_template_kwargs: extra chat-template variables, e.g. {"enable_thinking": false}
TemplateKwargs = Annotated[dict[str, Any] | None, AfterValidator(_template_kwargs)]


class SpeculativeOptions(StrictModel):
    """Extension: ask for (or refuse) prompt-lookup speculative decoding; never changes the output."""

    kind: Literal["prompt-lookup", "none"]
    max_draft: int | None = Field(None, ge=0, le=MAX_DRAFT_LIMIT)
    shared_drafts: bool = True  # false: no drafts from the daemon's store of earlier requests' outputs

    def to_protocol(self) -> Speculative:
        """The protocol's Speculative value."""
        return Speculative(kind=self.kind, max_draft=self.max_draft)


def shared_drafts(speculative: SpeculativeOptions | None) -> bool:
    """Generate.shared_drafts for a request's ``speculative`` extension (on unless it says false)."""
    return speculative.shared_drafts if speculative is not None else True


class JsonSchemaFormat(StrictModel):
    """OpenAI's ``response_format.json_schema``: the schema the reply must follow."""

    name: str | None = None
    description: str | None = None
    schema_: dict | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(StrictModel):
    """OpenAI's ``response_format``: "text" (no constraint), "json_object" or "json_schema".

    llama-server's extension: ``{"type": "json_object", "schema": {...}}`` constrains the reply to that
    schema (as ``json_schema`` would), not merely to some JSON object.
    """

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None
    schema_: dict | None = Field(None, alias="schema")

    def to_protocol(self) -> Constraint | None:
        """The protocol's Constraint (None for "text"); a json_schema without its schema is refused."""
        if self.type == "text":
            return None
        if self.type == "json_object":
            if self.schema_ is not None:
                return Constraint(kind="json_schema", text=json.dumps(self.schema_))
            return Constraint(kind="json_object")
        if self.json_schema is None or self.json_schema.schema_ is None:
            raise ValueError('type "json_schema" needs json_schema.schema')
        return Constraint(kind="json_schema", text=json.dumps(self.json_schema.schema_))


class StreamOptions(StrictModel):
    include_usage: bool = False


def normalize_stop(stop: str | list[str] | None) -> list[str]:
    """Stop strings as a list; empty strings dropped (they could only match everywhere).

    Args:
        stop: A string, a list of strings, or None.

    Returns:
        The non-empty stop strings.
    """
    if stop is None:
        return []
    strings = [stop] if isinstance(stop, str) else stop
    if len(strings) > MAX_STOP_STRINGS:
        raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings")
    if any(len(string) > MAX_STOP_CHARS for string in strings):
        raise ValueError(f"each stop string at most {MAX_STOP_CHARS} characters")
    return [string for string in strings if string]


def _check_stop(stop: str | list[str] | None) -> str | list[str] | None:
    normalize_stop(stop)  # raises for too many
    return stop


StopStrings = Annotated[str | list[str] | None, AfterValidator(_check_stop)]


def _progress_is_streamed(return_progress: bool, info: ValidationInfo) -> bool:
    if return_progress and not info.data.get("stream"):
        raise ValueError("prompt progress is sent in a stream: needs stream: true")
    return return_progress


# llama-server's return_progress: prompt_progress events while the prompt is prefilled, so only in a stream
# (the model's stream field comes before it)
StreamedProgress = Annotated[bool, AfterValidator(_progress_is_streamed)]


def check_prompt(prompt: str | list[int]) -> str | list[int]:
    """Refuse an empty prompt or a negative token id (raises ValueError); return the prompt."""
    if not prompt:
        raise ValueError("the prompt must not be empty")
    if isinstance(prompt, list) and min(prompt) < 0:
        raise ValueError("token ids must be >= 0")
    return prompt


def build_sampling(overrides: dict, daemon_defaults: dict | None) -> Sampling | None:
    """The Sampling to send: the client's settings over the daemon's defaults.

    Args:
        overrides: Protocol sampling fields the client set (``sampling_overrides()``).
        daemon_defaults: ``Status.options["sampling"]`` of the daemon that will serve the request.

    Returns:
        None when the client set nothing (the daemon then applies its defaults itself), else a
        Sampling; a protocol Sampling replaces the daemon's defaults whole, hence the merge.
    """
    if not overrides:
        return None
    merged = {name: value for name, value in (daemon_defaults or {}).items() if name in _SAMPLING_FIELDS}
    merged.update(overrides)
    return Sampling(**merged)


class PredictionPart(BaseModel):
    type: Literal["text"]
    text: str


class Prediction(BaseModel):
    """OpenAI's ``prediction``: ``{"type": "content", "content": "..." | [{"type": "text", "text": "..."}]}``."""

    type: Literal["content"]
    content: str | list[PredictionPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


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
            "repetition_penalty": self.repetition_penalty,
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

    def to_protocol(self) -> dict:
        """``{"role", "content"}`` for the daemon's chat template (text parts joined by a newline, as
        llama-server joins them), plus earlier tool calls (arguments as objects, as chat templates expect)
        and a tool reply's ``tool_call_id``."""
        content = self.content if isinstance(self.content, str) else "\n".join(part.text for part in self.content or ())
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


# ---- /v1/embeddings (OpenAI) and /embedding (llama-server) -----------------------------------

EmbeddingInput = str | list[str] | list[int] | list[list[int]]


def embedding_inputs(value: EmbeddingInput) -> dict:
    """The protocol's ``texts`` or ``token_inputs`` for an embeddings input (a string, strings, a token list
    or token lists); raises ValueError for an empty one, a negative token id or too many inputs."""
    if isinstance(value, str):
        value = [value]
    elif value and isinstance(value[0], int):
        value = [value]
    # value is now a list of strings or of token lists (the type checker cannot follow the wrapping above)
    if not value:
        raise ValueError("must hold at least one input")
    if len(value) > MAX_EMBED_INPUTS:
        raise ValueError(f"at most {MAX_EMBED_INPUTS} inputs")
    if any(len(one) == 0 for one in value):  # type: ignore[arg-type]
        raise ValueError("an input must not be empty")
    if isinstance(value[0], str):
        return {"texts": list(value)}
    if min(min(tokens) for tokens in value) < 0:  # type: ignore[arg-type]
        raise ValueError("token ids must be >= 0")
    return {"token_inputs": [list(tokens) for tokens in value]}  # type: ignore[arg-type]


class EmbeddingRequest(RequestBody):
    """OpenAI's /v1/embeddings body."""

    input: EmbeddingInput
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)  # refused unless it is the model's own
    user: str | None = None

    @field_validator("input")
    @classmethod
    def _usable_input(cls, value):
        embedding_inputs(value)
        return value

    def protocol_inputs(self) -> dict:
        return embedding_inputs(self.input)


class LlamaEmbeddingRequest(RequestBody):
    """llama-server's /embedding body: ``content`` (or ``input``), and ``embd_normalize`` (2: L2, -1: none)."""

    content: EmbeddingInput | None = None
    input: EmbeddingInput | None = None
    embd_normalize: int = 2

    @model_validator(mode="after")
    def _one_input(self):
        if (self.content is None) == (self.input is None):
            raise ValueError("give content or input (one of them)")
        embedding_inputs(self.content if self.content is not None else self.input)
        return self

    @field_validator("embd_normalize")
    @classmethod
    def _supported_norm(cls, value: int) -> int:
        if value not in (-1, 2):
            raise ValueError("only 2 (Euclidean) and -1 (none) are supported")
        return value

    def protocol_inputs(self) -> dict:
        return embedding_inputs(self.content if self.content is not None else self.input)  # type: ignore[arg-type]


class TokenizeRequest(StrictModel):
    content: str
    add_special: bool = False


class DetokenizeRequest(StrictModel):
    tokens: list[Annotated[int, Field(ge=0)]]
