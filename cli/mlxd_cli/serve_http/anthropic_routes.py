"""Anthropic's Messages API: POST /v1/messages and POST /v1/messages/count_tokens.

Contract:
    * A Messages body becomes a chat Generate (``schemas.anthropic_api``: system first, tool_use /
      tool_result blocks as the chat template's tool calls and tool messages, a final assistant text
      continued as prefill), so the daemon's prefix cache and prompt lookup serve it as any chat.
      ``max_tokens`` is required, as Anthropic's; sampling fields left out take the daemon's defaults.
    * The answer is Anthropic's ``message``: ``content`` holds a text block (when there is text) and one
      ``tool_use`` block per call (``toolu_...`` id, ``input`` the call's arguments as an object);
      ``stop_reason`` is "tool_use" when the model called a tool, "max_tokens" at the limit,
      "stop_sequence" (and ``stop_sequence`` the one matched) at a stop sequence, else "end_turn".
      ``usage.input_tokens`` counts the prompt tokens prefilled, ``cache_read_input_tokens`` those the
      prefix cache supplied (their sum is the prompt, what count_tokens answers).
    * ``stream: true`` is Anthropic's SSE: ``message_start`` (usage not yet known: zeros), ``ping``, then
      per block ``content_block_start`` / ``content_block_delta`` (``text_delta``; a tool call's whole
      arguments as one ``input_json_delta``, sent once the call is parsed) / ``content_block_stop``,
      then ``message_delta`` (stop_reason, stop_sequence and the full usage) and ``message_stop``. A
      daemon failure mid-stream is one ``error`` event in Anthropic's error shape.
    * count_tokens is the number of tokens the daemon's chat template makes of the same conversation and
      tools (a Tokenize with messages and tools): ``input_tokens`` + ``cache_read_input_tokens`` of the
      same Generate (a final assistant message counted as the prefill it is). Errors on these paths have
      Anthropic's shape (``errors.uses_anthropic_shape``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request, Response

from mlxd_protocol import Done, Generate, new_request_id

from .context import gateway
from .daemon_pool import DaemonHandle, DaemonPool, GenerationStream, call_daemon, open_generation
from .errors import ApiError, anthropic_error_body
from .json_body import JsonBodyRoute, UnsafeJson, parse_json
from .request_fields import name_daemon_field
from .schemas import build_sampling, normalize_stop
from .schemas.anthropic_api import (
    AnthropicErrorResponse,
    AnthropicMessage,
    CountTokensRequest,
    MessagesInput,
    MessagesRequest,
    MessageUsage,
    StopReason,
    TextContent,
    TokenCount,
    ToolUseContent,
)
from .streaming import SSE_HEADERS, ClosingStreamingResponse, StreamedOutput, collect_generation, sse_body

router = APIRouter(route_class=JsonBodyRoute)  # bodies read by json_body.parse_json
# protocol field -> the Messages API field a daemon refusal is about
DAEMON_FIELDS = {"tools": "tools", "tool_choice": "tool_choice", "constraint": "output_config.format"}
ERROR_RESPONSES: dict[int | str, dict] = {
    status: {"model": AnthropicErrorResponse, "description": description}
    for status, description in (
        (400, "invalid request (invalid_request_error)"),
        (401, "missing or wrong API key (authentication_error)"),
        (413, "request body too large"),
        (429, "too many requests in flight, or the daemon is overloaded"),
        (500, "internal error (api_error)"),
        (503, "no daemon available (overloaded_error)"),
    )
}
STREAM_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {}}, "description": "the message, or SSE when stream=true"}
}


def anthropic_event(name: str, payload: dict) -> bytes:
    """One server-sent event as Anthropic sends them: ``event: <name>`` and its JSON (``"type": name``)."""
    return f"event: {name}\ndata: {json.dumps({'type': name, **payload})}\n\n".encode()


def _error_event(error: ApiError) -> bytes:
    return anthropic_event("error", {"error": anthropic_error_body(error)["error"]})


def message_request_builder(body: MessagesRequest) -> Callable[[DaemonHandle], Generate]:
    """``make_request(handle) -> Generate`` for a Messages body, filling sampling defaults from that daemon."""
    conversation = body.chat_conversation()
    stop = normalize_stop(body.stop_sequences)
    overrides = body.sampling_overrides()
    tool_fields = body.tool_fields()
    constraint = body.constraint()

    def make_request(handle: DaemonHandle) -> Generate:
        return Generate(
            id=new_request_id(),
            messages=conversation.messages,
            chat=True,
            max_tokens=body.max_tokens,
            stop=stop,
            stream=True,
            sampling=build_sampling(overrides, handle.sampling_defaults),
            constraint=constraint,
            continue_final_message=conversation.continue_final_message,
            **tool_fields,
        )

    return make_request


def _refusal_named_for_http(error: ApiError) -> ApiError:
    """A daemon refusal, naming the Messages API's field (or what to do) rather than the protocol's."""
    if error.status == 400 and "no chat template" in error.message:
        return ApiError(
            400,
            "this model has no chat template, which the Messages API needs: send a plain prompt "
            "to /v1/completions or /completion instead",
            param="messages",
            code=error.code,
        )
    return name_daemon_field(error, DAEMON_FIELDS)


def tool_use_blocks(done: Done, first_only: bool) -> list[ToolUseContent]:
    """The daemon's parsed calls as tool_use blocks (arguments that are not a JSON object are kept whole,
    under ``"arguments"``: ``input`` must be an object)."""
    blocks = []
    for call in (done.tool_calls or ())[: 1 if first_only else None]:
        try:
            arguments = parse_json(call["arguments"])
        except (json.JSONDecodeError, UnsafeJson):
            arguments = call["arguments"]
        tool_input = arguments if isinstance(arguments, dict) else {"arguments": arguments}
        blocks.append(ToolUseContent(id=f"toolu_{uuid.uuid4().hex[:24]}", name=call["name"], input=tool_input))
    return blocks


async def stop_reason_of(
    pool: DaemonPool, done: Done, tokens: list[int], stop: list[str], called_tools: bool
) -> tuple[StopReason, str | None]:
    """Anthropic's (stop_reason, stop_sequence) of a finished generation."""
    if called_tools:
        return "tool_use", None
    if done.finish_reason == "length":
        return "max_tokens", None
    if done.finish_reason != "stop" or not stop or not tokens:
        return "end_turn", None
    # The daemon says "stop" for an end-of-sequence token and for a stop string alike; its text is cut
    # before the first stop string, so the raw output holds one exactly when one matched: the earliest.
    raw = await call_daemon(pool, lambda client: client.detokenize(tokens))
    found = [(raw.find(sequence), sequence) for sequence in stop if sequence in raw]
    return ("stop_sequence", min(found)[1]) if found else ("end_turn", None)


