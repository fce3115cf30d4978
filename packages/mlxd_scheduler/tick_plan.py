"""The prompt-lookup tick's policy: from what the rows propose to the tick's plan. Pure: no engine, no
drafter, no clock; ``prompt_lookup_arm.py`` gathers the inputs, runs the plan and updates the rows.

Contract: ``plan_tick(rows, pipelined, max_steps, costs) -> TickPlan``.
- ``rows``: every decoding row as a ``RowView`` (its fields are what the policy reads of a row).
- ``pipelined``: a lookahead step is in flight. ``max_steps``: the most chained steps the scheduler allows.
- ``costs``: a ``Costs``, or only its ``forward`` estimate ``(rows, width, context)``: milliseconds of one
  forward (``ForwardCost.estimate``), or None while the cost model has too little data.

The plan (``TickPlan.mode``):
- "pipelined": submit ``steps`` chained steps and read the ones in flight. With a step in flight and no
  proposal, ``steps`` is 2**q for the rows' least quiet streak q, at most ``max_steps``. From a
  synchronous state it is the re-prime (one step, submitted, nothing read): chosen when nothing is
  verified and every drafting row either ``pipelines`` or had its draft declined.
- "read": a step is in flight and the gate would verify some proposal: read the steps in flight instead
  of priming the next; the verified proposals (made before their tokens) are settled against them and
  planned again, synchronously.
- "synchronous": verify the rows in ``verify`` (each its own draft length, cut to ``width - 1`` tokens
  when ``width`` is set) in ``layout`` ("beside": one verify forward for them and one batched step for the
  others; "padded": one forward for every row, the others feeding their one token padded to the same
  width) or, with nothing to verify, one batched step. ``declined``: proposals the gate turned down.

The verify gate (``plan_verify``): the alternatives are a plain tick (one token per row) and, for
k = 1..n, the forced candidates plus the k others expecting the most accepted tokens, in either layout
(padded only when every row can pad), with the drafts whole or cut to a narrower forward (each
candidate's own width and ``CUT_WIDTHS``, at most ``MAX_BATCHED_WIDTH`` beside other rows; a cut draft
expects p + ... + p^k of its first k tokens, p the row's ``acceptance``). Each alternative is valued at
its expected tokens (one per row, plus the verified rows' expected accepted drafts) per estimated ms; the
best wins, and a verify must beat the plain tick by ``VERIFY_MARGIN``. Without an estimate every
candidate is verified beside the step. ``explore`` rows the best alternative leaves out are added while
``Costs.explore_budget_ms`` covers what they lose (their estimated ms beyond what their tokens take at
the best alternative's rate; the last may overdraw it); beside a plain tick their drafts are cut to
``CUT_WIDTHS[0]``. The loss goes back in ``TickPlan.explore_ms``. Why these rules:
docs/benchmark_results/code_notes.md#verify-gate.

Worked example: rows a (a 4-token draft expected to accept 3) and b (plain), nothing in flight, ``costs``
pricing any forward at 10 ms: a plain tick gives 2 tokens in 10 ms; verifying a padded with b, 5 in 10 ms;
beside b's step, 5 in 20 ms. The plan is synchronous, ``verify=[a]``, padded. Expecting 0.1 accepted, a
would give 2.1 in 10 ms, short of the margin: a is declined, and the tick re-primes.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from .kinds import PlanMode, VerifyLayout

Estimate = Callable[[int, int, float], "float | None"]
MAX_BACKOFF_EXPONENT = 6
VERIFY_MARGIN = 1.1  # a verify's expected tokens per ms must beat the plain tick's by this factor
CUT_WIDTHS = (3, 5, 9)  # forward widths a long draft may be cut to (besides the candidates' own)
# The widest verify forward beside other rows (docs/benchmark_results/code_notes.md#verify-gate).
MAX_BATCHED_WIDTH = 9


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
    plain_step_ms: Callable[[int], float | None] = lambda rows: None  # a pipelined step, measured by batch size
    explore_budget_ms: float = float("inf")  # what verifying ``explore`` rows at a loss may cost this tick

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
    context: int  # the row's tokens in storage
    can_pad: bool = True  # may ride in a padded verify forward (no logprobs wanted, room in its KV bound)
    drafting: bool = False  # a prompt-lookup row
    draft: int = 0  # its proposal's tokens this tick (0: none)
    expected: float = 0.0  # draft tokens its governor expects the round to accept
    acceptance: float = 0.0  # per-token acceptance estimate (0: unknown; the draft is weighed whole)
    forced: bool = False  # must be verified (the client's predicted output)
    # worth a look at a loss: a probe of a governor that turned off, or a row the gate has declined for
    # mlxd_drafters.pacing.EXPLORE_AFTER_DECLINED_TOKENS tokens running (else a declined row could never show
    # it copies now)
    explore: bool = False
    quiet_ticks: int = 0  # its pipelined ticks in a row without a proposal
    pipelines: bool = True  # its drafter's ``pipelines_plain_rounds()``


@dataclass
class TickPlan:
    mode: PlanMode  # module docstring
    steps: int = 1
    verify: list[Hashable] = field(default_factory=list)
    layout: VerifyLayout = VerifyLayout.BESIDE
    declined: list[Hashable] = field(default_factory=list)
    expected_ms: float | None = None  # the chosen alternative's estimated cost (None: no estimate)
    plain_ms: float | None = None  # a plain tick's estimated cost
    explore_ms: float = 0.0  # what the plan's ``explore`` rows are estimated to lose (module docstring)
    width: int | None = None  # the verify forward's width: longer drafts are cut to ``width - 1`` tokens


def plan_tick(rows: list[RowView], pipelined: bool, max_steps: int, costs: Costs | Estimate) -> TickPlan:
    """The tick's plan (module docstring)."""
    costs = costs if isinstance(costs, Costs) else Costs(costs)
    drafting = [row for row in rows if row.drafting]
    # the plain alternative is valued as plain decode runs: ``max_steps`` chained a tick (declined rows
    # count as quiet, so a row whose drafts keep not paying soon chains that many)
    plan = plan_verify(rows, costs, max_steps)
    if pipelined:
        if plan.verify:
            plan.mode = PlanMode.READ  # the steps in flight are read; the verified drafts are settled against them
            return plan
        # nothing worth reading the steps in flight for: keep pipelining; a declined row counts as quiet
        plan.mode = PlanMode.PIPELINED
        plan.steps = lookahead_steps([row.quiet_ticks + (row.draft > 0) for row in drafting], max_steps)
        return plan
    if plan.verify:
        return plan
    declined = set(plan.declined)
    if all(row.key in declined or row.pipelines for row in drafting):
        plan.mode, plan.steps = PlanMode.PIPELINED, 1  # the re-prime: submits one step, reads nothing
    return plan


