"""Request bodies of llama-server's own endpoints beyond ``LlamaCompletionRequest``'s base fields.

Contract:
    * ``LlamaCompletionBody`` (/completion, /completions) takes every prompt form llama-server takes
      (``LlamaPrompt``): a string; a list of token ids; a list mixing token ids and strings (one prompt);
      ``{"prompt_string": ..., "multimodal_data": [...]}`` (refused when it carries media); or a list of
      such prompts (one answer each). Plus ``n_probs``, ``return_tokens`` and ``response_fields``.
    * ``TokenizeBody`` adds ``with_pieces``; ``ApplyTemplateBody`` is /apply-template's chat.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from mlxd_protocol.messages import MAX_LOGPROBS

from .requests import ChatMessage, LlamaCompletionRequest, RequestBody, StrictModel, TemplateKwargs, Tool

MAX_PROMPTS = 32  # prompts of one /completion; each is a generation of its own on the daemons
MAX_RESPONSE_FIELDS = 64


class PromptObject(StrictModel):
    """llama-server's JSON prompt: ``{"prompt_string": ..., "multimodal_data": [...]}``."""

    prompt_string: str
    multimodal_data: Any = None


def _one_prompt_problem(item: Any) -> str | None:
    """Why ``item`` is not one llama-server prompt (None when it is)."""
    if isinstance(item, str):
        return None if item else "a prompt must not be empty"
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
    return_tokens: bool = False
    response_fields: list[str] | None = Field(None, max_length=MAX_RESPONSE_FIELDS)

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
