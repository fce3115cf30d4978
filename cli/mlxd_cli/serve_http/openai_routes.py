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
    * llama-server's own fields are taken here as llama-server takes them: ``ignore_eos`` and
      ``repeat_penalty`` (``repetition_penalty``'s other name) are honoured, the samplers mlxd lacks are
      refused by name unless sent at their neutral value (``request_fields.OPENAI_LLAMA_UNIMPLEMENTED``).
    * Chat: text content parts are joined with a newline (as llama-server joins them; the parts of a
      continued message by a blank line, ``ChatCompletionRequest.protocol_messages``). A final assistant
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
      llama-server's native answer of the (first) choice (``llama_answer.native_answer``: the prompt's
      tokens as text, which for chat is the rendered template, generation_settings, stop_type, ...); a
      stream carries it on each choice's finish chunk.
    * ``/v1/models`` (and llama-server's ``/models``) lists each model once, with llama-server's ``aliases``
      (every name ``--alias`` gives) and ``tags`` (``--tags``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request, Response

from mlxd_protocol import Done, Progress

from .choice_streams import ChoiceStreams, collect_choices, open_choices
from .context import gateway
from .errors import ERROR_RESPONSES, ApiError, NoDaemonAvailable, from_daemon_failure
from .json_body import JsonBodyRoute
from .llama_answer import prompt_as_text
from .openai_replies import (
    CHAT_FIELDS,
    FINISH_REASONS,
    DebugObject,
    chat_finish_reason,
    chat_logprobs,
    chat_prompt_tokens,
    completion_logprobs,
    progress_of,
    request_builder,
    system_fingerprint,
    tool_calls_of,
    usage_of_choices,
    verbose_debug,
    wants_verbose,
)
from .request_fields import (
    OPENAI_LLAMA_NO_EFFECT,
    OPENAI_LLAMA_UNIMPLEMENTED,
    check_extra_fields,
    ignored_fields_header,
    name_daemon_field,
)
from .schemas import (
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
    ModelCard,
    ModelList,
)
from .streaming import SSE_HEADERS, ClosingStreamingResponse, StreamedOutput, sse_body, sse_event

router = APIRouter(route_class=JsonBodyRoute)  # bodies read by json_body.parse_json
STREAM_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {}}, "description": "the answer, or SSE when stream=true"}
}


# ---- /v1/chat/completions --------------------------------------------------------------------


@router.post("/v1/chat/completions", response_model=ChatCompletion, responses={**STREAM_RESPONSES, **ERROR_RESPONSES})
@router.post("/chat/completions", include_in_schema=False)  # llama-server's name for it
async def chat_completions(body: ChatCompletionRequest, request: Request, response: Response):
    """Chat completion through the model's chat template (OpenAI's API)."""
    headers = ignored_fields_header(check_extra_fields(body, OPENAI_LLAMA_UNIMPLEMENTED, OPENAI_LLAMA_NO_EFFECT))
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    prompt_fields: dict = {"messages": body.protocol_messages()}
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
    headers = ignored_fields_header(check_extra_fields(body, OPENAI_LLAMA_UNIMPLEMENTED, OPENAI_LLAMA_NO_EFFECT))
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
