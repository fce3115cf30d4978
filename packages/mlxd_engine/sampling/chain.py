"""Per-row sampler chains: logits processors, then the grammar mask, then filters, then a draw (or argmax).

Contract: a ``SamplerChain`` turns one row's logits into a token, given that row's token history. The
chain is the same for plain steps and for every position of a verify round, which is what makes the
verify round's output equal to plain decode: position i of a round sees history + proposal[:i], exactly
the history plain decode would have had. A seeded chain owns a PRNG key and splits it once per emitted
token, so seeded sampling is reproducible whether a token came from a step or from a verify round. With
``rng="llama.cpp"`` a seeded chain draws as llama.cpp's sampler does instead (``llama_cpp_draw.py``: its
generator, once per emitted token too).

A row with a grammar (``grammar.py``: a JSON schema, GBNF, ...) runs one more stage after the processors:
tokens the grammar forbids are masked out. The stage reads the row's own token list (``follow``, bound by
``Engine.add_sequence``) and, at a verify position, the proposal prefix (``pending``); rows with and
without grammars share a batch. In a batched step the forward is started before the grammar rows'
masks are computed, so the masks are built while the model runs.

Greedy rows with no processors are the common case; ``sample_rows`` argmaxes all of them in one call
and batches rows that share the same filters and no seed into one draw.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, make_logits_processors

from mlxd_protocol.sampling_rules import GREEDY, is_greedy_temperature, sampling_problem

from .llama_cpp_draw import LlamaCppDraw

if TYPE_CHECKING:
    from .grammar import Grammar

LogitsProcessor = Callable[[mx.array, mx.array], mx.array]


@dataclass(frozen=True)
class SamplingParams:
    """What one request asks of the sampler. Defaults are greedy decode (``sampling_rules.GREEDY``, as the wire's).

    ``temperature`` 0 (or below ``GREEDY_TEMPERATURE_FLOOR``) means argmax; ``top_k`` 0, ``top_p`` 1 and
    ``min_p`` 0 are off; penalties of 0 (repetition: 1 or 0) are off. ``logprobs`` is the number of alternatives to
    report per token (None: none). ``custom_processors`` are in-process callables (library use only). ``grammar``: a
    compiled schema or grammar (``grammar.compile_grammar``) the output must follow.
    """

    temperature: float = GREEDY["temperature"]
    top_k: int = GREEDY["top_k"]
    top_p: float = GREEDY["top_p"]
    min_p: float = GREEDY["min_p"]
    repetition_penalty: float = GREEDY["repetition_penalty"]
    presence_penalty: float = GREEDY["presence_penalty"]
    frequency_penalty: float = GREEDY["frequency_penalty"]
    penalty_context: int = 64
    logit_bias: tuple[tuple[int, float], ...] = ()
    seed: int | None = None
    logprobs: int | None = None
    post_sampling: bool = False  # logprobs of the distribution drawn from (``post_sampling_logprobs``)
    rng: str = "mlx"  # "llama.cpp": a seeded row draws as llama.cpp's sampler does (``llama_cpp_draw.py``)
    custom_processors: tuple[LogitsProcessor, ...] = field(default=(), compare=False)
    grammar: Grammar | None = field(default=None, compare=False)

    def validate(self, vocab_size: int) -> None:
        """Raise ValueError with a user-facing message naming the field (the rules: ``sampling_rules``)."""
        problem = sampling_problem(self, vocab_size)
        if problem is not None:
            raise ValueError(problem)

    @property
    def is_greedy(self) -> bool:
        """Argmax: temperature 0 or below the floor (``sampling_rules.GREEDY_TEMPERATURE_FLOOR``)."""
        return is_greedy_temperature(self.temperature)

    def filter_key(self) -> tuple:
        """Rows with equal keys and no per-row state can share one batched draw."""
        return (self.temperature, self.top_k, self.top_p, self.min_p)


class SamplerChain:
    """One row's chain: processors → grammar mask → temperature → top-k → top-p → min-p → draw."""

    def __init__(self, params: SamplingParams):
        self.params = params
        repetition = params.repetition_penalty if params.repetition_penalty not in (0.0, 1.0) else None
        self.processors: list[LogitsProcessor] = make_logits_processors(
            logit_bias=dict(params.logit_bias) or None,
            repetition_penalty=repetition,
            repetition_context_size=params.penalty_context,
            presence_penalty=params.presence_penalty or None,
            presence_context_size=params.penalty_context,
            frequency_penalty=params.frequency_penalty or None,
            frequency_context_size=params.penalty_context,
        ) + list(params.custom_processors)
        self.grammar = params.grammar.start() if params.grammar is not None else None
        if self.grammar is not None:
            self.processors.append(self.grammar)  # last: penalties first, then forbid what the grammar does
        self.key = mx.random.key(params.seed) if params.seed is not None else None
        seeded_llama = params.rng == "llama.cpp" and params.seed is not None
        self.llama_draw = LlamaCppDraw(params.seed) if seeded_llama else None  # type: ignore[arg-type]
        # a processor reads the row's past tokens (penalties, caller-given processors); a logit bias does not
        # (a grammar reads the row's whole output: its steps must not run ahead of the tokens read)
        self.needs_history = bool(
            repetition
            or params.presence_penalty
            or params.frequency_penalty
            or params.custom_processors
            or self.grammar is not None
        )

    def follow(self, tokens: list[int], prompt_length: int) -> None:
        """Bind the chain to its sequence's token list (a grammar stage reads the output from it)."""
        if self.grammar is not None:
            self.grammar.follow(tokens, prompt_length)

    @property
    def has_row_state(self) -> bool:
        """True when the chain needs the row's history or its own key (cannot join a batched draw)."""
        return bool(self.processors) or self.key is not None

    def process(self, logits: mx.array, history: mx.array, pending: Sequence[int] = ()) -> mx.array:
        # logits: [1, V]; history: [T] token ids seen so far (prompt + output, windowed);
        # pending: tokens after the row's recorded output that this position sees (a verify round's drafts)
        for processor in self.processors:
            logits = self.grammar.apply(logits, pending) if processor is self.grammar else processor(history, logits)
        return logits

    def filtered_logprobs(self, logits: mx.array) -> mx.array:
        """Temperature-scaled, filtered log-probabilities to draw from. logits: [N, V]."""
        p = self.params
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        if p.top_k:
            logprobs = apply_top_k(logprobs, p.top_k)
        if p.top_p < 1.0:
            logprobs = apply_top_p(logprobs, p.top_p)
        if p.min_p > 0.0:
            logprobs = apply_min_p(logprobs, p.min_p)
        return logprobs

    def draw(self, logits: mx.array) -> mx.array:
        """Pick one token per row of ``logits`` [N, V] (already processed). Returns [N] int32."""
        if self.params.is_greedy:
            return mx.argmax(logits, axis=-1)
        p = self.params
        if self.llama_draw is not None:
            return self.llama_draw.draw(logits, p.temperature, p.top_k, p.top_p, p.min_p)
        scaled = self.filtered_logprobs(logits) * (1.0 / self.params.temperature)
        if self.key is None:
            return mx.random.categorical(scaled)
        self.key, subkey = mx.random.split(self.key)
        return mx.random.categorical(scaled, key=subkey)


def token_logprobs(logits: mx.array, tokens: mx.array, top_n: int) -> tuple[mx.array, mx.array, mx.array]:
    """Log-probability of each chosen token and the ``top_n`` best alternatives.

    Args:
        logits: [N, V]; tokens: [N].
    Returns:
        (chosen [N], top ids [N, top_n], top logprobs [N, top_n]).
    """
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    chosen = mx.take_along_axis(logprobs, tokens[:, None], axis=-1)[:, 0]
    if top_n == 0:
        empty = mx.zeros((logits.shape[0], 0))
        return chosen, empty.astype(mx.int32), empty
    top_ids = mx.argpartition(-logprobs, kth=top_n - 1, axis=-1)[:, :top_n]
    top_values = mx.take_along_axis(logprobs, top_ids, axis=-1)
    order = mx.argsort(-top_values, axis=-1)
    return chosen, mx.take_along_axis(top_ids, order, axis=-1), mx.take_along_axis(top_values, order, axis=-1)


def post_sampling_logprobs(
    chain: SamplerChain, logits: mx.array, tokens: mx.array, top_n: int
) -> tuple[mx.array, mx.array, mx.array]:
    """``token_logprobs`` of the distribution ``chain`` draws from: top_k, top_p and min_p applied, then the
    temperature (a filtered-out token has log-probability -inf); greedy, the argmax has 0 and every other
    token -inf. ``logits`` [N, V] are the processed ones (or the raw ones of a chain without processors)."""
    if chain.params.is_greedy:
        best = mx.argmax(logits, axis=-1, keepdims=True)
        columns = mx.arange(logits.shape[-1])[None, :]
        dist = mx.where(columns == best, 0.0, -mx.inf)
    else:
        dist = chain.filtered_logprobs(logits) * (1.0 / chain.params.temperature)
    return token_logprobs(dist, tokens, top_n)


def sample_rows(
    chains: list[SamplerChain], logits: mx.array, histories: list[Callable[[], mx.array] | None]
) -> mx.array:
    """Sample one token for every row of a batched step, lazily.

    Args:
        chains: the rows' chains, in row order.
        logits: [B, V] last-position logits of the step.
        histories: per row, a callable returning its token history (only called, and only needed, for
            rows whose chain has per-row state; None elsewhere).
    Returns:
        [B] int32 tokens (not evaluated).
    """
    batch = len(chains)
    if batch == 1 and not chains[0].has_row_state:  # the B=1 decode step
        return chains[0].draw(logits).astype(mx.int32)
    groups: dict[tuple, list[int]] = {}
    solo: list[int] = []
    for row, chain in enumerate(chains):
        if chain.has_row_state:
            solo.append(row)
        else:
            groups.setdefault(chain.params.filter_key(), []).append(row)
    if len(groups) == 1 and not solo:
        return chains[0].draw(logits).astype(mx.int32)
    if any(chains[row].grammar is not None for row in solo):
        mx.async_eval(logits)  # start the forward: the grammar rows' masks are computed while it runs
    parts: list[tuple[list[int], mx.array]] = []
    for rows in groups.values():
        index = mx.array(rows)
        parts.append((rows, chains[rows[0]].draw(logits[index])))
    for row in solo:
        chain = chains[row]
        history = histories[row]
        assert history is not None  # given for every row with row state
        row_logits = chain.process(logits[row : row + 1], history())
        parts.append(([row], chain.draw(row_logits)))
    order = [row for rows, _ in parts for row in rows]
    tokens = mx.concatenate([t.astype(mx.int32) for _, t in parts])
    if order == list(range(batch)):
        return tokens
    inverse = [0] * batch
    for position, row in enumerate(order):
        inverse[row] = position
    return tokens[mx.array(inverse)]
