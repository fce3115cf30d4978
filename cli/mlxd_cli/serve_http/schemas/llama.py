"""Request bodies of llama-server's own endpoints beyond ``LlamaCompletionRequest``'s base fields.

Contract:
    * ``LlamaCompletionBody`` (/completion, /completions) takes every prompt form llama-server takes
      (``LlamaPrompt``): a string; a list of token ids; a list mixing token ids and strings (one prompt);
      ``{"prompt_string": ..., "multimodal_data": [...]}`` (refused when it carries media); or a list of
      such prompts (one answer each). Plus ``n_probs`` (and ``post_sampling_probs``), ``return_tokens``,
      llama-server's other names for ``n_predict`` (``max_completion_tokens``, ``max_tokens``) and for
      ``n_probs`` (``logprobs``),
      ``response_fields`` and llama-server's ``logit_bias``: ``[[token id or text, bias], ...]`` or
      ``{"token id or text": bias}``, a bias being a finite number or ``false`` (the token is never
      produced); text stands for each of its tokens (``llama_completion.resolve_logit_bias``). What
      llama-server would skip silently (an entry that is not a pair, a bias of another type, a negative
      id) is a 400 here.
    * ``TokenizeBody`` adds ``with_pieces``; ``ApplyTemplateBody`` is /apply-template's chat.
"""

from __future__ import annotations

import math
import re
from typing import Any

from pydantic import Field, PrivateAttr, field_validator, model_validator

from mlxd_protocol.messages import MAX_LOGPROBS

from .request_parts import check_prompt
from .requests import (
    ChatMessage,
    LlamaCompletionRequest,
    RequestBody,
    StreamedProgress,
    StrictModel,
    TemplateKwargs,
    Tool,
)

MAX_PROMPTS = 32  # prompts of one /completion; each is a generation of its own on the daemons
MAX_RESPONSE_FIELDS = 64
MAX_LOGIT_BIAS = 1024  # entries of one logit_bias (texts among them are tokenized one by one)
_TOKEN_ID = re.compile(r"-?[0-9]{1,19}")


def _bias_value(value: Any) -> float:
    """A logit_bias bias: a finite number, or false for -inf (never produce the token)."""
    if value is False:
        return -math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"a bias must be a finite number or false (never produce the token), got {value!r:.40}")
    return float(value)


def _bias_token(token: Any) -> int | str:
    """A logit_bias token: an id (>= 0) or a text (an id written as a string in the object form)."""
    if isinstance(token, str) and _TOKEN_ID.fullmatch(token):
        token = int(token)
    if isinstance(token, bool) or not isinstance(token, (int, str)):
        raise ValueError(f"a token must be a token id or a text, got {token!r:.40}")
    if isinstance(token, int) and token < 0:
        raise ValueError(f"token ids must be >= 0, got {token}")
    return token


class PromptObject(StrictModel):
    """llama-server's JSON prompt: ``{"prompt_string": ..., "multimodal_data": [...]}``."""

    prompt_string: str
    multimodal_data: Any = None


def _one_prompt_problem(item: Any) -> str | None:
    """Why ``item`` is not one llama-server prompt (None when it is)."""
    if isinstance(item, str) or (isinstance(item, list) and all(type(part) is int for part in item)):
        try:
            check_prompt(item)  # a text or token ids: the protocol's prompt check
        except ValueError as error:
            return str(error)
        return None
    if isinstance(item, dict):
        return None
    if (
        isinstance(item, list)
        and item
        and all(isinstance(part, (int, str)) and not isinstance(part, bool) for part in item)
    ):
        if any(isinstance(part, int) and part < 0 for part in item):
            return "token ids must be >= 0"
        return None
    return 'each prompt must be a string, a list of token ids (mixed with strings), or {"prompt_string": ...}'


def is_single_prompt(prompt: Any) -> bool:
    """True when ``prompt`` is one prompt, not a list of prompts (llama-server's rule: a list holding only
    token ids, or token ids and strings both, is one prompt; any other list is a list of prompts)."""
    if not isinstance(prompt, list):
        return True
    kinds = {type(part) for part in prompt}
    return kinds <= {int} or kinds == {int, str}


