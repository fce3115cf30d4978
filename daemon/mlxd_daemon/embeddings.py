"""Embed requests: checked and queued by the handler, computed between scheduler ticks, answered when complete.

Contract: ``EmbeddingQueue(loaded, context_bound, pooling, tokens_per_forward, send, max_queue)``.
``submit(identity, message, inputs)`` takes an Embed's token lists (tokenized by the handler), refuses an
input longer than the daemon's context or a reply the protocol could not carry (``ProtocolError``
invalid_request naming the limit), and a full queue (overloaded); the model's hidden-state module is
found on the first Embed (``mlxd_engine.hidden_state_source``; a model without one is refused with the
reason). ``advance()``, called by ``DaemonCore.turn`` after the scheduler's tick, runs one forward of the
oldest request (at most ``tokens_per_forward`` padded tokens, the daemon's prefill chunk) and sends its
EmbedResult once every input is done, so a large request never holds the decoding rows for long. The
scheduler's rows, the KV storage and the prefix cache are untouched: the forward has its own mlx-lm cache.
A request that fails inside the model gets its Error; the others go on. ``cancel_all`` answers every
queued request with a cancelled Error (shutdown).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from mlxd_engine import EmbeddingRun, EmbeddingUnavailable, HiddenStateSource, LoadedModel, hidden_state_source
from mlxd_protocol import CANCELLED, INVALID, MAX_FRAME_BYTES, OVERLOADED, Embed, EmbedResult, Message, ProtocolError
from mlxd_protocol.field_checks import MAX_LIST_ITEMS
from mlxd_protocol.sampling_rules import token_outside_vocabulary

# msgpack writes a float in 9 bytes: an estimate of a reply's size before any work
WIRE_BYTES_PER_VALUE = 9

Send = Callable[[bytes, Message], None]
FailureReply = Callable[[BaseException, str, "str | None"], Message]


@dataclass
class _Job:
    identity: bytes
    request_id: str | None
    run: EmbeddingRun
    token_counts: list[int]


class EmbeddingQueue:
    """See the module docstring."""

    def __init__(
        self,
        loaded: LoadedModel,
        context_bound: int,
        pooling: str,
        tokens_per_forward: int,
        send: Send,
        failure_reply: FailureReply,
        max_queue: int = 256,
    ):
        self.loaded = loaded
        self.context_bound = context_bound
        self.pooling = pooling  # mlxd --pooling: for an Embed that names none
        self.tokens_per_forward = tokens_per_forward
        self.send = send
        self.failure_reply = failure_reply
        self.max_queue = max_queue
        self._jobs: deque[_Job] = deque()
        self._source: HiddenStateSource | None = None
        self._unavailable: str | None = None  # why this model gives no embeddings (found once)

    @property
    def pending(self) -> int:
        return len(self._jobs)

    def source(self) -> HiddenStateSource:
        """The model's hidden-state module (probed once). Raises ProtocolError(INVALID) when it has none."""
        if self._source is None and self._unavailable is None:
            try:
                self._source = hidden_state_source(self.loaded)
            except EmbeddingUnavailable as error:
                self._unavailable = str(error)
        if self._source is None:
            raise ProtocolError(INVALID, f"embeddings: {self._unavailable}")
        return self._source

    def submit(self, identity: bytes, message: Embed, inputs: list[list[int]]) -> None:
        """Queue an Embed's inputs (token lists); its reply comes from a later ``advance``."""
        if len(self._jobs) >= self.max_queue:
            raise ProtocolError(OVERLOADED, f"{len(self._jobs)} embedding requests are queued; retry later")
        vocab = self.loaded.vocab_size
        for index, tokens in enumerate(inputs):
            if len(tokens) > self.context_bound:
                raise ProtocolError(
                    INVALID,
                    f"input {index} is {len(tokens)} tokens, longer than the context of {self.context_bound} tokens",
                )
            bad = token_outside_vocabulary(tokens, vocab) if message.token_inputs is not None else None
            if bad is not None:
                raise ProtocolError(INVALID, f"token_inputs[{index}]: token {bad} is outside the vocabulary of {vocab}")
        source = self.source()
        pooling = message.pooling or self.pooling
        vectors = sum(len(tokens) for tokens in inputs) if pooling == "none" else len(inputs)
        if vectors > MAX_LIST_ITEMS or vectors * source.hidden_size * WIRE_BYTES_PER_VALUE > MAX_FRAME_BYTES:
            raise ProtocolError(
                INVALID,
                f"the reply would hold {vectors} vectors of {source.hidden_size} values, "
                f"more than a reply carries (send fewer inputs at once)",
            )
        run = EmbeddingRun(source, inputs, pooling, message.normalize, self.tokens_per_forward)
        self._jobs.append(_Job(identity, message.id, run, [len(tokens) for tokens in inputs]))

    def advance(self) -> None:
        """One forward of the oldest request; its EmbedResult (or Error) once it is complete."""
        if not self._jobs:
            return
        job = self._jobs[0]
        reply: Message
        try:
            job.run.advance()
            if not job.run.done:
                return
            reply = EmbedResult(
                embeddings=_rows(job.run), token_counts=job.token_counts, pooling=job.run.pooling, id=job.request_id
            )
        except Exception as error:  # noqa: BLE001 - one request fails, the daemon serves on
            reply = self.failure_reply(error, "embed", job.request_id)
        self._jobs.popleft()
        self.send(job.identity, reply)

    def cancel_all(self) -> None:
        """Answer every queued request with a cancelled Error (the daemon is stopping)."""
        while self._jobs:
            job = self._jobs.popleft()
            self.send(job.identity, ProtocolError(CANCELLED, "the daemon is shutting down").to_reply(job.request_id))


def _rows(run: EmbeddingRun) -> list[list[float]]:
    """The vectors as the wire carries them: one row per input, or per token for pooling "none"."""
    rows: list[list[float]] = []
    for vector in run.results():
        values = vector.tolist()
        rows.extend(values if vector.ndim == 2 else [values])  # type: ignore[arg-type, list-item]  # tolist(): lists
    return rows
