"""Message handlers: one function per request type, looked up in a table (no if-chains).

Contract: a handler gets the daemon context, the sender's identity and the decoded message, and returns
the reply to send now (or None when replies come later, as for Generate, or never, as for Cancel). A
handler raises ProtocolError for bad input; the server turns it into an Error reply.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Callable

import psutil

from mlxd_protocol import (
    INVALID, OVERLOADED, PROTOCOL_VERSION, Cancel, Detokenize, DetokenizeResult, Generate, Hello, Message, Ok,
    ProtocolError, Shutdown, Status, StatusRequest, Tokenize, TokenizeResult,
)
from mlxd_scheduler import QueueFull, TokenEvent

from . import __version__
from .chunking import ChunkBuffer
from .edge import to_reply, to_request

if TYPE_CHECKING:
    from .server import DaemonServer


def status(server: "DaemonServer", identity: bytes, message: Message) -> Status:
    scheduler = server.scheduler
    process = psutil.Process(os.getpid())
    memory = {"rss_bytes": process.memory_info().rss}
    try:
        import mlx.core as mx

        memory["mlx_active_bytes"] = int(mx.get_active_memory())
        memory["mlx_peak_bytes"] = int(mx.get_peak_memory())
    except (AttributeError, RuntimeError):
        pass
    memory["kv"] = server.engine.storage.usage()
    return Status(
        model=server.loaded.path, protocol_version=PROTOCOL_VERSION, daemon_version=__version__,
        uptime_s=round(time.monotonic() - server.started, 3), active=scheduler.active,
        queued=len(scheduler.waiting), max_batch=scheduler.options.max_batch, memory=memory,
        options=server.options_summary(), totals={**scheduler.totals, **scheduler.prompt_lookup.counters},
        pid=os.getpid(),
        id=getattr(message, "id", None),
    )


def hello(server: "DaemonServer", identity: bytes, message: Hello) -> Status:
    server.log.debug("hello from %r", message.client)
    return status(server, identity, message)


def generate(server: "DaemonServer", identity: bytes, message: Generate) -> None:
    internal_id = f"{identity.hex()}:{message.id}"
    if server.draining:
        raise ProtocolError(OVERLOADED, "the daemon is shutting down; retry on another daemon")
    if internal_id in server.routes:
        raise ProtocolError(INVALID, f"request id {message.id!r} is already running")
    request = to_request(server.loaded, message, internal_id, server.options.sampling)
    chunks = ChunkBuffer(message.id, server.options.stream_interval_s)

    def sink(event) -> None:
        if isinstance(event, TokenEvent):
            if not message.stream:
                return
            ready = chunks.add(event.tokens, event.text, event.logprobs, time.monotonic())
            if ready is None:
                server.chunks_waiting[internal_id] = (identity, chunks)
            else:  # ready holds whatever was kept: the buffer keeps nothing now
                server.chunks_waiting.pop(internal_id, None)
                server.send(identity, ready)
            return
        if internal_id in server.chunks_waiting:
            server.send_kept_chunk(internal_id)  # the last tokens go before the Done (or Error)
        server.send(identity, to_reply(event, message.id, message.stream))
        server.routes.pop(internal_id, None)

    server.routes[internal_id] = message.id
    try:
        server.scheduler.submit(request, sink)
    except QueueFull as error:
        server.routes.pop(internal_id, None)
        raise ProtocolError(OVERLOADED, str(error)) from error
    except ValueError as error:
        server.routes.pop(internal_id, None)
        raise ProtocolError(INVALID, str(error)) from error
    return None


def cancel(server: "DaemonServer", identity: bytes, message: Cancel) -> None:
    server.scheduler.cancel(f"{identity.hex()}:{message.id}")
    return None


def tokenize(server: "DaemonServer", identity: bytes, message: Tokenize) -> TokenizeResult:
    tokenizer = server.loaded.tokenizer
    if message.messages is not None:
        if not tokenizer.has_chat_template:
            raise ProtocolError(INVALID, "this model has no chat template")
        tokens = tokenizer.apply_chat_template(message.messages, add_generation_prompt=True)
    else:
        tokens = tokenizer.encode(message.text, add_special_tokens=message.add_special_tokens)
    return TokenizeResult(tokens=list(tokens), id=message.id)


def detokenize(server: "DaemonServer", identity: bytes, message: Detokenize) -> DetokenizeResult:
    vocab = server.loaded.vocab_size
    bad = [t for t in message.tokens if not 0 <= t < vocab]
    if bad:
        raise ProtocolError(INVALID, f"tokens: {bad[0]} is outside the vocabulary of {vocab}")
    return DetokenizeResult(text=server.loaded.tokenizer.decode(message.tokens), id=message.id)


def shutdown(server: "DaemonServer", identity: bytes, message: Shutdown) -> Ok:
    server.request_stop("shutdown message")
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
