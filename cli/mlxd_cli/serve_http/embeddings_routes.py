"""Embeddings: OpenAI's POST /v1/embeddings and llama-server's POST /embedding (and /embeddings).

Contract:
    * Always on (no option to turn them on, unlike llama-server's ``--embedding``). The daemon computes
      them (protocol ``embed``): the model's last hidden state after its final norm, pooled per input by
      the daemon's ``mlxd --pooling`` (mean by default; last, cls, none).
    * /v1/embeddings: ``input`` is a string, strings, a token list or token lists (at most 2048 inputs,
      none empty); each vector is L2-normalized, as OpenAI's are; ``encoding_format`` "float" (lists) or
      "base64" (little-endian float32 bytes, what the openai SDK asks for by default); ``dimensions`` is
      refused (400) unless it is the model's own; ``usage.prompt_tokens`` counts every input's tokens. A
      daemon started with ``--pooling none`` has no pooled vectors: 400, as llama-server answers.
    * /embedding and /embeddings: llama-server's shape, a JSON list of ``{"index", "embedding"}`` where
      ``embedding`` is ``[pooled vector]``, or with ``--pooling none`` a vector per token (not normalized);
      ``content`` (or ``input``) as above; ``embd_normalize`` 2 (L2, the default) or -1 (none).
    * An input longer than the daemon's context, a token outside the vocabulary and a model that gives
      no hidden state are 400s naming ``input`` (or the reason).
"""

from __future__ import annotations

import base64
import struct

from fastapi import APIRouter, Request, Response

from mlxd_protocol import AsyncClient, EmbedResult

from .context import gateway
from .daemon_pool import call_daemon
from .errors import ERROR_RESPONSES, ApiError
from .json_body import JsonBodyRoute
from .request_fields import LLAMA_NO_EFFECT, OPENAI_NO_EFFECT, check_extra_fields, ignored_fields_header
from .schemas import (
    EmbeddingData,
    EmbeddingList,
    EmbeddingRequest,
    EmbeddingUsage,
    LlamaEmbedding,
    LlamaEmbeddingRequest,
)

router = APIRouter(route_class=JsonBodyRoute)  # bodies read by json_body.parse_json


async def embed(request: Request, inputs: dict, normalize: bool) -> tuple[EmbedResult, str]:
    """The daemon's EmbedResult for ``inputs`` (``texts`` or ``token_inputs``), and the serving model's name.

    Raises:
        ApiError: as ``call_daemon`` maps failures; a refused input is a 400 naming ``input``.
    """
    pool = gateway(request).pool
    served_by: list[AsyncClient] = []

    async def operation(client: AsyncClient) -> EmbedResult:
        served_by.append(client)
        return await client.embed(**inputs, normalize=normalize)

    try:
        result = await call_daemon(pool, operation)
    except ApiError as error:
        about_input = error.message.startswith(("input ", "token_inputs", "texts"))
        if error.status == 400 and about_input:
            message = error.message.replace("token_inputs", "input", 1).replace("texts", "input", 1)
            raise ApiError(400, message, param="input", code=error.code) from error
        raise
    handle = next((handle for handle in pool.handles if served_by and handle.client is served_by[-1]), None)
    return result, gateway(request).model_name(handle) if handle is not None else "mlxd"


def split_by_input(result: EmbedResult) -> list[list[list[float]]]:
    """Each input's vectors: one pooled vector, or (pooling none) one per token."""
    if result.pooling != "none":
        return [[vector] for vector in result.embeddings]
    parts, start = [], 0
    for count in result.token_counts:
        parts.append(result.embeddings[start : start + count])
        start += count
    return parts


def base64_floats(vector: list[float]) -> str:
    """``vector`` as OpenAI's base64 encoding: little-endian float32 values."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


@router.post("/v1/embeddings", response_model=EmbeddingList, responses=ERROR_RESPONSES)
async def openai_embeddings(body: EmbeddingRequest, request: Request, response: Response) -> EmbeddingList:
    """Pooled, L2-normalized embeddings of each input (OpenAI's API)."""
    response.headers.update(ignored_fields_header(check_extra_fields(body, {}, OPENAI_NO_EFFECT)))
    result, model = await embed(request, body.protocol_inputs(), normalize=True)
    if result.pooling == "none":
        raise ApiError(
            400,
            "the daemon pools none (mlxd --pooling none): /v1/embeddings needs one vector per "
            "input; use /embedding, or start mlxd with --pooling mean, last or cls",
            code="unsupported_pooling",
        )
    size = len(result.embeddings[0])
    if body.dimensions is not None and body.dimensions != size:
        raise ApiError(
            400,
            f"dimensions: this model's embeddings have {size} dimensions; only {size} is supported",
            param="dimensions",
            code="unsupported_value",
        )
    encode = base64_floats if body.encoding_format == "base64" else list
    data = [EmbeddingData(index=index, embedding=encode(vector)) for index, vector in enumerate(result.embeddings)]
    tokens = sum(result.token_counts)
    return EmbeddingList(data=data, model=model, usage=EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens))


@router.post("/embedding", response_model=list[LlamaEmbedding], responses=ERROR_RESPONSES)
@router.post("/embeddings", response_model=list[LlamaEmbedding], responses=ERROR_RESPONSES)
async def llama_embeddings(body: LlamaEmbeddingRequest, request: Request, response: Response) -> list[LlamaEmbedding]:
    """Embeddings in llama-server's shape: pooled as ``[[vector]]`` per input, or a vector per token."""
    response.headers.update(ignored_fields_header(check_extra_fields(body, {}, LLAMA_NO_EFFECT)))
    result, _ = await embed(request, body.protocol_inputs(), normalize=body.embd_normalize == 2)
    return [LlamaEmbedding(index=index, embedding=vectors) for index, vectors in enumerate(split_by_input(result))]