class LlamaCompletionBody(LlamaCompletionRequest):
    """/completion's body: ``LlamaCompletionRequest`` with every prompt form and the reply options."""

    prompt: Any
    n_probs: int = Field(0, ge=0, le=MAX_LOGPROBS)
    # llama-server's other names: n_predict's (max_completion_tokens, then max_tokens) and n_probs' (logprobs),
    # each read only when the field itself is not sent (``_aliases``)
    max_completion_tokens: int | None = None
    max_tokens: int | None = None
    logprobs: int | None = None
    # the n_probs describe the distribution the sampler draws from (after top_k, top_p, min_p, temperature)
    post_sampling_probs: bool = False
    return_progress: StreamedProgress = False  # a stream sends prompt_progress events while the prompt is prefilled
    timings_per_token: bool = False  # every streamed event carries the timings so far (the answer always has them)
    return_tokens: bool = False
    response_fields: list[str] | None = Field(None, max_length=MAX_RESPONSE_FIELDS)
    logit_bias: list[Any] | dict[str, Any] | None = None
    # logit_bias with its texts tokenized (set by the route: tokenizing needs a daemon)
    _token_bias: dict[int, float] = PrivateAttr(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        """``n_predict`` from ``max_completion_tokens`` or ``max_tokens``, ``n_probs`` from ``logprobs``, where
        the body does not send the field itself (llama-server's aliases); checked as the field is."""
        if not isinstance(data, dict):
            return data
        for field, aliases in (("n_predict", ("max_completion_tokens", "max_tokens")), ("n_probs", ("logprobs",))):
            given = [data[alias] for alias in aliases if data.get(alias) is not None]
            if field not in data and given:
                data = {**data, field: given[0]}
        return data

    @field_validator("logit_bias")
    @classmethod
    def _bias_entries(cls, bias):
        if bias is None:
            return None
        if len(bias) > MAX_LOGIT_BIAS:
            raise ValueError(f"at most {MAX_LOGIT_BIAS} entries")
        items = bias.items() if isinstance(bias, dict) else bias
        entries = []
        for item in items:
            if not isinstance(item, (list, tuple)) or len(item) != 2:
                raise ValueError(f"each entry must be a [token, bias] pair, got {item!r:.40}")
            entries.append((_bias_token(item[0]), _bias_value(item[1])))
        return entries

    def bias_entries(self) -> list[tuple[int | str, float]]:
        """``logit_bias`` as (token id or text, bias) pairs, in the order given (false: -inf)."""
        return list(self.logit_bias or [])

    def token_bias(self) -> dict[int, float]:
        """The bias of each token id, texts tokenized (empty until ``set_token_bias``)."""
        return self._token_bias

    def set_token_bias(self, bias: dict[int, float]) -> None:
        """Keep ``logit_bias`` resolved to token ids (the route tokenizes its texts on a daemon)."""
        self._token_bias = bias

    @field_validator("prompt")
    @classmethod
    def _non_empty_prompt(cls, prompt):
        items = [prompt] if is_single_prompt(prompt) else prompt
        if not items:
            raise ValueError("the prompt must not be empty")
        if len(items) > MAX_PROMPTS:
            raise ValueError(f"at most {MAX_PROMPTS} prompts in one request")
        for item in items:
            if isinstance(item, dict):
                PromptObject.model_validate(item)
            problem = _one_prompt_problem(item)
            if problem:
                raise ValueError(problem)
        return prompt

    def prompts(self) -> list[Any]:
        """The prompts, one per answer."""
        return [self.prompt] if is_single_prompt(self.prompt) else list(self.prompt)


class TokenizeBody(StrictModel):
    """/tokenize: ``content``; ``add_special`` adds BOS and the like; ``with_pieces`` answers
    ``{"id", "piece"}`` per token."""

    content: str
    add_special: bool = False
    with_pieces: bool = False


class ApplyTemplateBody(RequestBody):
    """/apply-template: the chat to render through the chat template (nothing is generated)."""

    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[Tool] | None = Field(None, max_length=128)
    add_generation_prompt: bool = True
    chat_template_kwargs: TemplateKwargs = None
