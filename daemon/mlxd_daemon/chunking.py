"""Streamed chunks coalesced in time: at most one Chunk per request every ``interval_s``.

Why: a client process that wakes for every token takes CPU from the daemon on a small machine
(docs/benchmark_results/code_notes.md#stream-chunks).

Contract: ``ChunkBuffer.add(tokens, text, logprobs, now)`` takes one scheduler token event and returns the
Chunk to send now: the request's first tokens always go at once (time to first token is untouched), later
ones once ``interval_s`` has passed since the last send; otherwise it keeps them and returns None.
``take(now)`` returns everything kept as one Chunk (tokens, text and logprobs in order), or None. The
daemon sends what is kept before a request's Done and, after every scheduler tick, every buffer that has
waited ``interval_s``. With ``interval_s`` 0 every event goes at once. Kept tokens are plain lists: a
wire message is built (and checked) once per send, not once per token.
"""

from __future__ import annotations

from mlxd_protocol import Chunk


class ChunkBuffer:
    def __init__(self, client_id: str, interval_s: float):
        self.client_id = client_id
        self.interval_s = interval_s
        self.tokens: list[int] = []
        self.parts: list[str] = []
        self.logprobs: list = []
        self.last_sent: float | None = None

    @property
    def keeping(self) -> bool:
        return bool(self.tokens or self.parts)

    def add(self, tokens: list[int], text: str, logprobs: list | None, now: float) -> Chunk | None:
        self.tokens += tokens
        self.parts.append(text)
        if logprobs:
            self.logprobs += logprobs
        if self.last_sent is None or now - self.last_sent >= self.interval_s:
            return self.take(now)
        return None

    def due(self, now: float) -> bool:
        # tokens are only ever kept after a send, so last_sent is set whenever something is kept
        return self.keeping and now - self.last_sent >= self.interval_s  # type: ignore[operator]

    def take(self, now: float) -> Chunk | None:
        if not self.keeping:
            return None
        chunk = Chunk(id=self.client_id, tokens=self.tokens, text="".join(self.parts), logprobs=self.logprobs or None)
        self.tokens, self.parts, self.logprobs = [], [], []
        self.last_sent = now
        return chunk
