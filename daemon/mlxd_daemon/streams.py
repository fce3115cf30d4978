"""Where the replies of running generations go: each request's route and its chunk buffer.

Contract: ``ReplyStreams(send, interval_s)`` owns every generation in flight on the daemon. ``open(identity,
message, internal_id)`` registers a Generate and returns the scheduler event sink that answers it: token
events become Chunks, coalesced in time by a ``ChunkBuffer`` (nothing for a non-streaming request); the
finish event becomes the Done (or Error), sent after whatever the buffer still keeps. ``discard`` forgets a
request the scheduler refused. ``send_due(now)`` sends every buffer that has waited its interval (the loop
calls it after each tick). Replies leave only through ``send(identity, message)``: the socket loop's, or
the in-process ``LocalClient``'s delivery. Handlers see this object, never the server's dictionaries.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from mlxd_protocol import Generate, Message
from mlxd_scheduler import Event, TokenEvent

from .chunking import ChunkBuffer
from .edge import to_reply
from .tool_calls import ToolCallSplitter

Send = Callable[[bytes, Message], None]


class ReplyStreams:
    def __init__(self, send: Send, interval_s: float):
        self._send = send
        self.interval_s = interval_s
        self._routes: dict[str, str] = {}  # internal request id -> client's id
        # internal request id -> (identity, ChunkBuffer) for buffers keeping tokens (and only those)
        self._keeping: dict[str, tuple[bytes, ChunkBuffer]] = {}

    def __contains__(self, internal_id: str) -> bool:
        return internal_id in self._routes

    def __len__(self) -> int:
        return len(self._routes)

    @property
    def keeping(self) -> bool:
        """Some buffer keeps tokens that are not sent yet."""
        return bool(self._keeping)

    def open(
        self, identity: bytes, message: Generate, internal_id: str, splitter: ToolCallSplitter | None = None
    ) -> Callable[[Event], None]:
        """Register ``message`` (running as ``internal_id``); returns the sink for its scheduler events.
        ``splitter``: takes tool calls out of the text of a request with tools (``tool_calls.py``)."""
        chunks = ChunkBuffer(message.id, self.interval_s)

        def sink(event: Event) -> None:
            if isinstance(event, TokenEvent):
                chunk = to_reply(event, message.id, message.stream, splitter)
                if chunk is None:
                    return
                ready = chunks.add(chunk.tokens, chunk.text, chunk.logprobs, time.monotonic())
                if ready is None:
                    self._keeping[internal_id] = (identity, chunks)
                else:  # ready holds whatever was kept: the buffer keeps nothing now
                    self._keeping.pop(internal_id, None)
                    self._send(identity, ready)
                return
            if internal_id in self._keeping:
                self._send_kept(internal_id)  # the last tokens go before the Done (or Error)
            self._send(identity, to_reply(event, message.id, message.stream, splitter))
            self._routes.pop(internal_id, None)

        self._routes[internal_id] = message.id
        return sink

    def discard(self, internal_id: str) -> None:
        """Forget a request that never ran (the scheduler refused it)."""
        self._routes.pop(internal_id, None)
        self._keeping.pop(internal_id, None)

    def send_due(self, now: float) -> None:
        """Send every kept buffer that has waited its interval."""
        for internal_id, (_, chunks) in list(self._keeping.items()):
            if chunks.due(now):
                self._send_kept(internal_id)

    def _send_kept(self, internal_id: str) -> None:
        identity, chunks = self._keeping.pop(internal_id)
        chunk = chunks.take(time.monotonic())
        assert chunk is not None  # a buffer in _keeping keeps tokens
        self._send(identity, chunk)
