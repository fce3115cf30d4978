"""The request parts several mlx-serve-http bodies share: the strict base models, speculative options,
response formats, stop strings, ``return_progress``, the prompt check, the sampling a body asks for, and
OpenAI's predicted output.

Contract: as ``requests`` (strict, bounded to what the daemon accepts); ``requests``, ``llama``,
``responses_api`` and ``anthropic_api`` build their bodies from these.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo

from mlxd_protocol import Constraint, Sampling, Speculative
from mlxd_protocol.field_checks import MAX_LIST_ITEMS
from mlxd_protocol.messages import MAX_DRAFT_LIMIT, MAX_STOP_CHARS, MAX_STOP_STRINGS, check_template_kwargs
from mlxd_protocol.messages import check_prompt as protocol_prompt_check

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
    """The protocol's prompt check (``mlxd_protocol.messages.check_prompt``: not empty, token ids >= 0) on a
    body's prompt, for a 400 that names the field; raises ValueError, returns the prompt."""
    protocol_prompt_check(prompt, "prompt")
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
