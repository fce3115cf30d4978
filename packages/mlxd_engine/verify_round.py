"""The shared verify round: check a proposal with one multi-token forward, keep what the target agrees with.

Contract: every caller that speculates (the scheduler's prompt-lookup arm, the single-sequence reference
loop) runs this one implementation, ``verify_rows_timed`` (``verify_rows`` and its one-row form
``verify_round`` add step 6); there is no second copy. It checks several rows' proposals, each its own
length, in one forward.
Given a sequence whose current token (its last) is not yet in storage and a proposal of
draft tokens, the round

1. truncates the proposal so the round cannot pass ``max_new_tokens``, the KV bound or the most tokens
   one forward may append (``Engine.max_forward_tokens``: sliding-window rings),
2. runs ``engine.verify`` on [current] + proposal: k+1 positions in one forward,
3. samples every position through the row's own chain, in order, position i seeing history +
   proposal[:i] (greedy rows: one argmax over all positions), and accepts drafts while the sampled
   token equals the draft; a row with a grammar has its proposal cut first at the first token the
   grammar forbids, and its mask applied at every position,
4. emits the accepted drafts plus the target's own token at the first disagreement (or after the last
   draft), cut short at the first EOS or at a token the caller's ``should_stop`` flags,
5. commits the appends the emitted tokens need and unwinds the rest (recurrent state: the engine puts
   the state back and forwards the kept tokens again, see ``storage/row_storage.py``); the emitted tokens
   are returned, not recorded: the caller's update step records them (``Sequence.record``),
6. times the round's forwards: ``verify_rows_timed`` returns them as ``ForwardSample`` values for the
   caller's update step (the scheduler's arm, an execute step, writes no cost model); ``verify_rows`` and
   ``verify_round``, for loops that are their own update step, give them to ``engine.forward_cost`` (the
   verify gate's cost model).

Because acceptance is "the row's sampler picked exactly this token", the emitted tokens are the ones
plain decode would produce: greedy output is identical, and a seeded chain splits its key once per
sampled position, as plain decode does.

Worked example (greedy): current token c, proposal [a, b, x]; the target's argmax at the four positions
is [a, b, y, z]. Accepted: a, b; emitted: [a, b, y]; appends c, a, b are committed, x is unwound.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from .engine import Engine
from .finish_rule import ends_on, reaches_length
from .forward_sample import ForwardSample
from .ragged import is_ragged
from .sequence import Sequence, mean_context
from .storage.kv_bound import kv_room

ACCEPTED, TARGET = "accepted", "target"


@dataclass
class RoundOutcome:
    """What one verify round produced."""

    emitted: list[int]  # the round's tokens, in order (storage holds their appends; the caller records them)
    outcomes: list[str]  # per emitted token: "accepted" (a draft the target agreed with) or "target"
    drafted: int  # proposal tokens actually verified (after truncation)
    accepted: int  # drafts among the emitted tokens
    finish_reason: str | None  # "stop" (EOS or should_stop), "length" (max tokens or KV bound), None


def verify_round(
    engine: Engine,
    seq: Sequence,
    proposal: list[int],
    max_new_tokens: int,
    should_stop: Callable[[int], bool] | None = None,
) -> RoundOutcome:
    """Verify ``proposal`` on ``seq`` and emit what the target accepts plus one token of its own.

    Args:
        engine: the engine that holds ``seq``.
        seq: a decoding sequence (its last token is the current one, not yet in storage).
        proposal: draft tokens to check (may be empty: the round is then one plain token).
        max_new_tokens: how many more tokens the request may emit (>= 1).
        should_stop: called with each emitted token in order; True ends the row at that token
            (stop strings, for instance). EOS ids of the model end the row too.
    Returns:
        The round's outcome; storage is settled and the round's time given to ``engine.forward_cost``; the
        caller records ``outcome.emitted`` (``Sequence.record``).
    """
    return verify_rows(engine, [seq], [proposal], [max_new_tokens], [should_stop])[0]


def verify_rows(
    engine: Engine,
    rows: list[Sequence],
    proposals: list[list[int]],
    max_new_tokens: list[int],
    should_stop: list[Callable[[int], bool] | None] | None = None,
) -> list[RoundOutcome]:
    """``verify_rows_timed``, its forwards' times given to ``engine.forward_cost``. Returns the outcomes."""
    outcomes, samples = verify_rows_timed(engine, rows, proposals, max_new_tokens, should_stop)
    engine.forward_cost.observe_samples(samples)
    return outcomes