def lookahead_steps(quiet_ticks: list[int], max_steps: int) -> int:
    """Chained steps of a pipelined tick whose drafting rows have these quiet streaks: 2**q for the least
    q, at most ``max_steps``. The plan of a tick with a step in flight and no proposal, which the arm
    asks for without building the rows' views (most ticks of a long reply)."""
    if not quiet_ticks:
        return max(1, max_steps)
    return max(1, min(max_steps, 2 ** min(min(quiet_ticks), MAX_BACKOFF_EXPONENT)))


def plan_verify(rows: list[RowView], costs: Costs, chain: int = 1) -> TickPlan:
    """The synchronous plan: the verify set, the width its drafts are cut to and the layout with the most
    expected tokens per millisecond; ``chain``: the steps a plain tick would chain instead. Runs every
    tick a row proposes: for each width, the alternatives are walked with running sums."""
    candidates = [row for row in rows if row.draft > 0]
    if not candidates:
        return TickPlan(PlanMode.SYNCHRONOUS)
    estimate = costs.forward
    n_rows = len(rows)
    total_context = sum(row.context for row in rows)
    mean_context = total_context / n_rows
    plain_ms = costs.plain(n_rows, mean_context, chain)
    if plain_ms is None or estimate(1, 1, mean_context) is None:
        return TickPlan(PlanMode.SYNCHRONOUS, verify=[c.key for c in candidates])
    can_pad = all(row.can_pad for row in rows)
    forced = [c for c in candidates if c.forced]
    plain_value = n_rows / plain_ms
    # a verify must beat the plain tick by VERIFY_MARGIN (module docstring)
    best_value, best = (plain_value * VERIFY_MARGIN if not forced else -1.0), None
    for width in _widths(candidates, n_rows):
        order = forced + sorted((c for c in candidates if not c.forced), key=lambda c: -_gain(c, width))
        expected: float
        chosen_context: float
        chosen_n = expected = chosen_context = 0
        widest = 0
        for k, candidate in enumerate(order):
            chosen_n += 1
            expected += _gain(candidate, width)
            chosen_context += candidate.context
            widest = max(widest, _cut(candidate, width))
            if k + 1 < len(forced):
                continue  # every forced candidate is in every alternative
            tokens = n_rows + expected
            for layout, ms in _layouts(costs, n_rows, chosen_n, 1 + widest, chosen_context, total_context, can_pad):
                if tokens / ms > best_value:
                    best_value, best = tokens / ms, (order[:chosen_n], layout, ms, width)
    chosen, layout, ms, width = best if best is not None else ([], VerifyLayout.BESIDE, plain_ms, None)
    if best is None:  # nothing pays: a look at an explorer needs only its first tokens
        rate, width = plain_value, (CUT_WIDTHS[0] if _can_cut(candidates) else None)
    else:
        rate = best_value
    chosen, ms, layout, explore_ms = _add_explorers(rows, candidates, chosen, ms, layout, rate, costs, width)
    if not chosen:
        return TickPlan(
            PlanMode.SYNCHRONOUS, declined=[c.key for c in candidates], expected_ms=plain_ms, plain_ms=plain_ms
        )
    chosen_keys = {c.key for c in chosen}
    if width is not None and max(c.draft for c in chosen) <= width - 1:
        width = None  # no chosen draft is longer than the cut
    return TickPlan(
        PlanMode.SYNCHRONOUS,
        verify=[c.key for c in candidates if c.key in chosen_keys],
        layout=layout,
        declined=[c.key for c in candidates if c.key not in chosen_keys],
        expected_ms=ms,
        plain_ms=plain_ms,
        explore_ms=explore_ms,
        width=width,
    )


