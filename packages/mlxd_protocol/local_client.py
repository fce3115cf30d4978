"""``LocalClient``: the client interface over a daemon core running in this process, no socket.

Contract:
    * ``LocalClient(make_core)`` builds its core with ``make_core(deliver)``; the core answers a request
      with ``core.handle(identity, message)`` (the reply to send now, or None) and sends later replies
      through ``deliver(identity, message)``; ``core.turn()`` advances it (one scheduler tick) and
      ``core.has_work`` says whether a turn would do anything. ``mlxd_daemon.local.local_client(options)``
      builds one around the daemon's own core from ``DaemonOptions``, so it runs what mlxd runs.
    * The same behaviour as ``Client`` (see ``interface.DaemonClient``): ``generate`` yields Chunks then
      the Done, an Error reply raises ``DaemonError``, leaving the stream early sends Cancel. Requests
      and replies pass through ``encode`` / ``decode``, so whatever a daemon's socket would refuse is
      refused here too (an invalid request raises ``ProtocolError`` before anything runs).
    * No thread: waiting for a reply turns the core on the caller's thread (MLX work stays on it).
      Several ``generate`` iterators may be interleaved; their requests are batched as in the daemon.
    * This module imports no mlx; the core it is given does.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Protocol

from .client_common import DaemonError, ReplyT, new_request_id, tokenize_request, unwrap_reply
from .codec import decode, encode
from .messages import (
    INTERNAL,
    Cancel,
    Chunk,
    Detokenize,
    DetokenizeResult,
    Done,
    Embed,
    EmbedResult,
    Generate,
    Hello,
    Message,
    Ok,
    Shutdown,
    Status,
    StatusRequest,
    TokenizeResult,
)

IDENTITY = b"local"  # the one connection a local core sees

Deliver = Callable[[bytes, Message], None]


class LocalCore(Protocol):
    """What LocalClient drives (``mlxd_daemon.core.DaemonCore`` is one)."""

    @property
    def has_work(self) -> bool: ...

    def handle(self, identity: bytes, message: Message) -> Message | None: ...

    def turn(self) -> None: ...


class LocalClient:
    """In-process client; see the module docstring.

    Args:
        make_core: Builds the core, given the function it must send later replies through.
    """

    def __init__(self, make_core: Callable[[Deliver], LocalCore]) -> None:
        self._waiting: dict[str, deque] = {}  # request id -> its replies not read yet
        self._core = make_core(self._deliver)
        self._closed = False

    def __enter__(self) -> LocalClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Cancel the generations still running; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        for request_id in list(self._waiting):
            self._request(Cancel(id=request_id))
        self._waiting.clear()
        if self._core.has_work:
            self._core.turn()  # settles the cancellations
        release = getattr(self._core, "close", None)
        if release is not None:
            release()  # the daemon core's host-work threads stop

    # ---- the transport -------------------------------------------------------------------------

    def _deliver(self, identity: bytes, message: Message) -> None:
        reply = decode(encode(message))
        queue = self._waiting.get(reply.id) if reply.id is not None else None
        if queue is not None:  # else: the request is over (the tail of an abandoned stream)
            queue.append(reply)

    def _request(self, message: Message) -> Message | None:
        """Hand ``message`` to the core as the daemon would receive it; its immediate reply, if any."""
        if self._closed and not isinstance(message, Cancel):
            raise DaemonError(INTERNAL, "the local client is closed")
        reply = self._core.handle(IDENTITY, decode(encode(message)))
        return None if reply is None else decode(encode(reply))

    def _next_reply(self, request_id: str) -> Message:
        queue = self._waiting[request_id]
        while not queue:
            if not self._core.has_work:
                raise DaemonError(INTERNAL, f"request {request_id} ended without a reply")
            self._core.turn()
        return queue.popleft()

    def _call(self, request: Message, expected: type[ReplyT]) -> ReplyT:
        request_id = request.id
        assert request_id is not None  # every request sent here carries new_request_id()
        self._waiting[request_id] = deque()
        try:
            reply = self._request(request)
            if reply is None:
                reply = self._next_reply(request_id)
            return unwrap_reply(reply, expected)
        finally:
            self._waiting.pop(request_id, None)

    # ---- the interface (as Client) -------------------------------------------------------------

    def hello(self, client: str = "mlxd_protocol.LocalClient") -> Status:
        return self._call(Hello(client=client, id=new_request_id()), Status)

    def status(self) -> Status:
        return self._call(StatusRequest(id=new_request_id()), Status)

    def ping(self, timeout_s: float = 1.0) -> bool:
        try:
            return isinstance(self.status(), Status)
        except Exception:  # a probe reports, it does not fail
            return False

    def tokenize(
        self,
        text: str | None = None,
        messages: list[dict] | None = None,
        add_special_tokens: bool = True,
        tools: list[dict] | None = None,
        chat_template_kwargs: dict | None = None,
        continue_final_message: bool = False,
    ) -> list[int]:
        request = tokenize_request(
            text,
            messages,
            add_special_tokens,
            tools,
            chat_template_kwargs=chat_template_kwargs,
            continue_final_message=continue_final_message,
        )
        return self._call(request, TokenizeResult).tokens

    def render_chat(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        chat_template_kwargs: dict | None = None,
        continue_final_message: bool = False,
    ) -> str:
        request = tokenize_request(
            messages=messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            chat_template_kwargs=chat_template_kwargs,
            continue_final_message=continue_final_message,
            return_text=True,
        )
        return self._call(request, TokenizeResult).text  # type: ignore[return-value]  # set: return_text

    def detokenize(self, tokens: list[int]) -> str:
        return self._call(Detokenize(tokens=list(tokens), id=new_request_id()), DetokenizeResult).text

    def embed(
        self,
        texts: list[str] | None = None,
        token_inputs: list[list[int]] | None = None,
        pooling: str | None = None,
        normalize: bool = True,
    ) -> EmbedResult:
        request = Embed(
            texts=texts, token_inputs=token_inputs, pooling=pooling, normalize=normalize, id=new_request_id()
        )
        return self._call(request, EmbedResult)

    def shutdown(self) -> None:
        self._call(Shutdown(id=new_request_id()), Ok)

    def cancel(self, request_id: str) -> None:
        self._request(Cancel(id=request_id))

    def generate(self, request: Generate) -> Iterator[Chunk | Done]:
        """Send a Generate and iterate over its replies (as ``Client.generate``).

        Raises:
            ProtocolError: The request is invalid (raised here, before anything runs).
            DaemonError: While iterating, when the core answers with an Error.
        """
        self._waiting[request.id] = deque()
        try:
            immediate = self._request(request)
        except BaseException:
            self._waiting.pop(request.id, None)
            raise
        return self._stream(request.id, immediate)

    def _stream(self, request_id: str, immediate: Message | None) -> Iterator[Chunk | Done]:
        finished = False
        try:
            if immediate is not None:  # answered at once: an Error (refused), never a stream
                finished = True
                yield unwrap_reply(immediate, Done)
                return
            while True:
                reply = self._next_reply(request_id)
                if isinstance(reply, Chunk):
                    yield reply
                    continue
                finished = True
                yield unwrap_reply(reply, Done)
                return
        finally:
            self._waiting.pop(request_id, None)
            if not finished and not self._closed:
                self.cancel(request_id)
                if self._core.has_work:
                    self._core.turn()  # the cancellation settles at the next tick boundary
