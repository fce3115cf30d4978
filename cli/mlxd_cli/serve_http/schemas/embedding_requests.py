"""The bodies of the gateway's routes that generate nothing: OpenAI's /v1/embeddings, llama-server's
/embedding, /tokenize and /detokenize.

Contract: as ``requests`` (strict, bounded to what the daemon accepts: at most ``MAX_EMBED_INPUTS`` inputs,
none empty, token ids >= 0).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from mlxd_protocol.messages import MAX_EMBED_INPUTS

from .request_parts import RequestBody, StrictModel

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
