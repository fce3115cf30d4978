"""OpenAI-compatible routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models.

Contract:
    * Chat sends ``messages`` (the daemon applies the model's chat template); completions send
      ``prompt`` with ``chat=False`` (or ``prompt_tokens`` for a token list). The daemon is always
      asked to stream; a non-streaming answer is assembled here from the chunks and the Done.
    * ``max_tokens`` (or ``max_completion_tokens``, or llama-server's ``n_predict``, which wins: -1 is no
      limit) left out means the gateway's ``--n-predict``, else "until end of sequence", bounded by the
      daemon's context (``OpenAIGenerationFields.token_limit``); sampling fields left out take the
      daemon's defaults.
    * Streaming answers are SSE: ``data: <chunk JSON>\\n\\n`` in OpenAI's chunk shapes, the first
      chat chunk carrying ``delta.role``, the last one ``finish_reason`` (and ``timings``, an
      extension), then a usage chunk when ``stream_options.include_usage``, then ``data: [DONE]``.
      A daemon failure after the stream started is sent as one ``data: {"error": ...}`` event.
    * ``n`` choices are ``n`` generations submitted at once (``choice_streams``), each its own ``index``;
      with a ``seed``, choice i samples with seed + i (so choices differ at a temperature above 0; greedy
      ones are equal). usage counts the prompt once and every choice's completion tokens.
    * Every reply and chunk carries ``system_fingerprint``, llama-server's ``b<build>-<hash>`` shape:
      ``b`` + the mlxd release, then a stable hash of the serving daemon's model and mlxd release.
    * A chat stream opens with a chunk per choice whose delta is ``{"role": "assistant", "content": null}``
      (llama-server's opening; no later delta repeats the role). With ``stream_options.include_usage`` the
      closing usage chunk carries ``timings`` as well (the first choice's, as the non-streamed reply has).
    * Structured output: OpenAI's ``response_format`` or llama-server's ``json_schema`` / ``grammar`` (GBNF)
      go to the daemon as its constraint; a schema or grammar it rejects is a 400 naming that field.
    * Chat: text content parts are joined with a newline (as llama-server joins them). A final assistant
      message is continued (assistant prefill: the template applied without a generation prompt, the reply
      being only the continuation), unless ``continue_final_message`` is false (vLLM's field).
    * ``POST /v1/chat/completions/input_tokens`` (and llama-server's ``/chat/completions/input_tokens``):
      ``{"input_tokens": n}``, the tokens the chat template makes of the body's ``messages``, ``tools`` and
      ``chat_template_kwargs`` (nothing is generated; a final assistant message counted as the prefill it is).
    * finish_reason: the daemon's "stop" and "length" as they are; "cancelled" (only seen when the
      client already left, or the daemon was shut down) is reported as "stop"; "tool_calls" when the
      model ended its turn with tool calls.
    * Tools: ``tools`` / ``tool_choice`` go to the daemon (the model's chat template; "required" or a named
      function enforced by a grammar); the daemon parses the calls with mlx-lm's parser for the model,
      they come back as ``message.tool_calls`` (content null when there is none), streamed as one
      ``delta.tool_calls`` chunk before the finish chunk. A model without tool calling gets a 400, except
      for ``tool_choice: "none"``, which no call can follow (the tools are then not offered).
    * ``return_progress: true`` (llama-server's; streams only) sends a chunk with no choices and
      ``prompt_progress`` (``total``, ``cache``, ``processed``, ``time_ms``) when the prefill starts and after
      each prompt chunk the daemon prefills (``mlxd --prefill-chunk`` tokens), before the first token.
    * ``timings_per_token: true`` (llama-server's) puts the daemon's timings so far on every streamed content
      chunk (a whole reply, and a stream's finish chunk, always carry them).
    * ``verbose: true`` (llama-server's; default: the gateway's ``--verbose-replies``) adds ``__verbose``,
      llama-server's native answer of the (first) choice (``llama_completion.native_answer``: the prompt's
      tokens as text, which for chat is the rendered template, generation_settings, stop_type, ...); a
      stream carries it on each choice's finish chunk.
    * ``/v1/models`` (and llama-server's ``/models``) lists each model once, with llama-server's ``aliases``
      (every name ``--alias`` gives) and ``tags`` (``--tags``).
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request, Response

from mlxd_protocol import Done, Generate, Progress, new_request_id

from .choice_streams import ChoiceStreams, collect_choices, open_choices
from .context import gateway
from .daemon_pool import DaemonHandle, call_daemon
from .errors import ERROR_RESPONSES, ApiError, NoDaemonAvailable, from_daemon_failure
from .json_body import JsonBodyRoute
from .llama_completion import native_answer, prompt_as_text, settings_of
from .request_fields import (
    OPENAI_NO_EFFECT,
    OPENAI_UNIMPLEMENTED,
    check_extra_fields,
    ignored_fields_header,
    name_daemon_field,
)
from .schemas import (
    MAX_TOKENS_LIMIT,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    ChatMessageOut,
    ChatOpeningDelta,
    Completion,
    CompletionChoice,
    CompletionRequest,
    CompletionTokensDetails,
    ModelCard,
    ModelList,
    OpenAIGenerationFields,
    PromptTokensDetails,
    ToolCallOut,
    Usage,
    build_sampling,
    normalize_stop,
    shared_drafts,
)
from .streaming import SSE_HEADERS, ClosingStreamingResponse, StreamedOutput, sse_body, sse_event

router = APIRouter(route_class=JsonBodyRoute)  # bodies read by json_body.parse_json
FINISH_REASONS = {"stop": "stop", "length": "length", "cancelled": "stop"}
CHAT_FIELDS = {"tools": "tools", "tool_choice": "tool_choice", "continue_final_message": "messages"}  # daemon -> HTTP
FALLBACK_MAX_TOKENS = 256  # when the daemon has not reported its context bound
DebugObject = Callable[[Done], Awaitable[dict]]  # a finished choice -> its __verbose
STREAM_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {}}, "description": "the answer, or SSE when stream=true"}
}


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
            return_progress=body.return_progress,
            timings_per_token=body.timings_per_token and body.stream,
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
    messages = [message.to_protocol() for message in body.messages]
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
        ignore_eos=False,
        stream=body.stream,
        cache_prompt=body.cache_prompt,
        n_probs=n_probs or 0,
        token_bias={int(token): bias for token, bias in (body.logit_bias or {}).items()},
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


# ---- /v1/chat/completions --------------------------------------------------------------------


@router.post("/v1/chat/completions", response_model=ChatCompletion, responses={**STREAM_RESPONSES, **ERROR_RESPONSES})
@router.post("/chat/completions", include_in_schema=False)  # llama-server's name for it
async def chat_completions(body: ChatCompletionRequest, request: Request, response: Response):
    """Chat completion through the model's chat template (OpenAI's API)."""
    headers = ignored_fields_header(check_extra_fields(body, OPENAI_UNIMPLEMENTED, OPENAI_NO_EFFECT))
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    prompt_fields: dict = {"messages": [message.to_protocol() for message in body.messages]}
    if body.continues_final_message():
        prompt_fields["continue_final_message"] = True
    if body.chat_template_kwargs is not None:
        prompt_fields["chat_template_kwargs"] = body.chat_template_kwargs
    max_tokens = body.token_limit(gateway(request).settings.default_n_predict)
    builders = [
        request_builder(
            body,
            prompt_fields,
            max_tokens,
            logprobs,
            chat=None,
            tool_fields=body.tool_fields(),
            choice=index,
        )
        for index in range(body.n)
    ]
    try:
        choices = await open_choices(gateway(request).pool, builders)
    except ApiError as error:
        if error.status == 400 and "no chat template" in error.message:
            # The daemon's advice names protocol fields; say what to do over HTTP instead.
            raise ApiError(
                400,
                "this model has no chat template: send a plain prompt to /v1/completions or /completion instead",
                param="messages",
                code=error.code,
            ) from error
        raise name_daemon_field(error, {**CHAT_FIELDS, "constraint": body.constraint_field()}) from error
    reply_id, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
    debug: DebugObject | None = None
    if wants_verbose(body, request):
        prompt_tokens = await chat_prompt_tokens(request, body)
        prompt_text = await prompt_as_text(gateway(request).pool, {"prompt_tokens": prompt_tokens})

        async def debug(done: Done) -> dict:
            return await verbose_debug(request, body, choices.handle, done, prompt_text, max_tokens, logprobs)

    if body.stream:
        events = _chat_events(
            choices,
            request,
            reply_id,
            created,
            logprobs is not None,
            body.stream_options is not None and body.stream_options.include_usage,
            debug,
        )
        return ClosingStreamingResponse(events, media_type="text/event-stream", headers={**SSE_HEADERS, **headers})
    results = await collect_choices(choices, request)
    if results is None:
        return Response(status_code=499)  # the client left; nobody reads this
    response.headers.update(headers)
    answers = []
    for index, result in enumerate(results):
        gateway(request).count_generation(result.done)
        choice_logprobs = (
            chat_logprobs(result.logprobs, await gateway(request).token_texts(result.logprobs))
            if logprobs is not None
            else None
        )
        calls = tool_calls_of(result.done)
        message = (
            ChatMessageOut(content=result.text or None, tool_calls=calls)
            if calls
            else ChatMessageOut(content=result.text)
        )
        answers.append(
            ChatChoice(
                index=index, message=message, logprobs=choice_logprobs, finish_reason=chat_finish_reason(result.done)
            )
        )
    return ChatCompletion(
        id=reply_id,
        created=created,
        model=gateway(request).model_name(choices.handle),
        system_fingerprint=system_fingerprint(choices.handle),
        usage=usage_of_choices([r.done for r in results]),
        timings=results[0].done.timings,
        choices=answers,
        verbose_debug=await debug(results[0].done) if debug else None,
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


def _chat_events(
    choices: ChoiceStreams,
    request: Request,
    reply_id: str,
    created: int,
    want_logprobs: bool,
    include_usage: bool,
    debug: DebugObject | None,
) -> AsyncIterator[bytes]:
    model, fingerprint = gateway(request).model_name(choices.handle), system_fingerprint(choices.handle)
    outputs = [StreamedOutput() for _ in choices.streams]
    dones: dict[int, Done] = {}

    def event(parts: list[ChatChunkChoice], **extra) -> bytes:
        chunk = ChatCompletionChunk(
            id=reply_id, created=created, model=model, system_fingerprint=fingerprint, choices=parts, **extra
        )
        return sse_event(chunk.model_dump_json())

    async def events_for(indexed_reply) -> AsyncIterator[bytes]:
        index, reply = indexed_reply
        if isinstance(reply, Progress):
            yield event([], prompt_progress=progress_of(reply))
            return
        text, _ = outputs[index].add(reply)
        entries = getattr(reply, "logprobs", None) or []
        if text or entries:
            logprobs = (
                chat_logprobs(entries, await gateway(request).token_texts(entries))
                if want_logprobs and entries
                else None
            )
            yield event(
                [ChatChunkChoice(index=index, delta=ChatDelta(content=text), logprobs=logprobs)],
                timings=getattr(reply, "timings", None) if not isinstance(reply, Done) else None,
            )
        if isinstance(reply, Done):
            dones[index] = reply
            gateway(request).count_generation(reply)
            calls = tool_calls_of(reply)
            if calls:
                deltas = [{"index": number, **call.model_dump()} for number, call in enumerate(calls)]
                yield event([ChatChunkChoice(index=index, delta=ChatDelta(tool_calls=deltas))])
            yield event(
                [ChatChunkChoice(index=index, delta=ChatDelta(), finish_reason=chat_finish_reason(reply))],
                timings=reply.timings,
                verbose_debug=await debug(reply) if debug else None,
            )
            if len(dones) == len(outputs):
                if include_usage:
                    # the usage chunk carries the first choice's timings too, as llama-server's does
                    yield event(
                        [],
                        usage=usage_of_choices([dones[number] for number in sorted(dones)]),
                        timings=dones[0].timings,
                    )
                yield sse_event(b"[DONE]")

    opening = b"".join(event([ChatChunkChoice(index=index, delta=ChatOpeningDelta())]) for index in range(len(outputs)))
    # sse_body only iterates the stream (here: (choice, reply) pairs) and closes it
    return sse_body(choices, request, events_for, opening=opening)  # type: ignore[arg-type]


# ---- /v1/completions -------------------------------------------------------------------------


@router.post("/v1/chat/completions/input_tokens", responses=ERROR_RESPONSES)
@router.post("/chat/completions/input_tokens", include_in_schema=False)  # llama-server's name for it
async def chat_input_tokens(body: ChatCompletionRequest, request: Request) -> dict:
    """The number of prompt tokens a chat completion of this body would have."""
    tokens = await chat_prompt_tokens(request, body)
    return {"input_tokens": len(tokens)}


@router.post("/v1/completions", response_model=Completion, responses={**STREAM_RESPONSES, **ERROR_RESPONSES})
async def completions(body: CompletionRequest, request: Request, response: Response):
    """Plain text completion, no chat template (OpenAI's legacy completions API)."""
    headers = ignored_fields_header(check_extra_fields(body, OPENAI_UNIMPLEMENTED, OPENAI_NO_EFFECT))
    prompt_fields = {"prompt_tokens": body.prompt} if isinstance(body.prompt, list) else {"prompt": body.prompt}
    max_tokens = body.token_limit(gateway(request).settings.default_n_predict)
    builders = [
        request_builder(body, prompt_fields, max_tokens, body.logprobs, chat=False, choice=index)
        for index in range(body.n)
    ]
    try:
        choices = await open_choices(gateway(request).pool, builders)
    except ApiError as error:
        raise name_daemon_field(error, {"constraint": body.constraint_field()}) from error
    reply_id, created = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())
    debug: DebugObject | None = None
    if wants_verbose(body, request):
        prompt_text = await prompt_as_text(gateway(request).pool, prompt_fields)

        async def debug(done: Done) -> dict:
            return await verbose_debug(request, body, choices.handle, done, prompt_text, max_tokens, body.logprobs)

    if body.stream:
        events = _completion_events(
            choices,
            request,
            reply_id,
            created,
            body.logprobs is not None,
            body.stream_options is not None and body.stream_options.include_usage,
            debug,
        )
        return ClosingStreamingResponse(events, media_type="text/event-stream", headers={**SSE_HEADERS, **headers})
    results = await collect_choices(choices, request)
    if results is None:
        return Response(status_code=499)
    response.headers.update(headers)
    answers = []
    for index, result in enumerate(results):
        gateway(request).count_generation(result.done)
        choice_logprobs = (
            completion_logprobs(result.logprobs, await gateway(request).token_texts(result.logprobs), 0)
            if body.logprobs is not None
            else None
        )
        answers.append(
            CompletionChoice(
                index=index,
                text=result.text,
                logprobs=choice_logprobs,
                finish_reason=FINISH_REASONS[result.done.finish_reason],
            )
        )
    return Completion(
        id=reply_id,
        created=created,
        model=gateway(request).model_name(choices.handle),
        system_fingerprint=system_fingerprint(choices.handle),
        usage=usage_of_choices([r.done for r in results]),
        timings=results[0].done.timings,
        choices=answers,
        verbose_debug=await debug(results[0].done) if debug else None,
    )


