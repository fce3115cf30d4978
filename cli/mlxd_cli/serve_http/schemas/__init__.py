"""The HTTP bodies of mlx-serve-http as pydantic models (so /openapi.json is true): what clients send
(``requests.py``: strict, bounded to what the daemon accepts) and what the server answers
(``responses.py``: OpenAI's and llama-server's shapes). The routes import both from here."""

from .requests import (
    MAX_TOKENS_LIMIT,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    LlamaCompletionRequest,
    LlamaEmbeddingRequest,
    OpenAIGenerationFields,
    Prediction,
    ResponseFormat,
    TokenizeRequest,
    Tool,
    build_sampling,
    check_prompt,
    normalize_stop,
)
from .responses import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    ChatMessageOut,
    Completion,
    CompletionChoice,
    CompletionTokensDetails,
    DetokenizeResponse,
    EmbeddingData,
    EmbeddingList,
    EmbeddingUsage,
    ErrorDetail,
    ErrorResponse,
    Health,
    LlamaCompletion,
    LlamaEmbedding,
    LlamaStreamChunk,
    ModelCard,
    ModelList,
    PromptTokensDetails,
    TokenizeResponse,
    ToolCallOut,
    Usage,
)

__all__ = [
    "MAX_TOKENS_LIMIT", "ChatCompletionRequest", "ChatMessage", "CompletionRequest", "DetokenizeRequest",
    "EmbeddingRequest", "LlamaCompletionRequest", "LlamaEmbeddingRequest", "OpenAIGenerationFields", "Prediction", "ResponseFormat", "TokenizeRequest", "Tool",
    "build_sampling", "check_prompt", "normalize_stop",
    "ChatChoice", "ChatChunkChoice", "ChatCompletion", "ChatCompletionChunk", "ChatDelta", "ChatMessageOut",
    "Completion", "CompletionChoice", "CompletionTokensDetails", "DetokenizeResponse", "EmbeddingData",
    "EmbeddingList", "EmbeddingUsage", "ErrorDetail", "ErrorResponse", "Health", "LlamaCompletion", "LlamaEmbedding", "LlamaStreamChunk", "ModelCard", "ModelList",
    "PromptTokensDetails", "TokenizeResponse", "ToolCallOut", "Usage",
]
