"""The pieces of an OpenAI answer the routes share: usage, the system fingerprint, logprobs, tool calls,
finish reasons, prompt progress, the daemon request a body becomes, and llama-server's ``__verbose``.

Contract: functions of the daemon's messages and the request bodies (``openai_routes`` and ``responses_routes``
build their answers with them); none sends anything itself. The reply shapes are described in
``openai_routes``.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Awaitable, Callable

from fastapi import Request

from mlxd_protocol import Done, Generate, Progress, new_request_id

from .context import gateway
from .daemon_pool import DaemonHandle, call_daemon
from .errors import ApiError
from .llama_answer import native_answer, settings_of
from .request_fields import name_daemon_field
from .schemas import (
    MAX_TOKENS_LIMIT,
    ChatCompletionRequest,
    CompletionTokensDetails,
    OpenAIGenerationFields,
    PromptTokensDetails,
    ToolCallOut,
    Usage,
    build_sampling,
    normalize_stop,
    shared_drafts,
)

FINISH_REASONS = {"stop": "stop", "length": "length", "cancelled": "stop"}
CHAT_FIELDS = {"tools": "tools", "tool_choice": "tool_choice", "continue_final_message": "messages"}  # daemon -> HTTP
FALLBACK_MAX_TOKENS = 256  # when the daemon has not reported its context bound
DebugObject = Callable[[Done], Awaitable[dict]]  # a finished choice -> its __verbose


def usage_of(done: Done) -> Usage:
    """OpenAI's usage object from a Done."""
    usage = done.usage
    prompt, completion = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
    details = PromptTokensDetails(cached_tokens=int(usage.get("cached_tokens", 0)))
    predicted = None
    if "accepted_prediction_tokens" in usage:
        predicted = CompletionTokensDetails(
            accepted_prediction_tokens=int(usage["accepted_prediction_tokens"]),
            rejected_prediction_tokens=int(usage["rejected_prediction_tokens"]),
        )
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details=details,
        completion_tokens_details=predicted,
    )


def usage_of_choices(dones: list[Done]) -> Usage:
    """OpenAI's usage object for a request's choices: the prompt once, every choice's completion tokens."""
    usages = [usage_of(done) for done in dones]
    first = usages[0]
    completion = sum(usage.completion_tokens for usage in usages)
    predicted = [usage.completion_tokens_details for usage in usages if usage.completion_tokens_details]
    details = (
        None
        if not predicted
        else CompletionTokensDetails(
            accepted_prediction_tokens=sum(part.accepted_prediction_tokens for part in predicted),
            rejected_prediction_tokens=sum(part.rejected_prediction_tokens for part in predicted),
        )
    )
    return Usage(
        prompt_tokens=first.prompt_tokens,
        completion_tokens=completion,
        total_tokens=first.prompt_tokens + completion,
        prompt_tokens_details=first.prompt_tokens_details,
        completion_tokens_details=details,
    )


def system_fingerprint(handle: DaemonHandle) -> str | None:
    """``system_fingerprint``: the serving build and a hash of the daemon's model and mlxd release (no path shows).

    Shaped like llama-server's ``b<build>-<hash>`` (``b`` + the mlxd release, then the hash), so clients of
    either server can read it; OpenAI's own value is just as opaque (``fp_<hash>``), so its clients do too.
    """
    if handle.status is None:
        return None
    identity = f"{handle.status.model}\0{handle.status.daemon_version}".encode()
    return f"b{handle.status.daemon_version}-{hashlib.sha256(identity).hexdigest()[:12]}"


def request_builder(
    body: OpenAIGenerationFields,
    prompt_fields: dict,
    max_tokens: int | None,
    logprobs: int | None,
    chat: bool | None,
    tool_fields: dict | None = None,
    choice: int = 0,
) -> Callable[[DaemonHandle], Generate]:
    """A function building the Generate for the daemon the pool picks.

    Args:
        body: The validated request.
        prompt_fields: ``{"messages": ...}``, ``{"prompt": ...}`` or ``{"prompt_tokens": ...}``.
        max_tokens: The client's limit, None for "until end of sequence".
        logprobs: Alternatives to report per token, None for no logprobs.
        chat: The protocol's ``chat`` flag.
        tool_fields: The protocol's tools / tool_choice / tool_name (chat only).
        choice: The choice's index (of ``n``): a client's seed is moved by it, so choices differ.

    Returns:
        ``make_request(handle) -> Generate``, filling defaults from that daemon's status.
    """
    stop = normalize_stop(body.stop)
    overrides = body.sampling_overrides(logprobs)
    if choice and "seed" in overrides:
        overrides["seed"] += choice
    speculative = body.speculative.to_protocol() if body.speculative else None
    constraint = body.constraint()

    def make_request(handle: DaemonHandle) -> Generate:
        limit = max_tokens or min(handle.context_bound or FALLBACK_MAX_TOKENS, MAX_TOKENS_LIMIT)
        return Generate(
            id=new_request_id(),
            **prompt_fields,
            chat=chat,
            max_tokens=limit,
            stop=stop,
            stream=True,
            sampling=build_sampling(overrides, handle.sampling_defaults),
            speculative=speculative,
            shared_drafts=shared_drafts(body.speculative),
            constraint=constraint,
            cache_prompt=body.cache_prompt,
            prediction=body.prediction_text(),
            ignore_eos=body.ignore_eos,
            return_progress=body.return_progress,
            timings_per_token=body.timings_per_token and body.stream,
            n_keep=body.n_keep,
            n_discard=body.n_discard,
            **(tool_fields or {}),
        )

    return make_request