def _completion_events(
    choices: ChoiceStreams,
    request: Request,
    reply_id: str,
    created: int,
    want_logprobs: bool,
    include_usage: bool,
    debug: DebugObject | None,
) -> AsyncIterator[bytes]:
    model, fingerprint = gateway(request).model_name(choices.handle), system_fingerprint(choices.handle)
    outputs = [StreamedOutput() for _ in choices.streams]
    dones: dict[int, Done] = {}

    def event(parts: list[CompletionChoice], **extra) -> bytes:
        return sse_event(
            Completion(
                id=reply_id, created=created, model=model, system_fingerprint=fingerprint, choices=parts, **extra
            ).model_dump_json()
        )

    async def events_for(indexed_reply) -> AsyncIterator[bytes]:
        index, reply = indexed_reply
        if isinstance(reply, Progress):
            yield event([], prompt_progress=progress_of(reply))
            return
        offset = len(outputs[index].text)
        text, _ = outputs[index].add(reply)
        entries = getattr(reply, "logprobs", None) or []
        if text or entries:
            logprobs = (
                completion_logprobs(entries, await gateway(request).token_texts(entries), offset)
                if want_logprobs and entries
                else None
            )
            yield event(
                [CompletionChoice(index=index, text=text, logprobs=logprobs)],
                timings=getattr(reply, "timings", None) if not isinstance(reply, Done) else None,
            )
        if isinstance(reply, Done):
            dones[index] = reply
            gateway(request).count_generation(reply)
            yield event(
                [CompletionChoice(index=index, text="", finish_reason=FINISH_REASONS[reply.finish_reason])],
                timings=reply.timings,
                verbose_debug=await debug(reply) if debug else None,
            )
            if len(dones) == len(outputs):
                if include_usage:
                    # the usage chunk carries the first choice's timings too, as llama-server's does
                    yield event(
                        [],
                        usage=usage_of_choices([dones[number] for number in sorted(dones)]),
                        timings=dones[0].timings,
                    )
                yield sse_event(b"[DONE]")

    # sse_body only iterates the stream (here: (choice, reply) pairs) and closes it
    return sse_body(choices, request, events_for)  # type: ignore[arg-type]


# ---- /v1/models ------------------------------------------------------------------------------


@router.get("/v1/models", response_model=ModelList, responses=ERROR_RESPONSES)
@router.get("/models", include_in_schema=False)  # llama-server's name for it
async def list_models(request: Request) -> ModelList:
    """The model(s) the daemons serve."""
    pool = gateway(request).pool
    models = [gateway(request).model_name(handle) for handle in pool.up_handles() if handle.status is not None]
    if not models:
        raise from_daemon_failure(_no_daemon(pool))
    created = int(time.time())
    settings = gateway(request).settings
    return ModelList(
        data=[
            ModelCard(id=model, created=created, aliases=list(settings.model_aliases), tags=list(settings.model_tags))
            for model in dict.fromkeys(models)
        ]
    )


def _no_daemon(pool) -> NoDaemonAvailable:
    return NoDaemonAvailable(pool.down_reasons() or "no daemon answers")
