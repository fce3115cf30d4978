"""The prompt-lookup tick's policy: from what the rows propose to the tick's plan. Pure: no engine, no
drafter, no clock; ``prompt_lookup_arm.py`` gathers the inputs, runs the plan and updates the rows.

Contract: ``plan_tick(rows, pipelined, max_steps, estimate) -> TickPlan``.
- ``rows``: every decoding row as a ``RowView``: its key, its tokens in storage (``context``), whether it
  may ride in a padded verify forward (``can_pad``: no logprobs wanted, room in its KV bound for the
  width), and for a prompt-lookup row (``drafting``) its proposal this tick (``draft`` tokens, 0: none),
  the draft tokens its governor expects the round to accept (``expected``), whether it must be verified
  (``forced``: a probe of a governor that turned off, or a row the gate has declined
  ``EXPLORE_AFTER_DECLINES`` times running; without it a declined row could never show that it copies
  now), its pipelined ticks in
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
- "read": a step is in flight and the gate would verify some proposal (``verify``; ``declined`` as
  below): read the steps in flight instead of priming the next; the verified proposals (made before
  their tokens) are settled against them and planned again, synchronously.
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
class Costs:
    """What the policy weighs: one synchronous forward's estimated ms (verify rounds), a pipelined plain
    step's measured ms, and what a tick costs beyond them (measured by the arm: ``TickOverheads``). A
    pipelined plain step costs its own time plus its share
    of ``plain_overhead_ms`` (a tick's, shared by its chained steps; negative where Python overlaps the
    model); a synchronous tick costs its forwards plus ``sync_overhead_ms`` (reading the lookahead step,
    the finish step, the re-prime)."""

    forward: Estimate
    plain_overhead_ms: float = 0.0  # per pipelined tick, shared by its chained steps
    sync_overhead_ms: float = 0.0  # per synchronous tick
    plain_step_ms: Callable[[int], "float | None"] = lambda rows: None  # a pipelined step, measured by batch size

    def plain(self, rows: int, context: float, steps: int = 1) -> float | None:
        """One plain step's cost in a pipelined tick of ``steps`` chained steps: the pipelined step as
        measured at this batch size (else the forward's estimate) and its share of the tick's overhead."""
        step = self.plain_step_ms(rows)
        if step is None:
            step = self.forward(rows, 1, context)
        return None if step is None else max(step + self.plain_overhead_ms / steps, 0.25 * step)


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


def plan_tick(rows: list[RowView], pipelined: bool, max_steps: int, costs: Costs | Estimate) -> TickPlan:
    """The tick's plan (module docstring)."""
    costs = costs if isinstance(costs, Costs) else Costs(costs)
    drafting = [row for row in rows if row.drafting]
    # the plain alternative is valued as plain decode runs: ``max_steps`` chained a tick (declined rows
    # count as quiet, so a row whose drafts keep not paying soon chains that many)
    plan = plan_verify(rows, costs, max_steps)
    if pipelined:
        if plan.verify:
            plan.mode = "read"  # the steps in flight are read; the verified drafts are settled against them
            return plan
        # nothing worth reading the steps in flight for: keep pipelining; a declined row counts as quiet
        chain = min((2 ** min(row.quiet_ticks + (row.draft > 0), MAX_BACKOFF_EXPONENT) for row in drafting),
                    default=max_steps)
        plan.mode, plan.steps = "pipelined", max(1, min(max_steps, chain))
        return plan
    if plan.verify:
        return plan
    declined = set(plan.declined)
    if all(row.key in declined or row.pipelines for row in drafting):
        plan.mode, plan.steps = "pipelined", 1  # the re-prime: submits one step, reads nothing
    return plan


def plan_verify(rows: list[RowView], costs: Costs, chain: int = 1) -> TickPlan:
    """The synchronous plan: the verify set and layout with the most expected tokens per millisecond;
    ``chain``: the steps a plain tick would chain instead. Runs every tick a row proposes: the
    alternatives are walked with running sums (no per-alternative lists)."""
    candidates = [row for row in rows if row.draft > 0]
    if not candidates:
        return TickPlan("synchronous")
    estimate = costs.forward
    n_rows = len(rows)
    total_context = sum(row.context for row in rows)
    mean_context = total_context / n_rows
    plain_ms = costs.plain(n_rows, mean_context, chain)
    if plain_ms is None or estimate(1, 1, mean_context) is None:
        return TickPlan("synchronous", verify=[c.key for c in candidates])
    forced = [c for c in candidates if c.forced]
    optional = sorted((c for c in candidates if not c.forced), key=lambda c: -c.expected)
    can_pad = all(row.can_pad for row in rows)
    overhead = costs.sync_overhead_ms
    best_value, best = (n_rows / plain_ms if not forced else -1.0), None
    chosen_n = expected = chosen_context = 0
    widest = 0
    for k, candidate in enumerate(forced + optional):
        chosen_n += 1
        expected += candidate.expected
        chosen_context += candidate.context
        widest = max(widest, candidate.draft)
        if k + 1 < len(forced):
            continue  # every forced candidate is in every alternative
        tokens, width, rest = n_rows + expected, 1 + widest, n_rows - chosen_n
        beside = overhead + estimate(chosen_n, width, chosen_context / chosen_n)
        if rest:
            beside += estimate(rest, 1, (total_context - chosen_context) / rest)
        if tokens / beside > best_value:
            best_value, best = tokens / beside, (chosen_n, "beside", beside)
        if can_pad and rest:
            padded = overhead + estimate(n_rows, width, mean_context)
            if tokens / padded > best_value:
                best_value, best = tokens / padded, (chosen_n, "padded", padded)
    if best is None:
        return TickPlan("synchronous", declined=[c.key for c in candidates], expected_ms=plain_ms, plain_ms=plain_ms)
    count, layout, ms = best
    chosen_keys = {c.key for c in (forced + optional)[:count]}
    return TickPlan("synchronous", verify=[c.key for c in candidates if c.key in chosen_keys], layout=layout,
                    declined=[c.key for c in candidates if c.key not in chosen_keys], expected_ms=ms,
                    plain_ms=plain_ms)