def verify_rows_timed(
    engine: Engine,
    rows: list[Sequence],
    proposals: list[list[int]],
    max_new_tokens: list[int],
    should_stop: list[Callable[[int], bool] | None] | None = None,
) -> tuple[list[RoundOutcome], list[ForwardSample]]:
    """One verify round for every row in one forward: each row's current token and its own proposal
    (any length, 0 included), the shorter ones padded after their real tokens (a causal mask keeps every
    real position from seeing the padding, and the padding's appends are unwound with the rejected
    drafts). Each row is accepted through its own sampler chain and settled by its own amount.

    Args are per row, as ``verify_round``'s. Returns the rows' outcomes in order and the forwards' samples
    (one; one per row where a row near its KV bound cannot take the padding), which nothing has observed."""
    if any(n < 1 for n in max_new_tokens):
        raise ValueError("max_new_tokens must be >= 1")
    stops = should_stop or [None] * len(rows)
    proposals = [_fit(engine, seq, proposal, n) for seq, proposal, n in zip(rows, proposals, max_new_tokens)]
    width = 1 + max(len(p) for p in proposals)
    if len(rows) > 1 and any(kv_room(seq) < width for seq in rows):
        # a row near its KV bound cannot take the padding: every row gets its own forward
        outcomes, samples = [], []
        for seq, p, n, stop in zip(rows, proposals, max_new_tokens, stops):
            row_outcomes, row_samples = verify_rows_timed(engine, [seq], [p], [n], [stop])
            outcomes += row_outcomes
            samples += row_samples
        return outcomes, samples
    started, context = time.perf_counter(), mean_context(rows)
    logits = engine.verify_rows(rows, [[seq.tokens[-1]] + proposal for seq, proposal in zip(rows, proposals)])
    greedy = [seq.chain.params.is_greedy and not seq.chain.processors for seq in rows]
    argmax: list[list[int]] = []  # one read for every greedy row: [B][width] token ids
    if any(greedy):
        argmax = greedy_tokens(logits)
    outcomes = []
    for i, (seq, proposal) in enumerate(zip(rows, proposals)):
        k = len(proposal)
        sampled = argmax[i][: k + 1] if greedy[i] else _sample_positions(seq, logits[i, : k + 1], proposal)
        outcomes.append(_settle(engine, seq, proposal, sampled, width, max_new_tokens[i], stops[i]))
    # the round's whole cost (a recurrent row's replay included) is what the verify gate weighs
    ragged = is_ragged(engine.ragged_verify, [1 + len(p) for p in proposals])
    ms = (time.perf_counter() - started) * 1000.0
    return outcomes, [ForwardSample(len(rows), width, context, ms, ragged)]


def greedy_tokens(logits: mx.array) -> list:
    """Each position's argmax over the last axis as nested lists of token ids: the first of equal maxima,
    and a NaN counts as the largest (MLX's and numpy's rule alike). On the CPU, numpy's argmax over the
    evaluated logits, read in place (MLX's CPU argmax is several times slower: code_notes.md#verify-argmax);
    elsewhere MLX's, so only the token ids leave the device."""
    if mx.default_device() == mx.cpu and logits.dtype in (mx.float32, mx.float16):
        mx.eval(logits)
        return np.argmax(np.asarray(logits), axis=-1).tolist()
    return mx.argmax(logits, axis=-1).tolist()  # type: ignore[return-value]  # MLX: tolist() of any nesting


def _fit(engine: Engine, seq: Sequence, proposal: list[int], max_new_tokens: int) -> list[int]:
    """The proposal cut so the round cannot pass max_new_tokens, the KV bound, a ring's slack or the
    row's grammar."""
    room = kv_room(seq)  # positions left for [current] + drafts
    if engine.max_forward_tokens is not None:  # a sliding-window ring bounds one forward's appends
        room = min(room, engine.max_forward_tokens)
    proposal = list(proposal[: max(0, min(max_new_tokens - 1, room - 1))])
    if seq.chain.grammar is not None:  # cut at the first draft token the grammar forbids (sampling/grammar.py)
        proposal = seq.chain.grammar.allowed_prefix(proposal)
    return proposal


def _settle(
    engine: Engine,
    seq: Sequence,
    proposal: list[int],
    sampled: list[int],
    fed: int,
    max_new_tokens: int,
    should_stop: Callable[[int], bool] | None,
) -> RoundOutcome:
    """Emit the accepted drafts and the target's token; commit what storage keeps of the ``fed`` appends."""
    k = len(proposal)
    emitted: list[int] = []
    outcomes: list[str] = []
    finish_reason = None
    for i, token in enumerate(sampled):
        emitted.append(token)
        agrees = i < k and token == proposal[i]
        outcomes.append(ACCEPTED if agrees else TARGET)
        if ends_on(engine.loaded.eos_token_ids, token, should_stop):
            finish_reason = "stop"
            break
        if not agrees:
            break
    accepted = sum(o == ACCEPTED for o in outcomes)
    # storage needs [current] + every emitted token but the last (which is the next current token)
    keep = len(emitted)
    engine.commit_appends(seq, keep)
    # rejected drafts and padding; an unwind of recurrent state forwards the kept tokens again
    engine.unwind_appends(seq, fed - keep, kept=emitted)
    if finish_reason is None and reaches_length(seq, len(emitted), max_new_tokens):
        finish_reason = "length"
    return RoundOutcome(emitted, outcomes, k, accepted, finish_reason)


def _sample_positions(seq: Sequence, logits: mx.array, proposal: list[int]) -> list[int]:
    """The row's sampled token at each position, stopping after the first disagreement (a row that is not
    plain greedy: those take ``greedy_tokens`` over the whole batch)."""
    chain = seq.chain
    window = chain.params.penalty_context
    sampled: list[int] = []
    for i in range(len(proposal) + 1):
        row = logits[i : i + 1]
        if chain.processors:
            history = mx.array((seq.tokens + proposal[:i])[-window:])
            row = chain.process(row, history, proposal[:i])  # a grammar masks at every position
        token = int(chain.draw(row).item())  # type: ignore[arg-type]  # a token id
        sampled.append(token)
        if i < len(proposal) and token != proposal[i]:
            break
    return sampled
