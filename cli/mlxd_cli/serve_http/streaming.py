"""Answering from a generation stream: the helpers both route modules use.

Contract: SSE framing (``sse_event``, ``SSE_HEADERS``); ``ClosingStreamingResponse`` (closes its body
iterator however the response ends, a client disconnect included, so the daemon gets Cancel at once);
``sse_body`` (a streaming route's body: it only says what each reply becomes; a daemon failure mid-stream
is one error event); ``StreamedOutput`` / ``unsent_part`` (the part of a Done no Chunk carried); and
``collect_generation`` for non-streaming answers (also stops on a disconnect). Both ask whether the client
went away at most every ``DISCONNECT_CHECK_S`` (``DisconnectWatch``), not after every chunk. Routes import
this module, never the app.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import StreamingResponse

from mlxd_protocol import INTERNAL, Chunk, DaemonError, DaemonTimeout, Done, Progress

from .daemon_pool import GenerationStream
from .errors import ApiError, from_daemon_failure

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # proxies must not buffer tokens
# How often a stream asks whether its client went away: Starlette's check (a cancelled receive) cost more
# than the rest of a chunk's handling when asked for every token (docs/benchmark_results/code_notes.md#stream-chunks)
DISCONNECT_CHECK_S = 0.05


class DisconnectWatch:
    """``request.is_disconnected()``, asked at most every ``DISCONNECT_CHECK_S`` (and on the first call)."""

    def __init__(self, request: Request) -> None:
        self.request = request
        self.next_check = 0.0

    async def gone(self) -> bool:
        now = time.monotonic()
        if now < self.next_check:
            return False
        self.next_check = now + DISCONNECT_CHECK_S
        return await self.request.is_disconnected()


def sse_event(payload: bytes | str) -> bytes:
    """One server-sent event carrying ``payload`` (a JSON document or ``[DONE]``)."""
    data = payload if isinstance(payload, bytes) else payload.encode()
    return b"data: " + data + b"\n\n"


class ClosingStreamingResponse(StreamingResponse):
    """A StreamingResponse that always closes its body iterator when the response ends.

    Starlette stops iterating when the client disconnects but leaves a generator suspended at a
    ``yield`` for the garbage collector; closing it here runs its ``finally`` now, which cancels
    the generation on the daemon instead of letting it run to max_tokens.
    """

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                await close()


async def sse_body(
    stream: GenerationStream,
    request: Request,
    events_for: Callable[[Chunk | Progress | Done], AsyncIterator[bytes]],
    opening: bytes | None = None,
    error_event: Callable[[ApiError], bytes] | None = None,
) -> AsyncIterator[bytes]:
    """The body of a streaming answer: ``opening`` (if any), then ``events_for(reply)`` for every reply.

    Shared by every streaming route, which only says what each reply becomes. The stream ends after the
    Done's events, or when the client has gone (the ``finally`` cancels the generation on the daemon). A
    daemon failure mid-stream is told in-band as one error event, in OpenAI's error shape (or as
    ``error_event(error)`` makes it: Anthropic's routes name the event and use their shape).
    """
    error_event = error_event or (lambda error: sse_event(error.encoded()))
    watch = DisconnectWatch(request)
    try:
        if opening is not None:
            yield opening
        async for reply in stream:
            async for event in events_for(reply):
                yield event
            if isinstance(reply, Done) or await watch.gone():
                return
    except ApiError as error:
        yield error_event(error)
    except Exception as error:  # noqa: BLE001 - the daemon failed mid-stream: tell the client in-band
        yield error_event(from_daemon_failure(error))
    finally:
        await stream.aclose()


def unsent_part(streamed_text: str, streamed_tokens: list[int], done: Done) -> tuple[str, list[int]]:
    """The text and tokens of a Done that no Chunk carried yet.

    docs/protocol.md says a streaming Done carries only what was not sent in chunks, while the
    daemon sends the whole output in the Done; accept both: when the Done's tokens are every token
    (they begin with the streamed ones and number usage.completion_tokens) it holds the whole output.

    Args:
        streamed_text: The text of every Chunk so far.
        streamed_tokens: The tokens of every Chunk so far.
        done: The generation's Done.

    Returns:
        (text, tokens) to add after the streamed ones.
    """
    if not streamed_tokens and not streamed_text:
        return done.text, list(done.tokens)
    whole = (
        len(done.tokens) == done.usage.get("completion_tokens", -1)
        and done.tokens[: len(streamed_tokens)] == streamed_tokens
        and done.text.startswith(streamed_text)
    )
    if whole:
        return done.text[len(streamed_text) :], list(done.tokens[len(streamed_tokens) :])
    return done.text, list(done.tokens)


class StreamedOutput:
    """What a stream sent so far, to take only the new part of its Done (see ``unsent_part``)."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.tokens: list[int] = []

    def add(self, reply: Chunk | Done) -> tuple[str, list[int]]:
        """Record a reply.

        Args:
            reply: The next Chunk, or the Done.

        Returns:
            The reply's new text and tokens.
        """
        if isinstance(reply, Done):
            text, tokens = unsent_part("".join(self.parts), self.tokens, reply)
        else:
            text, tokens = reply.text, list(reply.tokens)
        self.parts.append(text)
        self.tokens.extend(tokens)
        return text, tokens

    @property
    def text(self) -> str:
        return "".join(self.parts)


@dataclass
class CollectedGeneration:
    """A whole generation gathered from its stream (for non-streaming answers)."""

    text: str
    tokens: list[int]
    logprobs: list[dict]
    done: Done


async def collect_generation(stream: GenerationStream, request: Request) -> CollectedGeneration | None:
    """Read a stream to its Done, stopping early (and cancelling) if the HTTP client went away.

    Args:
        stream: An open generation.
        request: The HTTP request (to notice a disconnect between chunks).

    Returns:
        The text, tokens, logprob entries and Done; None when the client disconnected.

    Raises:
        ApiError: The daemon failed mid-generation.
    """
    output = StreamedOutput()
    logprobs: list[dict] = []
    watch = DisconnectWatch(request)
    try:
        async for reply in stream:
            if isinstance(reply, Progress):
                continue  # asked for by streams only
            output.add(reply)
            if isinstance(reply, Done):
                return CollectedGeneration(output.text, output.tokens, logprobs, reply)
            logprobs.extend(reply.logprobs or ())
            if await watch.gone():
                return None
    except (DaemonError, DaemonTimeout) as error:
        raise from_daemon_failure(error) from error
    finally:
        await stream.aclose()
    raise from_daemon_failure(DaemonError(INTERNAL, "the stream ended without a done"))