def usage_of(done: Done) -> MessageUsage:
    """Anthropic's usage: the prompt split into prefilled and prefix-cache tokens."""
    prompt, cached = int(done.usage.get("prompt_tokens", 0)), int(done.usage.get("cached_tokens", 0))
    return MessageUsage(
        input_tokens=prompt - cached,
        output_tokens=int(done.usage.get("completion_tokens", 0)),
        cache_read_input_tokens=cached,
    )


@router.post("/v1/messages", response_model=AnthropicMessage, responses={**STREAM_RESPONSES, **ERROR_RESPONSES})
async def create_message(body: MessagesRequest, request: Request):
    """A model reply to a conversation (Anthropic's Messages API)."""
    pool = gateway(request).pool
    try:
        stream = await open_generation(pool, message_request_builder(body))
    except ApiError as error:
        raise _refusal_named_for_http(error) from error
    message_id = f"msg_{uuid.uuid4().hex[:24]}"
    if body.stream:
        return ClosingStreamingResponse(
            _message_events(stream, request, body, message_id), media_type="text/event-stream", headers=SSE_HEADERS
        )
    result = await collect_generation(stream, request)
    if result is None:
        return Response(status_code=499)  # the client left; nobody reads this
    gateway(request).count_generation(result.done)
    calls = tool_use_blocks(result.done, body.keeps_one_call())
    reason, sequence = await stop_reason_of(
        pool, result.done, result.tokens, normalize_stop(body.stop_sequences), bool(calls)
    )
    content = ([TextContent(text=result.text)] if result.text else []) + calls
    return AnthropicMessage(
        id=message_id,
        model=gateway(request).model_name(stream.handle),
        content=content,
        stop_reason=reason,
        stop_sequence=sequence,
        usage=usage_of(result.done),
    )


