"""Message handlers: one function per request type, looked up in a table (no if-chains).

Contract: a handler gets a ``HandlerContext``, the sender's identity and the decoded message, and returns
the reply to send now (or None when replies come later, as for Generate, or never, as for Cancel). The
context is narrow on purpose: the loaded model (tokenizer, vocabulary), the scheduler to submit to and
cancel on, the reply streams, the default sampler settings, and a few read-only views and callbacks; no
sockets and nothing of the server's own state. A handler raises ProtocolError for bad input; the core
turns it into an Error reply.

Host work (chat templates, tokenizing, grammar compilation) that is not small (``host_limits``) goes to
the worker threads through ``ctx.offload(identity, request_id, work, finish)``: ``work`` touches no daemon
state; ``finish(future)`` runs on the loop thread and returns the reply (or None), and an exception from
either becomes the Error reply. A Generate being prepared so is in ``ctx.preparing`` until its finish
submits it: a Cancel meanwhile marks it, and the finish answers with a cancelled Done instead. An Embed
is queued on ``ctx.embeddings`` once tokenized; its reply comes from the queue.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import psutil

from mlxd_engine import GrammarLimits, LoadedModel, memory_usage
from mlxd_protocol import (
    FINISH_CANCELLED,
    INVALID,
    OVERLOADED,
    PROTOCOL_VERSION,
    Cancel,
    Detokenize,
    DetokenizeResult,
    Done,
    Embed,
    Generate,
    Hello,
    Message,
    Ok,
    ProtocolError,
    Sampling,
    Shutdown,
    Status,
    StatusRequest,
    Tokenize,
    TokenizeResult,
)
from mlxd_protocol.field_checks import MAX_LIST_ITEMS
from mlxd_protocol.sampling_rules import token_outside_vocabulary
from mlxd_scheduler import BatchScheduler, QueueFull, Request

from . import __version__
from .edge import render_chat, rendered_chat_tokens, to_request, tool_call_splitter, without_bos_text
from .embeddings import EmbeddingQueue
from .host_limits import (
    HostLimits,
    check_embed,
    check_generate,
    check_tokenize,
    runs_inline_detokenize,
    runs_inline_embed,
    runs_inline_generate,
    runs_inline_tokenize,
)
from .reasoning import template_variables
from .streams import ReplyStreams

log = logging.getLogger("mlxd")


@dataclass(frozen=True)
class HandlerContext:
    """What a handler may use (built by ``core.DaemonCore``)."""

    loaded: LoadedModel
    scheduler: BatchScheduler
    streams: ReplyStreams
    sampling: Sampling  # the daemon's default sampler settings (a request without "sampling" gets them)
    started: float  # time.monotonic() at start, for uptime
    options_summary: Callable[[], dict]  # the effective options, for Status
    kv_usage: Callable[[], dict]  # KV storage occupancy, for Status
    request_stop: Callable[[str], None]
    is_draining: Callable[[], bool]
    limits: HostLimits = field(default_factory=HostLimits)
    grammar_limits: GrammarLimits = field(default_factory=GrammarLimits)  # limits.grammar(), built once
    offload: Offload | None = None  # None: every piece of host work runs at once, on the caller's thread
    preparing: dict[str, Preparing] = field(default_factory=dict)  # internal id -> a Generate on a worker
    embeddings: EmbeddingQueue | None = None  # Embed requests, computed between ticks (None: not served)
    reasoning: str = "auto"  # --reasoning: thinking on, off or as the chat template has it (reasoning.py)


@dataclass
class Preparing:
    """A Generate whose host work runs on a worker thread."""

    identity: bytes  # the connection that asked
    client_id: str
    cancelled: bool = False


Offload = Callable[[bytes, "str | None", Callable[[], Any], Callable[[Future], "Message | None"]], None]


def _run(
    ctx: HandlerContext,
    identity: bytes,
    request_id: str | None,
    inline: bool,
    work: Callable[[], Any],
    finish: Callable[[Future], Message | None],
) -> Message | None:
    """Do ``work`` now (small, or no workers) and return ``finish``'s reply, or hand both to the workers."""
    if inline or ctx.offload is None:
        done: Future = Future()
        done.set_result(work())
        return finish(done)
    ctx.offload(identity, request_id, work, finish)
    return None


