"""Response bodies of mlx-serve-http, as pydantic models: they mirror OpenAI's (``chat.completion``,
``chat.completion.chunk``, ``text_completion``) and llama-server's (``/completion``); ``timings`` is an
extension, and so is llama-server's ``__verbose`` debug object (its native answer, asked for with
``verbose``). Fields left unset by the server are left out of the JSON (``exclude_none``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


def _exclude_none(value: Any) -> bool:
    return value is None


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens taken from the prefix cache


class CompletionTokensDetails(BaseModel):
    accepted_prediction_tokens: int = 0  # prediction tokens the reply took (as verified drafts)
    rejected_prediction_tokens: int = 0  # the prediction's other tokens


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None
    completion_tokens_details: CompletionTokensDetails | None = None


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: dict  # {"name": str, "arguments": JSON text}


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCallOut] | None = Field(None, exclude_if=_exclude_none)


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatMessageOut
    logprobs: dict | None = None
    finish_reason: str


class ChatCompletion(BaseModel):
    model_config = ConfigDict(validate_by_name=True, serialize_by_alias=True)  # __verbose

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    system_fingerprint: str | None = None  # the model and mlxd release that answered
    choices: list[ChatChoice]
    usage: Usage
    timings: dict = Field(default_factory=dict, description="the daemon's timings (extension)")
    verbose_debug: dict | None = Field(None, alias="__verbose", exclude_if=_exclude_none)  # llama-server's debug object


class ChatDelta(BaseModel):
    role: str | None = Field(None, exclude_if=_exclude_none)
    content: str | None = Field(None, exclude_if=_exclude_none)
    tool_calls: list[dict] | None = Field(None, exclude_if=_exclude_none)  # each with its "index"


class ChatOpeningDelta(BaseModel):
    """A stream's first delta: the role, and ``content: null`` (no text yet), as llama-server sends it."""

    role: Literal["assistant"] = "assistant"
    content: None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta | ChatOpeningDelta
    logprobs: dict | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    model_config = ConfigDict(validate_by_name=True, serialize_by_alias=True)  # __verbose

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[ChatChunkChoice]
    usage: Usage | None = Field(None, exclude_if=_exclude_none)
    timings: dict | None = Field(None, exclude_if=_exclude_none)
    prompt_progress: dict | None = Field(None, exclude_if=_exclude_none)  # llama-server's return_progress
    verbose_debug: dict | None = Field(None, alias="__verbose", exclude_if=_exclude_none)  # llama-server's debug object


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: dict | None = None
    finish_reason: str | None = None


class Completion(BaseModel):
    """A text_completion body; also each streamed chunk (then finish_reason is null until the end)."""

    model_config = ConfigDict(validate_by_name=True, serialize_by_alias=True)  # __verbose

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[CompletionChoice]
    usage: Usage | None = Field(None, exclude_if=_exclude_none)
    timings: dict | None = Field(None, exclude_if=_exclude_none)
    prompt_progress: dict | None = Field(None, exclude_if=_exclude_none)  # llama-server's return_progress
    verbose_debug: dict | None = Field(None, alias="__verbose", exclude_if=_exclude_none)  # llama-server's debug object


class LlamaCompletion(BaseModel):
    """llama-server's /completion answer (also the last streamed event, with empty content)."""

    content: str
    stop: bool = True
    model: str
    tokens_predicted: int
    tokens_evaluated: int
    tokens_cached: int = 0  # prompt tokens taken from the prefix cache
    stop_type: Literal["eos", "word", "limit", "none"]
    stopping_word: str
    truncated: bool = False
    timings: dict


class LlamaStreamChunk(BaseModel):
    content: str
    stop: bool = False


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # a string with encoding_format "base64": little-endian float32 values


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(BaseModel):
    """OpenAI's /v1/embeddings answer."""

    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage


class LlamaEmbedding(BaseModel):
    """One input's entry in llama-server's /embedding answer: its pooled vector as a one-row list, or (pooling
    none) a vector per token."""

    index: int
    embedding: list[list[float]]


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "mlxd"
    aliases: list[str] = []  # llama-server's: every name of the model (--alias a,b)
    tags: list[str] = []  # llama-server's: informational (--tags)


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(BaseModel):
    status: str


class TokenizeResponse(BaseModel):
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    content: str


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail
