"""Message handlers: one function per request type, looked up in a table (no if-chains).

Contract: a handler gets a ``HandlerContext``, the sender's identity and the decoded message, and returns
the reply to send now (or None when replies come later, as for Generate, or never, as for Cancel). The
context is narrow on purpose: the loaded model (tokenizer, vocabulary), the scheduler to submit to and
cancel on, the reply streams, the default sampler settings, and a few read-only views and callbacks; no
sockets and nothing of the server's own state. A handler raises ProtocolError for bad input; the core
turns it into an Error reply.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Callable

import psutil

from mlxd_engine import LoadedModel, memory_usage
from mlxd_protocol import (
    INVALID, OVERLOADED, PROTOCOL_VERSION, Cancel, Detokenize, DetokenizeResult, Generate, Hello, Message, Ok,
    ProtocolError, Sampling, Shutdown, Status, StatusRequest, Tokenize, TokenizeResult,
)
from mlxd_scheduler import BatchScheduler, QueueFull

from . import __version__
from .edge import to_request, tool_call_splitter
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


def internal_id(identity: bytes, request_id: str) -> str:
    """The scheduler's id for a client's request: request ids are unique per connection only."""
    return f"{identity.hex()}:{request_id}"


def status(ctx: HandlerContext, identity: bytes, message: Message) -> Status:
    scheduler = ctx.scheduler
    memory = {"rss_bytes": psutil.Process(os.getpid()).memory_info().rss, **memory_usage(), "kv": ctx.kv_usage()}
    return Status(
        model=ctx.loaded.path, protocol_version=PROTOCOL_VERSION, daemon_version=__version__,
        uptime_s=round(time.monotonic() - ctx.started, 3), active=scheduler.active,
        queued=len(scheduler.waiting), max_batch=scheduler.options.max_batch, memory=memory,
        options=ctx.options_summary(), totals={**scheduler.totals, **scheduler.prompt_lookup.counters},
        pid=os.getpid(),
        id=getattr(message, "id", None),
    )


def hello(ctx: HandlerContext, identity: bytes, message: Hello) -> Status:
    log.debug("hello from %r", message.client)
    return status(ctx, identity, message)


def generate(ctx: HandlerContext, identity: bytes, message: Generate) -> None:
    running_as = internal_id(identity, message.id)
    if ctx.is_draining():
        raise ProtocolError(OVERLOADED, "the daemon is shutting down; retry on another daemon")
    if running_as in ctx.streams:
        raise ProtocolError(INVALID, f"request id {message.id!r} is already running")
    request = to_request(ctx.loaded, message, running_as, ctx.sampling)
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
    ctx.scheduler.cancel(internal_id(identity, message.id))
    return None


def tokenize(ctx: HandlerContext, identity: bytes, message: Tokenize) -> TokenizeResult:
    tokenizer = ctx.loaded.tokenizer
    if message.messages is not None:
        if not tokenizer.has_chat_template:
            raise ProtocolError(INVALID, "this model has no chat template")
        tokens = tokenizer.apply_chat_template(message.messages, add_generation_prompt=True)
    else:
        tokens = tokenizer.encode(message.text, add_special_tokens=message.add_special_tokens)
    return TokenizeResult(tokens=list(tokens), id=message.id)


def detokenize(ctx: HandlerContext, identity: bytes, message: Detokenize) -> DetokenizeResult:
    vocab = ctx.loaded.vocab_size
    bad = [t for t in message.tokens if not 0 <= t < vocab]
    if bad:
        raise ProtocolError(INVALID, f"tokens: {bad[0]} is outside the vocabulary of {vocab}")
    return DetokenizeResult(text=ctx.loaded.tokenizer.decode(message.tokens), id=message.id)


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
    Shutdown: shutdown,
}
