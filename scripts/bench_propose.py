"""Micro-benchmark for prompt-lookup drafting overhead (pure Python, no model).

Contract:
    * Builds synthetic contexts of 1024 and 8192 tokens (random ids from a
      2000-token vocabulary, with earlier spans copied forward the way code
      edits and quotes repeat the prompt).
    * Measures, per context size, the mean cost in microseconds of
      ``PromptLookupDrafter.observe`` per token, ``NgramIndex.propose(8)`` and
      ``PromptLookupDrafter.draft_block()``, appending one token between
      calls so every call sees a new suffix, plus the fraction of calls that
      found a match.
    * Prints a table and finishes in a few seconds.

Run: ``PYTHONPATH=packages python scripts/bench_propose.py``
"""

from __future__ import annotations

import random
import time

from mlxd_drafters import NgramIndex, PromptLookupConfig, PromptLookupDrafter

VOCAB_SIZE = 2000
CONTEXT_SIZES = (1024, 8192)
CALLS = 2000
MAX_DRAFT = 8


def synthetic_tokens(length: int, rng: random.Random) -> list[int]:
    """Random tokens where ~30% of the text copies an earlier span.

    Args:
        length: Number of tokens to produce.
        rng: Seeded random source, so runs are comparable.

    Returns:
        A list of ``length`` token ids.
    """
    tokens: list[int] = []
    while len(tokens) < length:
        if len(tokens) > 64 and rng.random() < 0.3:
            span = rng.randint(8, 32)
            start = rng.randrange(len(tokens) - span)
            tokens.extend(tokens[start : start + span])
        else:
            tokens.extend(rng.randrange(VOCAB_SIZE) for _ in range(rng.randint(8, 32)))
    return tokens[:length]


def bench_observe(context: list[int]) -> float:
    """Mean microseconds per token to observe the whole context and index it.

    ``observe`` only queues tokens; they are indexed when the index is next read (here: once, at the
    end, inside the timed region), so the figure is the whole cost per token.

    Args:
        context: Tokens to feed one at a time, as a decode loop would.

    Returns:
        Mean cost per token in microseconds.
    """
    drafter = PromptLookupDrafter()
    start = time.perf_counter_ns()
    for token in context:
        drafter.observe((token,))
    drafter.index  # noqa: B018 - reading the index indexes the queued tokens
    return (time.perf_counter_ns() - start) / len(context) / 1000


def bench_propose(context: list[int], stream: list[int]) -> tuple[float, float]:
    """Mean ``NgramIndex.propose`` cost while the context keeps growing.

    Args:
        context: Initial tokens.
        stream: One token appended after each timed call.

    Returns:
        ``(mean microseconds per call, fraction of calls with a proposal)``.
    """
    index = NgramIndex(1, 4, context)
    elapsed_ns = 0
    hits = 0
    for token in stream:
        start = time.perf_counter_ns()
        proposal = index.propose(MAX_DRAFT)
        elapsed_ns += time.perf_counter_ns() - start
        hits += bool(proposal)
        index.append(token)
    return elapsed_ns / len(stream) / 1000, hits / len(stream)


def bench_draft_block(context: list[int], stream: list[int]) -> tuple[float, float]:
    """Mean ``draft_block`` cost (governor + index + stats) per call.

    Uses the "always" policy so every call exercises the index; each
    proposal is then verified as a miss-free round of its own length to
    keep the bookkeeping path realistic.

    Args:
        context: Initial tokens (the prompt).
        stream: One committed token observed after each timed call.

    Returns:
        ``(mean microseconds per call, fraction of calls with a proposal)``.
    """
    drafter = PromptLookupDrafter(PromptLookupConfig(policy="always"))
    drafter.observe(context)
    drafter.index  # noqa: B018 - index the starting context outside the timed calls
    elapsed_ns = 0
    hits = 0
    for token in stream:
        start = time.perf_counter_ns()
        proposal = drafter.draft_block()
        elapsed_ns += time.perf_counter_ns() - start
        if proposal:
            hits += 1
            drafter.accept_verified_tokens(len(proposal), len(proposal))
        drafter.observe((token,))
    return elapsed_ns / len(stream) / 1000, hits / len(stream)


def main() -> None:
    """Run every benchmark for each context size and print a table."""
    rng = random.Random(1234)
    header = f"{'context':>8} {'observe us/tok':>15} {'propose us':>11} {'hit%':>5} {'draft_block us':>15} {'hit%':>5}"
    print(f"calls per measurement: {CALLS}, max_draft: {MAX_DRAFT}")
    print(header)
    print("-" * len(header))
    for size in CONTEXT_SIZES:
        tokens = synthetic_tokens(size + CALLS, rng)
        context, stream = tokens[:size], tokens[size:]
        observe_us = bench_observe(context)
        propose_us, propose_hits = bench_propose(context, stream)
        draft_us, draft_hits = bench_draft_block(context, stream)
        print(
            f"{size:>8} {observe_us:>15.2f} {propose_us:>11.2f} "
            f"{propose_hits * 100:>5.0f} {draft_us:>15.2f} {draft_hits * 100:>5.0f}"
        )


if __name__ == "__main__":
    main()