def internal_id(identity: bytes, request_id: str) -> str:
    """The scheduler's id for a client's request: request ids are unique per connection only."""
    return f"{identity.hex()}:{request_id}"


def status(ctx: HandlerContext, identity: bytes, message: Message) -> Status:
    scheduler = ctx.scheduler
    memory = {"rss_bytes": psutil.Process(os.getpid()).memory_info().rss, **memory_usage(), "kv": ctx.kv_usage()}
    if scheduler.shared_drafts is not None:  # the shared draft store: stores (keys), tokens and documents held
        memory["shared_drafts"] = scheduler.shared_drafts.summary()
    return Status(
        model=ctx.loaded.path,
        protocol_version=PROTOCOL_VERSION,
        daemon_version=__version__,
        uptime_s=round(time.monotonic() - ctx.started, 3),
        active=scheduler.active,
        queued=len(scheduler.waiting),
        max_batch=scheduler.options.max_batch,
        memory=memory,
        options=ctx.options_summary(),
        totals={**scheduler.totals, **scheduler.prompt_lookup.counters},
        pid=os.getpid(),
        id=getattr(message, "id", None),
    )


def hello(ctx: HandlerContext, identity: bytes, message: Hello) -> Status:
    log.debug("hello from %r", message.client)
    return status(ctx, identity, message)


def generate(ctx: HandlerContext, identity: bytes, message: Generate) -> Message | None:
    running_as = internal_id(identity, message.id)
    if ctx.is_draining():
        raise ProtocolError(OVERLOADED, "the daemon is shutting down; retry on another daemon")
    if running_as in ctx.streams or running_as in ctx.preparing:
        raise ProtocolError(INVALID, f"request id {message.id!r} is already running")
    check_generate(message, ctx.limits)
    inline = runs_inline_generate(message) or ctx.offload is None
    if not inline:
        ctx.preparing[running_as] = Preparing(identity, message.id)

    def work() -> Request:
        return to_request(ctx.loaded, message, running_as, ctx.sampling, ctx.grammar_limits, ctx.reasoning)

    def finish(prepared: Future) -> Message | None:
        state = ctx.preparing.pop(running_as, None)
        if state is not None and state.cancelled:
            return Done(id=message.id, finish_reason=FINISH_CANCELLED)
        request = prepared.result()
        if ctx.is_draining():
            raise ProtocolError(OVERLOADED, "the daemon is shutting down; retry on another daemon")
        _submit(ctx, identity, message, running_as, request)
        return None

    if inline:
        return _run(ctx, identity, message.id, True, work, finish)
    try:
        assert ctx.offload is not None  # else inline
        ctx.offload(identity, message.id, work, finish)
    except BaseException:
        ctx.preparing.pop(running_as, None)
        raise
    return None


def _submit(ctx: HandlerContext, identity: bytes, message: Generate, running_as: str, request: Request) -> None:
    """Hand a prepared request to the scheduler; its replies come through the reply streams."""
    sink = ctx.streams.open(identity, message, running_as, tool_call_splitter(ctx.loaded, message))
    try:
        ctx.scheduler.submit(request, sink)
    except QueueFull as error:
        ctx.streams.discard(running_as)
        raise ProtocolError(OVERLOADED, str(error)) from error
    except ValueError as error:
        ctx.streams.discard(running_as)
        raise ProtocolError(INVALID, str(error)) from error
    return None