def _message_events(
    stream: GenerationStream, request: Request, body: MessagesRequest, message_id: str
) -> AsyncIterator[bytes]:
    model = gateway(request).model_name(stream.handle)
    output = StreamedOutput()
    blocks_started: list[str] = []  # the content blocks opened so far (only the text block stays open between replies)
    empty = AnthropicMessage(
        id=message_id, model=model, content=[], stop_reason=None, usage=MessageUsage(input_tokens=0, output_tokens=0)
    )
    opening = anthropic_event("message_start", {"message": empty.model_dump()}) + anthropic_event("ping", {})

    async def events_for(reply) -> AsyncIterator[bytes]:
        text, _ = output.add(reply)
        if text:
            if not blocks_started:
                blocks_started.append("text")
                yield anthropic_event(
                    "content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}
                )
            yield anthropic_event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": text}})
        if not isinstance(reply, Done):
            return
        gateway(request).count_generation(reply)
        if blocks_started:
            yield anthropic_event("content_block_stop", {"index": 0})
        calls = tool_use_blocks(reply, body.keeps_one_call())
        for call in calls:
            index = len(blocks_started)
            blocks_started.append("tool_use")
            yield anthropic_event(
                "content_block_start", {"index": index, "content_block": {**call.model_dump(), "input": {}}}
            )
            yield anthropic_event(
                "content_block_delta",
                {"index": index, "delta": {"type": "input_json_delta", "partial_json": json.dumps(call.input)}},
            )
            yield anthropic_event("content_block_stop", {"index": index})
        reason, sequence = await stop_reason_of(
            gateway(request).pool, reply, output.tokens, normalize_stop(body.stop_sequences), bool(calls)
        )
        yield anthropic_event(
            "message_delta",
            {"delta": {"stop_reason": reason, "stop_sequence": sequence}, "usage": usage_of(reply).model_dump()},
        )
        yield anthropic_event("message_stop", {})

    return sse_body(stream, request, events_for, opening=opening, error_event=_error_event)


@router.post("/v1/messages/count_tokens", response_model=TokenCount, responses=ERROR_RESPONSES)
async def count_tokens(body: CountTokensRequest, request: Request) -> TokenCount:
    """The prompt tokens a Messages request with this conversation and these tools would have."""
    return TokenCount(input_tokens=await count_conversation_tokens(gateway(request).pool, body))


async def count_conversation_tokens(pool: DaemonPool, body: MessagesInput) -> int:
    """Tokens of the body's conversation and offered tools through the daemon's chat template.

    Args:
        pool: The daemons (one tokenizes).
        body: A Messages or count_tokens body.

    Returns:
        The number of prompt tokens a Generate of the same conversation has.
    """
    conversation = body.chat_conversation()
    tools = body.tool_fields().get("tools")
    try:
        tokens = await call_daemon(
            pool,
            lambda client: client.tokenize(
                messages=conversation.messages, tools=tools, continue_final_message=conversation.continue_final_message
            ),
        )
    except ApiError as error:
        raise _refusal_named_for_http(error) from error
    return len(tokens)
