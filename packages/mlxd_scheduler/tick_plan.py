"""The prompt-lookup tick's policy: from what the rows propose to the tick's plan. Pure: no engine, no
drafter, no clock; ``prompt_lookup_arm.py`` gathers the inputs, runs the plan and updates the rows.

Contract: ``plan_tick(rows, pipelined, max_steps, estimate) -> TickPlan``.
- ``rows``: every decoding row as a ``RowView``: its key, its tokens in storage (``context``), whether it
  may ride in a padded verify forward (``can_pad``: no logprobs wanted, room in its KV bound for the
  width), and for a prompt-lookup row (``drafting``) its proposal this tick (``draft`` tokens, 0: none),
  the draft tokens its governor expects the round to accept (``expected``), whether it must be verified
  (``forced``: a probe of a governor that turned off, or a row the gate has declined ``probe_interval``
  times running; without it a declined row could never show that it copies now), its pipelined ticks in
  a row without a proposal (``quiet_ticks``) and its drafter's ``pipelines_plain_rounds()``.
- ``pipelined``: a lookahead step is in flight. ``max_steps``: the most chained steps the scheduler allows.
- ``estimate(rows, width, context)``: milliseconds of one forward (``ForwardCost.estimate``), or None
  while the cost model has too little data.

The plan (``TickPlan.mode``):
- "pipelined": submit ``steps`` chained steps and read the ones in flight. With a step in flight and no
  proposal, ``steps`` backs off with the rows' quiet streaks (2**q for the least q, so a copying row
  keeps one step per tick and a row that never matches soon chains as plain decode does). From a
  synchronous state it is the re-prime (one step, submitted, nothing read): chosen when nothing is
  verified and every drafting row either ``pipelines`` or had its draft declined.
- "read": a step is in flight and some row proposes: read it instead of priming the next; the proposals
  (made before its token) are settled against it and planned again, synchronously.
- "synchronous": verify the rows in ``verify`` (each its own draft length) in ``layout`` ("beside": one
  verify forward for them and one batched step for the others; "padded": one forward for every row, the
  others feeding their one token padded to the same width) or, with nothing to verify, one batched step.
  ``declined``: proposals the gate turned down (retracted, no miss).

The verify gate (synchronous plans): the alternatives are a plain tick (one token per row) and, for
k = 1..n, the forced candidates plus the k others expecting the most accepted tokens, in either layout
(padded only when every row can pad). Each alternative's value is its expected tokens (one per row, plus
each verified row's expected accepted drafts) per estimated millisecond; the best wins, the plain tick
on ties. Without an estimate every candidate is verified beside the step (the layout that needs no
estimate to be safe).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Hashable

Estimate = Callable[[int, int, float], "float | None"]
MAX_BACKOFF_EXPONENT = 6


@dataclass(frozen=True)
class RowView:
    key: Hashable
    context: int
    can_pad: bool = True
    drafting: bool = False
    draft: int = 0
    expected: float = 0.0
    forced: bool = False
    quiet_ticks: int = 0
    pipelines: bool = True


@dataclass
class TickPlan:
    mode: str  # "pipelined", "read" or "synchronous" (module docstring)
    steps: int = 1
    verify: list[Hashable] = field(default_factory=list)
    layout: str = "beside"
    declined: list[Hashable] = field(default_factory=list)
    expected_ms: float | None = None  # the chosen alternative's estimated cost (None: no estimate)
    plain_ms: float | None = None  # a plain tick's estimated cost


def plan_tick(rows: list[RowView], pipelined: bool, max_steps: int, estimate: Estimate) -> TickPlan:
    """The tick's plan (module docstring)."""
    proposing = [row for row in rows if row.draft > 0]
    drafting = [row for row in rows if row.drafting]
    if pipelined:
        if proposing:
            return TickPlan("read")
        allowed = min((2 ** min(row.quiet_ticks, MAX_BACKOFF_EXPONENT) for row in drafting), default=max_steps)
        return TickPlan("pipelined", steps=max(1, min(max_steps, allowed)))
    plan = plan_verify(rows, estimate)
    if plan.verify:
        return plan
    declined = set(plan.declined)
    if all(row.key in declined or row.pipelines for row in drafting):
        plan.mode, plan.steps = "pipelined", 1  # the re-prime: submits one step, reads nothing
    return plan


def _mean(values: list[int]) -> float:
    return sum(values) / len(values) if values else 0.0


def plan_verify(rows: list[RowView], estimate: Estimate) -> TickPlan:
    """The synchronous plan: the verify set and layout with the most expected tokens per millisecond."""
    candidates = [row for row in rows if row.draft > 0]
    if not candidates:
        return TickPlan("synchronous")
    all_contexts = [row.context for row in rows]
    plain_ms = estimate(len(rows), 1, _mean(all_contexts))
    if plain_ms is None:
        return TickPlan("synchronous", verify=[c.key for c in candidates])
    forced = [c for c in candidates if c.forced]
    optional = sorted((c for c in candidates if not c.forced), key=lambda c: -c.expected)
    can_pad = all(row.can_pad for row in rows)
    best_value, best = (len(rows) / plain_ms if not forced else -1.0), None
    for k in range(0, len(optional) + 1):
        chosen = forced + optional[:k]
        if not chosen:
            continue
        tokens = len(rows) + sum(c.expected for c in chosen)
        width = 1 + max(c.draft for c in chosen)
        chosen_keys = {c.key for c in chosen}
        rest = [row.context for row in rows if row.key not in chosen_keys]
        verify_ms = estimate(len(chosen), width, _mean([c.context for c in chosen]))
        options = [("beside", verify_ms + (estimate(len(rest), 1, _mean(rest)) if rest else 0.0))]
        if can_pad and rest:
            options.append(("padded", estimate(len(rows), width, _mean(all_contexts))))
        for layout, ms in options:
            if tokens / ms > best_value:
                best_value, best = tokens / ms, (chosen_keys, layout, ms)
    if best is None:
        return TickPlan("synchronous", declined=[c.key for c in candidates], expected_ms=plain_ms, plain_ms=plain_ms)
    chosen_keys, layout, ms = best
    return TickPlan("synchronous", verify=[c.key for c in candidates if c.key in chosen_keys], layout=layout,
                    declined=[c.key for c in candidates if c.key not in chosen_keys], expected_ms=ms,
                    plain_ms=plain_ms)
