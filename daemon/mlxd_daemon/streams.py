"""Where the replies of running generations go: each request's route and its chunk buffer.

Contract: ``ReplyStreams(send, interval_s)`` owns every generation in flight on the daemon. ``open(identity,
message, internal_id)`` registers a Generate and returns the scheduler event sink that answers it: token
events become Chunks, coalesced in time by a ``ChunkBuffer`` (nothing for a non-streaming request); the
finish event becomes the Done (or Error), sent after whatever the buffer still keeps. ``discard`` forgets a
request the scheduler refused. ``send_due(now)`` sends every buffer that has waited its interval (the loop
calls it after each tick). Replies leave only through ``send(identity, message)``: the socket loop's, or
the in-process ``LocalClient``'s delivery. Handlers see this object, never the server's dictionaries.

A streaming Generate with ``return_progress`` gets Progress replies while its prompt is prefilled:
``send_progress()`` (the loop calls it after each tick) reads the scheduler's state of each such request
(``states``: internal id -> its ``RequestState``, or None before it is admitted) and sends one Progress when
the prefill starts (``processed`` = the cached tokens), then one whenever more of the prompt is in the KV
storage, the last with the whole prompt; the first token event of the request sends what is still due
first, so every Progress comes before the first Chunk. A streaming Generate with ``timings_per_token`` gets
its timings so far on every Chunk (as the Done's: ``Timings.report`` when the chunk leaves).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from mlxd_protocol import Chunk, Generate, Message, Progress
from mlxd_scheduler import Event, TokenEvent

from .chunking import ChunkBuffer
from .edge import to_reply
from .tool_calls import ToolCallSplitter

Send = Callable[[bytes, Message], None]


class ReplyStreams:
    def __init__(self, send: Send, interval_s: float, states: Callable[[str], Any] | None = None):
        self._send = send
        self.interval_s = interval_s
        self._states: Callable[[str], Any] = states or (lambda internal_id: None)
        # internal request id -> (identity, client's id, the processed count last reported, or -1) for
        # requests with return_progress whose prefill has not been reported whole yet
        self._progress: dict[str, tuple[bytes, str, int]] = {}
        self._timed: set[str] = set()  # internal ids of requests with timings_per_token
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
            if internal_id in self._progress:
                self._report_progress(internal_id)  # what is due goes before the first token (or the end)
                self._progress.pop(internal_id, None)
            if isinstance(event, TokenEvent):
                chunk = to_reply(event, message.id, message.stream, splitter)
                if chunk is None:
                    return
                ready = chunks.add(chunk.tokens, chunk.text, chunk.logprobs, time.monotonic())
                if ready is None:
                    self._keeping[internal_id] = (identity, chunks)
                else:  # ready holds whatever was kept: the buffer keeps nothing now
                    self._keeping.pop(internal_id, None)
                    self._send(identity, self._timed_chunk(internal_id, ready))
                return
            if internal_id in self._keeping:
                self._send_kept(internal_id)  # the last tokens go before the Done (or Error)
            self._send(identity, to_reply(event, message.id, message.stream, splitter))
            self._routes.pop(internal_id, None)
            self._timed.discard(internal_id)

        self._routes[internal_id] = message.id
        if message.return_progress and message.stream:
            self._progress[internal_id] = (identity, message.id, -1)
        if message.timings_per_token and message.stream:
            self._timed.add(internal_id)
        return sink

    def _timed_chunk(self, internal_id: str, chunk: Chunk) -> Chunk:
        """``chunk`` with the request's timings so far, when it asked for them (and the scheduler has it)."""
        state = self._states(internal_id) if internal_id in self._timed else None
        if state is not None and state.seq is not None:
            prompt_n, cached = len(state.request.prompt), state.seq.cached_tokens
            chunk.timings = state.timings.report(prompt_n - cached, state.emitted, cached)
        return chunk

    def send_progress(self) -> None:
        """Send the Progress each request with ``return_progress`` has due (see the module docstring)."""
        for internal_id in list(self._progress):
            self._report_progress(internal_id)

    def _report_progress(self, internal_id: str) -> None:
        identity, client_id, reported = self._progress[internal_id]
        state = self._states(internal_id)
        if state is None or state.seq is None:
            return  # not admitted yet: its prefill has not started
        seq = state.seq
        total, cache = len(state.request.prompt), min(seq.cached_tokens, len(state.request.prompt))
        processed = min(max(seq.kv.written, cache), total)
        started = state.timings.prefill_started
        time_ms = (time.perf_counter() - started) * 1000.0 if started is not None else 0.0
        if reported < 0:  # the prefill's start: only the cached tokens are there
            self._send(identity, Progress(id=client_id, total=total, cache=cache, processed=cache, time_ms=0.0))
            reported = cache
        if processed > reported:
            self._send(identity, Progress(id=client_id, total=total, cache=cache, processed=processed, time_ms=time_ms))
            reported = processed
        if reported >= total:
            self._progress.pop(internal_id, None)
        else:
            self._progress[internal_id] = (identity, client_id, reported)

    def discard(self, internal_id: str) -> None:
        """Forget a request that never ran (the scheduler refused it)."""
        self._routes.pop(internal_id, None)
        self._progress.pop(internal_id, None)
        self._timed.discard(internal_id)
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
        self._send(identity, self._timed_chunk(internal_id, chunk))