def cancel(ctx: HandlerContext, identity: bytes, message: Cancel) -> None:
    running_as = internal_id(identity, message.id)
    preparing = ctx.preparing.get(running_as)
    if preparing is not None:
        preparing.cancelled = True  # its finish answers with a cancelled Done
        return None
    ctx.scheduler.cancel(running_as)
    return None


def tokenize(ctx: HandlerContext, identity: bytes, message: Tokenize) -> Message | None:
    tokenizer = ctx.loaded.tokenizer
    check_tokenize(message, ctx.limits)
    if message.messages is not None and not tokenizer.has_chat_template:
        raise ProtocolError(INVALID, "this model has no chat template")

    def work() -> tuple[list[int], str | None]:
        if message.messages is not None:
            text = render_chat(
                tokenizer,
                message.messages,
                message.tools,
                message.continue_final_message,
                template_variables(ctx.reasoning, message.chat_template_kwargs),
                message.add_generation_prompt,
            )
            return rendered_chat_tokens(tokenizer, text), without_bos_text(tokenizer, text)
        return list(tokenizer.encode(message.text, add_special_tokens=message.add_special_tokens)), None

    def finish(done: Future) -> TokenizeResult:
        tokens, text = done.result()
        if len(tokens) > MAX_LIST_ITEMS:
            raise ProtocolError(
                INVALID,
                f"the text is {len(tokens)} tokens; a reply carries at most {MAX_LIST_ITEMS} (tokenize it in parts)",
            )
        return TokenizeResult(tokens=tokens, id=message.id, text=text if message.return_text else None)

    return _run(ctx, identity, message.id, runs_inline_tokenize(message), work, finish)


def detokenize(ctx: HandlerContext, identity: bytes, message: Detokenize) -> Message | None:
    vocab = ctx.loaded.vocab_size
    bad = token_outside_vocabulary(message.tokens, vocab)
    if bad is not None:
        raise ProtocolError(INVALID, f"tokens: {bad} is outside the vocabulary of {vocab}")

    def finish(done: Future) -> DetokenizeResult:
        return DetokenizeResult(text=done.result(), id=message.id)

    return _run(
        ctx,
        identity,
        message.id,
        runs_inline_detokenize(message),
        lambda: ctx.loaded.tokenizer.decode(message.tokens),
        finish,
    )


def embed(ctx: HandlerContext, identity: bytes, message: Embed) -> Message | None:
    """Tokenize an Embed's texts (token inputs as they are) and queue it; the EmbedResult comes after the
    forwards, run between ticks (``embeddings.EmbeddingQueue``)."""
    if ctx.embeddings is None:
        raise ProtocolError(INVALID, "embeddings are not served by this daemon")
    if ctx.is_draining():
        raise ProtocolError(OVERLOADED, "the daemon is shutting down; retry on another daemon")
    check_embed(message, ctx.limits)
    embeddings = ctx.embeddings
    embeddings.source()  # a model without a hidden state is refused before any tokenizing
    tokenizer = ctx.loaded.tokenizer

    def work() -> list[list[int]]:
        if message.token_inputs is not None:
            return [list(tokens) for tokens in message.token_inputs]
        assert message.texts is not None  # Embed.validate: texts or token_inputs
        return [list(tokenizer.encode(text, add_special_tokens=message.add_special_tokens)) for text in message.texts]

    def finish(done: Future) -> None:
        embeddings.submit(identity, message, done.result())
        return None

    return _run(ctx, identity, message.id, runs_inline_embed(message), work, finish)


def shutdown(ctx: HandlerContext, identity: bytes, message: Shutdown) -> Ok:
    ctx.request_stop("shutdown message")
    return Ok(id=message.id)


HANDLERS: dict[type[Message], Callable] = {
    Hello: hello,
    StatusRequest: status,
    Generate: generate,
    Cancel: cancel,
    Tokenize: tokenize,
    Detokenize: detokenize,
    Embed: embed,
    Shutdown: shutdown,
}