def _widths(candidates: list[RowView], n_rows: int) -> list[int] | list[None]:
    """The forward widths worth weighing (None: every draft whole). Cutting needs every candidate's
    per-token acceptance; the widths are the candidates' own and ``CUT_WIDTHS`` below the widest, at most
    ``MAX_BATCHED_WIDTH`` beside other rows."""
    if not _can_cut(candidates):
        return [None]
    widest = 1 + max(c.draft for c in candidates)
    if n_rows > 1:
        widest = min(widest, MAX_BATCHED_WIDTH)
    return sorted(w for w in {1 + c.draft for c in candidates} | set(CUT_WIDTHS) if w <= widest)


def _can_cut(candidates: list[RowView]) -> bool:
    """Whether the drafts may be cut: cutting needs every candidate's per-token acceptance."""
    return all(0.0 < c.acceptance < 1.0 for c in candidates)


def _cut(row: RowView, width: int | None) -> int:
    return row.draft if width is None else min(row.draft, width - 1)


def _gain(row: RowView, width: int | None) -> float:
    """Draft tokens ``row`` is expected to accept with its draft cut to ``width`` (acceptance stops at the
    first rejection: p + p^2 + ... + p^k)."""
    k = _cut(row, width)
    if k == row.draft:
        return row.expected
    p = row.acceptance
    return p * (1.0 - p**k) / (1.0 - p)


def _add_explorers(
    rows: list[RowView],
    candidates: list[RowView],
    chosen: list[RowView],
    ms: float,
    layout: VerifyLayout,
    rate: float,
    costs: Costs,
    width: int | None = None,
) -> tuple[list[RowView], float, VerifyLayout, float]:
    """The best alternative (``chosen`` rows verified, ``ms``, at ``rate`` tokens a ms) with the ``explore``
    candidates it leaves out added, most expected first, while the budget covers what they lose."""
    keys = {c.key for c in chosen}
    left_out = sorted((c for c in candidates if c.explore and c.key not in keys), key=lambda c: -c.expected)
    loss = 0.0
    for candidate in left_out:
        if costs.explore_budget_ms - loss <= 0:
            break  # the budget may end below zero: the arm's share of later ticks pays it back
        trial = chosen + [candidate]
        trial_ms, trial_layout = _alternative_ms(rows, trial, costs, width)
        tokens = len(rows) + sum(_gain(c, width) for c in trial)
        chosen, ms, layout, loss = trial, trial_ms, trial_layout, max(trial_ms - tokens / rate, 0.0)
    return chosen, ms, layout, loss


def _alternative_ms(
    rows: list[RowView], chosen: list[RowView], costs: Costs, cut: int | None = None
) -> tuple[float, VerifyLayout]:
    """The estimated ms of verifying ``chosen`` (drafts cut to width ``cut``) and the cheaper layout for it."""
    layouts = _layouts(
        costs,
        len(rows),
        len(chosen),
        1 + max(_cut(c, cut) for c in chosen),
        sum(c.context for c in chosen),
        sum(row.context for row in rows),
        all(row.can_pad for row in rows),
    )
    layout, ms = min(layouts, key=lambda pair: pair[1])
    return ms, layout


def _layouts(
    costs: Costs, n_rows: int, chosen_n: int, fed: int, chosen_context: float, total_context: float, can_pad: bool
) -> list[tuple[VerifyLayout, float]]:
    """The estimated ms of a synchronous tick verifying ``chosen_n`` of ``n_rows`` rows in a forward ``fed``
    tokens wide: "beside" (that forward and one batched step of the rest), and "padded" (one forward for
    every row) where every row can pad and some row is not verified."""
    # the estimates are numbers here: plan_verify returns before any layout while the estimate is None
    estimate, overhead = costs.forward, costs.sync_overhead_ms
    rest = n_rows - chosen_n
    beside = overhead + estimate(chosen_n, fed, chosen_context / chosen_n)  # type: ignore[operator]
    if not rest:
        return [(VerifyLayout.BESIDE, beside)]
    beside += estimate(rest, 1, (total_context - chosen_context) / rest)  # type: ignore[operator]
    layouts = [(VerifyLayout.BESIDE, beside)]
    if can_pad:
        layouts.append((VerifyLayout.PADDED, overhead + estimate(n_rows, fed, total_context / n_rows)))  # type: ignore[operator]
    return layouts
