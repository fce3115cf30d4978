"""OpenAI's Responses API: POST /v1/responses, GET and DELETE /v1/responses/{id}.

Contract:
    * A request becomes one chat Generate: ``instructions`` as a first system message, then the stored
      conversation of ``previous_response_id`` (its input and output; not its instructions), then
      ``input`` (``schemas.responses_api``). So the daemon's chat template, prefix cache, prompt lookup
      (the ``speculative`` extension), sampling defaults and tools serve it as they serve
      /v1/chat/completions; ``text.format`` is the chat endpoint's ``response_format`` constraint.
    * The answer is a ``response`` object: ``output`` holds a ``message`` (the text; left out when the
      model only called functions) and a ``function_call`` item per call (``call_id``, ``name``,
      ``arguments`` JSON text). ``status`` is "completed", or "incomplete" with
      ``incomplete_details.reason`` "max_output_tokens" when the token limit stopped it.
    * ``store`` (default true, as OpenAI's) keeps the response in the router's ``ResponsesStore``
      (bounded, least recently used evicted) for GET, DELETE and ``previous_response_id``; an id not
      stored (never, deleted, evicted, or made with ``store: false``) is a 404 naming it.
    * ``stream: true`` is the Responses SSE: ``event: <type>`` + ``data: <json>`` (each with its
      ``sequence_number``): response.created, response.in_progress, then per output item
      output_item.added, (for the message) content_part.added / output_text.delta ... / output_text.done
      / content_part.done, (for a call, once parsed) function_call_arguments.delta / .done,
      output_item.done, and last response.completed (response.incomplete at the token limit). A daemon
      failure mid-stream is an ``error`` event followed by response.failed.
    * Fields OpenAI defines that mlxd does not implement (``reasoning``, ``background``, ``include``,
      ``truncation`` "auto", ...) are refused with a 400 naming them unless sent at their neutral value;
      those with no effect on the output are accepted; vendor extensions are ignored and named in the
      ``X-Mlxd-Ignored-Fields`` header (``request_fields``).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request, Response

from mlxd_protocol import Done

from .context import gateway
from .daemon_pool import GenerationStream, open_generation
from .errors import ERROR_RESPONSES, ApiError
from .json_body import JsonBodyRoute
from .openai_replies import request_builder, usage_of
from .request_fields import check_extra_fields, ignored_fields_header, name_daemon_field
from .responses_store import DEFAULT_MAX_STORED_RESPONSES, ResponsesStore, StoredResponse
from .schemas import OpenAIGenerationFields
from .schemas.responses_api import (
    DeletedResponse,
    FunctionCallItem,
    FunctionCallOutput,
    FunctionToolChoice,
    IncompleteDetails,
    InputTokensDetails,
    MessageItem,
    OutputMessage,
    OutputText,
    ResponseObject,
    ResponsesRequest,
    ResponseUsage,
    conversation_messages,
)
from .streaming import SSE_HEADERS, ClosingStreamingResponse, StreamedOutput, collect_generation, sse_body


def _absent(value: Any) -> bool:
    return value is None


def _empty(value: Any) -> bool:
    return value is None or value == [] or value == {}


def _no_options(value: Any) -> bool:
    return value is None or (isinstance(value, dict) and all(option is None for option in value.values()))


def _one_of(*neutral: Any):
    return lambda value: value is None or value in neutral


# field -> (its neutral value test, what the client is told); see request_fields.check_extra_fields.
RESPONSES_UNIMPLEMENTED = {
    "reasoning": (_no_options, "reasoning options are not supported"),
    "background": (_one_of(False), "background responses are not supported"),
    "include": (_empty, "include is not supported (no logprobs, reasoning or tool outputs to add)"),
    "truncation": (
        _one_of("disabled"),
        'only truncation "disabled" is supported (a conversation longer than the context is refused)',
    ),
    "top_logprobs": (_one_of(0), "logprobs are not supported on /v1/responses: use /v1/chat/completions"),
    "max_tool_calls": (_absent, "max_tool_calls is not supported"),
    "conversation": (_absent, "conversations are not supported: use previous_response_id"),
    "prompt": (_absent, "prompt templates are not supported"),
    "context_management": (_empty, "context management is not supported"),
    "moderation": (_absent, "moderation is not supported"),
    "background_options": (_absent, "background responses are not supported"),
    "access_programs": (_absent, "access programs are not supported"),
    "image": (_absent, "images are not supported"),
    # the chat endpoint's names, sent here by mistake: say what this endpoint calls them
    "messages": (_absent, "/v1/responses takes input, not messages"),
    "max_tokens": (_absent, "/v1/responses takes max_output_tokens"),
    "response_format": (_absent, "/v1/responses takes text.format"),
}
RESPONSES_NO_EFFECT = frozenset(
    {"service_tier", "safety_identifier", "prompt_cache_key", "user", "prompt_cache_retention", "prompt_cache_options"}
)
DAEMON_FIELDS = {"constraint": "text.format", "tools": "tools", "tool_choice": "tool_choice"}  # daemon -> HTTP
STREAM_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {}}, "description": "the response, or SSE when stream=true"}
}


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def responses_router(max_stored_responses: int = DEFAULT_MAX_STORED_RESPONSES) -> APIRouter:
    """The Responses API routes, with their own store (one per app).

    Args:
        max_stored_responses: How many stored responses are kept (least recently used evicted).

    Returns:
        The router to include in the app.
    """
    store = ResponsesStore(max_stored_responses)
    router = APIRouter(route_class=JsonBodyRoute)  # bodies read by json_body.parse_json

    @router.post("/v1/responses", response_model=ResponseObject, responses={**STREAM_RESPONSES, **ERROR_RESPONSES})
    async def create_response(body: ResponsesRequest, request: Request, response: Response):
        """A model response to text or a conversation, optionally with function tools (OpenAI's Responses API)."""
        return await answer(body, request, response, store)

    @router.get("/v1/responses/{response_id}", response_model=ResponseObject, responses=ERROR_RESPONSES)
    async def retrieve_response(response_id: str) -> ResponseObject:
        """A stored response."""
        return stored(store, response_id, "response_id").reply

    @router.delete("/v1/responses/{response_id}", response_model=DeletedResponse, responses=ERROR_RESPONSES)
    async def delete_response(response_id: str) -> DeletedResponse:
        """Forget a stored response (later turns can no longer name it as previous_response_id)."""
        stored(store, response_id, "response_id")
        store.delete(response_id)
        return DeletedResponse(id=response_id)

    return router


def stored(store: ResponsesStore, response_id: str, param: str) -> StoredResponse:
    """The stored response ``response_id``, or a 404 naming it."""
    entry = store.get(response_id)
    if entry is None:
        raise ApiError(
            404,
            f"no stored response with id {response_id[:128]!r} (never stored, made with store "
            "false, deleted, or evicted)",
            param=param,
            code="response_not_found",
        )
    return entry


def generation_fields(body: ResponsesRequest) -> OpenAIGenerationFields:
    """The chat endpoint's generation fields asking for the same sampling, constraint and drafting."""
    text_format = body.text.format if body.text is not None else None
    return OpenAIGenerationFields(
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        min_p=body.min_p,
        repetition_penalty=body.repetition_penalty,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        seed=body.seed,
        stop=body.stop,
        speculative=body.speculative,
        cache_prompt=body.cache_prompt,
        response_format=text_format.response_format() if text_format else None,
    )


async def answer(body: ResponsesRequest, request: Request, response: Response, store: ResponsesStore):
    """Answer ``POST /v1/responses`` (see the module docstring)."""
    headers = ignored_fields_header(check_extra_fields(body, RESPONSES_UNIMPLEMENTED, RESPONSES_NO_EFFECT))
    earlier = (
        stored(store, body.previous_response_id, "previous_response_id").conversation
        if body.previous_response_id is not None
        else []
    )
    conversation = earlier + conversation_messages(body.input_items())
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    make_request = request_builder(
        generation_fields(body),
        {"messages": system + conversation},
        body.max_output_tokens,
        None,
        chat=None,
        tool_fields=body.tool_fields(),
    )
    try:
        stream = await open_generation(gateway(request).pool, make_request)
    except ApiError as error:
        if error.status == 400 and "no chat template" in error.message:
            raise ApiError(
                400,
                "this model has no chat template, which /v1/responses needs: send a plain prompt "
                "to /v1/completions or /completion instead",
                param="input",
                code=error.code,
            ) from error
        raise name_daemon_field(error, DAEMON_FIELDS) from error
    draft = ResponseDraft(body, _new_id("resp"), int(time.time()), gateway(request).model_name(stream.handle))

    def finish(text: str, done: Done) -> ResponseObject:
        gateway(request).count_generation(done)
        final = draft.finished(text, done)
        if body.store is not False:
            store.put(final.id, StoredResponse(final, conversation + conversation_messages(as_input(final.output))))
        return final

    if body.stream:
        return ClosingStreamingResponse(
            _response_events(stream, request, draft, finish),
            media_type="text/event-stream",
            headers={**SSE_HEADERS, **headers},
        )
    result = await collect_generation(stream, request)
    if result is None:
        return Response(status_code=499)  # the client left; nobody reads this
    response.headers.update(headers)
    return finish(result.text, result.done)


def as_input(output: list[OutputMessage | FunctionCallOutput]) -> list[MessageItem | FunctionCallItem]:
    """Output items as the input items that would send them back (the next turn's history)."""
    return [
        MessageItem(role="assistant", content="".join(part.text for part in item.content))
        if isinstance(item, OutputMessage)
        else FunctionCallItem(type="function_call", call_id=item.call_id, name=item.name, arguments=item.arguments)
        for item in output
    ]


@dataclass
class ResponseDraft:
    """The response being answered: its ids and the request fields every snapshot of it echoes."""

    body: ResponsesRequest
    response_id: str
    created_at: int
    model: str
    message_id: str = field(default_factory=lambda: _new_id("msg"))

    def reply(self, status: str, **fields) -> ResponseObject:
        """The response object in ``status``, with ``fields`` (output, usage, ...) set."""
        body = self.body
        choice = body.tool_choice.model_dump() if isinstance(body.tool_choice, FunctionToolChoice) else body.tool_choice
        text_format = body.text.format if body.text is not None else None
        return ResponseObject(
            id=self.response_id,
            created_at=self.created_at,
            status=status,
            model=self.model,
            instructions=body.instructions,
            max_output_tokens=body.max_output_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            parallel_tool_calls=body.parallel_tool_calls is not False,
            tool_choice=choice or "auto",
            tools=[tool.model_dump(exclude_none=True) for tool in body.tools or ()],
            text={"format": _echoed_format(text_format)},
            previous_response_id=body.previous_response_id,
            store=body.store is not False,
            metadata=body.metadata or {},
            **fields,
        )

    def finished(self, text: str, done: Done) -> ResponseObject:
        """The final response for the generation's whole text and its Done."""
        complete = done.finish_reason != "length"
        output: list[OutputMessage | FunctionCallOutput] = []
        if text or not done.tool_calls:
            output.append(self.message(text, "completed" if complete else "incomplete"))
        output += [
            FunctionCallOutput(
                id=_new_id("fc"), call_id=_new_id("call"), name=call["name"], arguments=call["arguments"]
            )
            for call in done.tool_calls or ()
        ]
        return self.reply(
            "completed" if complete else "incomplete",
            output=output,
            usage=response_usage(done),
            incomplete_details=None if complete else IncompleteDetails(reason="max_output_tokens"),
            timings=done.timings,
        )

    def message(self, text: str, status: str) -> OutputMessage:
        """The message output item (no content part yet while in progress)."""
        content = [] if status == "in_progress" else [OutputText(text=text)]
        return OutputMessage(id=self.message_id, status=status, content=content)


def _echoed_format(text_format) -> dict:
    return text_format.model_dump(by_alias=True, exclude_none=True) if text_format is not None else {"type": "text"}


def response_usage(done: Done) -> ResponseUsage:
    """The Responses API's usage of a Done (the chat endpoint's counts under their Responses names)."""
    usage = usage_of(done)
    assert usage.prompt_tokens_details is not None  # usage_of always sets it
    cached = InputTokensDetails(cached_tokens=usage.prompt_tokens_details.cached_tokens)
    return ResponseUsage(
        input_tokens=usage.prompt_tokens,
        output_tokens=usage.completion_tokens,
        total_tokens=usage.total_tokens,
        input_tokens_details=cached,
    )


class EventWriter:
    """Numbers and frames the events of one streamed response (``event: <type>`` + ``data: <json>``)."""

    def __init__(self) -> None:
        self.sequence_number = 0

    def __call__(self, kind: str, **payload: Any) -> bytes:
        data = {
            "type": kind,
            "sequence_number": self.sequence_number,
            **{
                name: value.model_dump(mode="json") if hasattr(value, "model_dump") else value
                for name, value in payload.items()
            },
        }
        self.sequence_number += 1
        return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


def _response_events(
    stream: GenerationStream, request: Request, draft: ResponseDraft, finish: Callable[[str, Done], ResponseObject]
) -> AsyncIterator[bytes]:
    event = EventWriter()
    output = StreamedOutput()
    text_at = {"item_id": draft.message_id, "output_index": 0, "content_index": 0}
    message_opened = False

    def open_message() -> bytes:
        nonlocal message_opened
        message_opened = True
        return event("response.output_item.added", output_index=0, item=draft.message("", "in_progress")) + event(
            "response.content_part.added", **text_at, part=OutputText(text="")
        )

    def item_events(index: int, item: OutputMessage | FunctionCallOutput) -> bytes:
        if isinstance(item, OutputMessage):
            part = item.content[0]
            events = b"" if message_opened else open_message()
            events += event("response.output_text.done", **text_at, text=part.text, logprobs=[]) + event(
                "response.content_part.done", **text_at, part=part
            )
        else:
            call_at = {"item_id": item.id, "output_index": index}
            events = (
                event(
                    "response.output_item.added",
                    output_index=index,
                    item=item.model_copy(update={"arguments": "", "status": "in_progress"}),
                )
                + event("response.function_call_arguments.delta", **call_at, delta=item.arguments)
                + event("response.function_call_arguments.done", **call_at, name=item.name, arguments=item.arguments)
            )
        return events + event("response.output_item.done", output_index=index, item=item)

    async def events_for(reply) -> AsyncIterator[bytes]:
        text, _ = output.add(reply)
        if text:
            if not message_opened:
                yield open_message()
            yield event("response.output_text.delta", **text_at, delta=text, logprobs=[])
        if isinstance(reply, Done):
            final = finish(output.text, reply)
            for index, item in enumerate(final.output):
                yield item_events(index, item)
            yield event("response.completed" if final.status == "completed" else "response.incomplete", response=final)

    def error_event(error: ApiError) -> bytes:
        failed = draft.reply("failed", error={"code": error.code or "server_error", "message": error.message})
        return event("error", code=error.code, message=error.message, param=error.param) + event(
            "response.failed", response=failed
        )

    in_progress = draft.reply("in_progress")
    opening = event("response.created", response=in_progress) + event("response.in_progress", response=in_progress)
    return sse_body(stream, request, events_for, opening=opening, error_event=error_event)