def chat_logprobs(entries: list[dict], texts: dict[int, str]) -> dict:
    """OpenAI chat ``logprobs`` ({"content": [...]}) from the daemon's entries."""

    def item(token: int, logprob: float) -> dict:
        text = texts[token]
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return {
        "content": [
            {
                **item(entry["token"], entry["logprob"]),
                "top_logprobs": [item(token, logprob) for token, logprob in entry.get("top") or ()],
            }
            for entry in entries
        ]
    }


def completion_logprobs(entries: list[dict], texts: dict[int, str], offset: int) -> dict:
    """Legacy completions ``logprobs`` (tokens, token_logprobs, top_logprobs, text_offset)."""
    offsets, position = [], offset
    for entry in entries:
        offsets.append(position)
        position += len(texts[entry["token"]])
    return {
        "tokens": [texts[entry["token"]] for entry in entries],
        "token_logprobs": [entry["logprob"] for entry in entries],
        "top_logprobs": [{texts[token]: logprob for token, logprob in entry.get("top") or ()} for entry in entries],
        "text_offset": offsets,
    }


# ---- llama-server's __verbose ----------------------------------------------------------------


def wants_verbose(body: OpenAIGenerationFields, request: Request) -> bool:
    """Whether the reply carries ``__verbose`` (the request's ``verbose``, else the gateway's default)."""
    return body.verbose if body.verbose is not None else gateway(request).settings.verbose_replies


async def chat_prompt_tokens(request: Request, body: ChatCompletionRequest) -> list[int]:
    """The prompt's tokens as the chat template makes them of the body (messages, tools, kwargs, prefill)."""
    messages = body.protocol_messages()
    tools = body.tool_fields().get("tools")
    try:
        return await call_daemon(
            gateway(request).pool,
            lambda client: client.tokenize(
                messages=messages,
                tools=tools,
                chat_template_kwargs=body.chat_template_kwargs,
                continue_final_message=body.continues_final_message(),
            ),
        )
    except ApiError as error:
        raise name_daemon_field(error, CHAT_FIELDS) from error


async def verbose_debug(
    request: Request,
    body: OpenAIGenerationFields,
    handle: DaemonHandle,
    done: Done,
    prompt_text: str,
    max_tokens: int | None,
    n_probs: int | None,
) -> dict:
    """llama-server's ``__verbose``: the native (/completion-shaped) answer of one finished choice."""
    settings = settings_of(
        handle,
        body.sampling_overrides(n_probs),
        n_predict=max_tokens or -1,
        stop=normalize_stop(body.stop),
        ignore_eos=body.ignore_eos,
        stream=body.stream,
        cache_prompt=body.cache_prompt,
        n_probs=n_probs or 0,
        token_bias={int(token): bias for token, bias in (body.logit_bias or {}).items()},
        n_keep=body.n_keep,
        n_discard=body.n_discard,
    )
    return await native_answer(
        gateway(request),
        handle,
        done,
        done.text,
        [],
        prompt_text=prompt_text,
        settings=settings,
        stop=normalize_stop(body.stop),
        output_tokens=done.tokens,
    )


def progress_of(progress: Progress) -> dict:
    """llama-server's ``prompt_progress``: prompt tokens in all, from the cache, processed (those included)."""
    return {
        "total": progress.total,
        "cache": progress.cache,
        "processed": progress.processed,
        "time_ms": progress.time_ms,
    }


def tool_calls_of(done: Done) -> list[ToolCallOut] | None:
    """OpenAI's tool_calls from the daemon's parsed calls (None when the model called no tool)."""
    if not done.tool_calls:
        return None
    return [
        ToolCallOut(id=f"call_{uuid.uuid4().hex[:24]}", function={"name": call["name"], "arguments": call["arguments"]})
        for call in done.tool_calls
    ]


def chat_finish_reason(done: Done) -> str:
    """ "tool_calls" when the model ended its turn with tool calls, else the daemon's reason."""
    if done.tool_calls and done.finish_reason == "stop":
        return "tool_calls"
    return FINISH_REASONS[done.finish_reason]
