"""A row's state in the engine: ``Sequence`` (its tokens, its KV record, its sampler chain), the ``Emitted``
token a forward gives it, and ``StepHandle``, a batched step in flight.

Contract: plain data the engine and the verify round read and the scheduler holds; ``Sequence.record`` is
the one writer of a row's tokens after admission, called by update steps only (the scheduler's, the
single-sequence loops', ``standalone.py``'s, a distributed follower's), never by a forward. No forward runs
here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx

from .sampling.chain import SamplerChain, SamplingParams
from .storage.kv_storage import SlotState


@dataclass
class Emitted:
    """One output token and, when the request asked for them, its log-probabilities."""

    token: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None


@dataclass
class Sequence:
    """One sequence in the engine (per-row state; the scheduler keeps request-level state)."""

    seq_id: int
    kv: SlotState  # slot, committed and pending appends
    tokens: list[int]  # prompt + output; tokens[:kv.committed] are in KV storage; written by ``record`` only
    prompt_length: int
    chain: SamplerChain
    max_kv: int  # the sequence may hold at most this many tokens in storage
    cached_tokens: int = 0  # prompt tokens taken from the prefix cache instead of prefilled
    cache_prompt: bool = True  # whether it reads and, when it ends, feeds the prefix cache
    released: bool = False  # its slot went back to the pool; a step still in flight for it is ignored

    @property
    def params(self) -> SamplingParams:
        return self.chain.params

    @property
    def output(self) -> list[int]:
        return self.tokens[self.prompt_length :]

    @property
    def prefilled(self) -> bool:
        return self.kv.written >= self.prompt_length

    def record(self, tokens: list[int], start: int | None = None) -> None:
        """The one writer of ``tokens`` after admission: append output tokens (a step's read, prefill's first
        token, a verify round's emitted tokens), or with ``start`` replace every token from there (a
        distributed follower takes rank 0's). In place: a grammar stage holds the list (``SamplerChain.follow``)."""
        if start is None:
            self.tokens.extend(tokens)
        else:
            self.tokens[start:] = tokens

    def history(self, window: int) -> mx.array:
        return mx.array(self.tokens[-window:]) if self.tokens else mx.array([], dtype=mx.int32)


@dataclass
class StepHandle:
    """A submitted batched step: its rows and lazily computed tokens [B] (and logprobs)."""

    rows: list[Sequence]
    tokens: mx.array
    logits: mx.array  # [B, V] last-position logits (kept for tests and diagnostics)
    logprob_parts: tuple | None = None
    post_parts: dict[int, tuple] = field(default_factory=dict)  # row -> its post-sampling logprob parts
    read: bool = False


def mean_context(rows: list[Sequence]) -> float:
    """Tokens in storage per row, on average (the context a forward over ``rows`` reads)."""
    return sum(seq.kv.written for seq in rows) / max(len(rows), 1)
