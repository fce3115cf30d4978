"""The prompt-lookup arm of the decode tick: verify rounds without giving up lookahead.

Contract: whenever a decoding row has a drafter, the scheduler's decode tick is the arm's plan and
execute and the scheduler's own update (``BatchScheduler._update``, the one step that changes the rows):
- plan (``plan(rows, prefilling, steps)``): each drafting row's ``draft_block()`` is called once per tick
  (once more after a read, rule 4, for a row the steps read agreed with throughout); the proposals and
  what the rows' governors expect of them go to the pure policy ``tick_plan.plan_tick``, which returns
  the tick's plan (pipelined with n chained steps, read the lookahead step, or synchronous with the rows
  to verify and the layout). The plan talks to the drafters only to ask for proposals (``draft_block``,
  withdrawn at once where the grammar forbids the first token or one token is left); its verdicts
  (declined proposals to retract, the pacing of each row) go in the ``ArmPlan``'s ``DraftVerdicts`` for
  the update step. Returns an ``ArmPlan``.
- execute (``execute(plan, record)``): the engine runs it (``DecodeLoop`` steps, ``verify_rows_timed``)
  and a ``TickResult`` comes back: verify rounds' outcomes, plain tokens, failures, what the plan cost
  the cost model, what the forwards took. No request state and no figure changes here.
- update (the scheduler): the plan's verdicts are applied to the drafters (a declined draft is retracted
  before the row's next tokens are observed, so it is scored against them; execute never touches a
  drafter), the cost model and the forward times are fed, the drafters learn the rounds' outcomes, the
  tokens go through the finish step. A tick that read its lookahead step returns
  ``carried`` proposals: the update settles them against the tokens read, and ``plan_after_read`` plans
  the synchronous rest of the tick.

The rules, in the order they apply:
1. Bound: when ``max_batch`` is set and the active batch (decoding rows plus rows still in prefill,
   which join within a few ticks: docs/benchmark_results/code_notes.md#gate-counts-prefill) is above it,
   no row drafts this tick (no ``draft_block`` call, no miss); its drafter keeps observing tokens. A row
   whose governor grants no budget is "declined by governor".
2. While step n is in flight, every drafter is asked for a proposal on its committed tokens.
3. No proposal anywhere: step n+1 is primed and the tick pipelines exactly as plain decode does,
   chaining steps as the rows' quiet streaks allow (``tick_plan.py``).
4. Some row's proposal pays (the gate, rule 5, would verify it): no prime is submitted; the steps in
   flight are read and committed. Each early proposal predicted their tokens as its first: where they
   agree throughout, the governor records the agreed tokens as an accepted round and the row proposes
   again from there, a whole draft (the rest of the old one is a short draft, which seldom pays for its
   forward where steps are fast); where one disagrees, the governor records the rejection (the agreed
   tokens + 1 drafted) and the row drafts nothing more this tick. Proposals that do not pay are declined
   and the tick pipelines on.
5. The verify gate (``tick_plan.plan_verify``) weighs the drafts against the forwards' estimated cost
   (``engine.forward_cost``): verified rows run their rounds in one forward (``verify_rows``, each its
   own draft length), beside one batched step for the other rows or padded into one forward with them,
   whichever the estimate prefers; a draft that does not pay is declined (retracted, no miss) and the
   row drafts again a few tokens later (``mlxd_drafters.pacing.DECLINE_PAUSE_TOKENS``; a long match on the
   next token, so copying rows meet in one verify forward). A probe of a governor that turned off, or a row the gate
   has declined for ``pacing.EXPLORE_AFTER_DECLINED_TOKENS`` tokens running, is verified even at a loss while
   the exploration budget lasts (``ExplorationBudget``: ``EXPLORE_SHARE`` of the ticks' wall time), so a
   row that starts copying again is seen to at a bounded cost; a proposal from the request's predicted
   output is always verified (the client asked for it, and OpenAI bills rejected prediction tokens for
   the same reason). What a draft is
   expected to accept comes from its governor's window, with a prior that trusts a long match more
   (``DraftGovernor.expected_accepted``). This is decided while the steps are in flight: only proposals the
   gate verifies end the lookahead.
6. From a synchronous state, a tick re-primes (submits a lookahead step and returns) only when nothing
   was verified and every prompt-lookup row's ``pipelines_plain_rounds()`` is true or its draft was just
   declined; otherwise it stays synchronous with one batched step.
7. Structured output: a row with a grammar never pipelines (its mask needs its last token read), and
   its proposal is cut at the first token the grammar forbids (the verify round cuts it, and masks
   every position); a proposal whose first token is forbidden is retracted (no round, no miss).
A verify forward that fails fails only its row: a failed batched forward is unwound and retried row by
row; a row whose own forward fails finishes with an error; the other rows go on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from mlxd_engine import Emitted, Engine, ForwardSample, RoundOutcome, kv_room, verify_rows_timed

from .decode import DecodeLoop
from .kinds import PlanMode, VerifyLayout
from .recent_timings import RecentTimings
from .request import RequestState
from .tick_plan import Costs, RowView, TickPlan, lookahead_steps, plan_tick
from .tick_result import DraftVerdicts, TickResult
from .trace import TickRecord

log = logging.getLogger("mlxd.scheduler")

# Rule 5: verifying probes and declined rows at a loss may cost this share of the ticks' wall time (the
# plain-decode goal allows a percent), with at most EXPLORE_SAVED_MS saved up while nobody explores.
EXPLORE_SHARE = 0.01
EXPLORE_SAVED_MS = 20.0
# TickOverheads: a synchronous tick's overhead is the lower median of the last SYNC_SAMPLES, the least of
# them while fewer than SYNC_SAMPLES_NEEDED; forgotten after SYNC_STALE_TICKS ticks that declined a draft
# with no synchronous tick between (docs/benchmark_results/code_notes.md#tick-overheads)
SYNC_SAMPLES = 9
SYNC_SAMPLES_NEEDED = 3
SYNC_STALE_TICKS = 8


@dataclass
class ArmPlan:
    """A decode tick's plan as the arm runs it: the policy's ``TickPlan``, the rows, and the drafts it
    verifies (already cut to the plan's width)."""

    plan: TickPlan
    rows: list[RequestState]
    details: dict[RequestState, str] = field(default_factory=dict)  # trace detail of a row held back
    verify: dict[RequestState, list[int]] = field(default_factory=dict)
    forced: set[RequestState] = field(default_factory=set)  # rows verified whatever their drafts cost
    declined: int = 0  # proposals the gate declined
    drafts_from: dict[RequestState, int] = field(default_factory=dict)  # rule 4: the token count a draft follows
    steps: int = 1  # the most chained steps the scheduler allowed this tick
    verdicts: DraftVerdicts = field(default_factory=DraftVerdicts)  # for the update step (retractions, pacing)


class TickOverheads:
    """What prompt-lookup ticks cost beyond their forwards, measured from the scheduler's wall clock
    (``observe``): a pipelined tick's wall minus its steps' time (the plain alternative's overhead, shared
    by the tick's chained steps), and a synchronous tick's wall
    minus the forwards in it (verify forwards, synchronous steps, the wait for the lookahead steps it read):
    the finish step of every row, events, re-priming.
    On a small model these are most of a tick; on a large one a rounding error.

    Only ticks the gate makes synchronous measure ``sync_ms``, so a figure too high would keep the gate
    shut and never be measured again (one slow first tick did that to every later copy:
    docs/benchmark_results/code_notes.md#tick-overheads). So it is the lower median of the last
    ``SYNC_SAMPLES`` synchronous ticks (the least of them while fewer than ``SYNC_SAMPLES_NEEDED``), which one
    spike cannot move, and it is forgotten (0, as at the start, until the next synchronous tick) after
    ``SYNC_STALE_TICKS`` ticks in which the gate declined a draft and no tick was synchronous: a verify then
    measures it again."""

    WEIGHT = 0.1  # each pipelined tick's share of the plain overhead's moving average

    def __init__(self):
        self.plain_ms = 0.0
        self.plain_ticks = 0
        self._sync = RecentTimings(SYNC_SAMPLES)
        self._declining_ticks = 0  # ticks with a declined draft since the last synchronous tick

    @property
    def sync_ms(self) -> float:
        figure = self._sync.least() if len(self._sync) < SYNC_SAMPLES_NEEDED else self._sync.lower_median()
        return figure or 0.0

    def observe(self, kind: str, wall_ms: float, forward_ms: float) -> None:
        """``kind``: "plain" (a pipelined tick) or "sync"; ``forward_ms``: the forwards' time in it."""
        extra = wall_ms - forward_ms
        if kind == "plain":
            self.plain_ms = extra if not self.plain_ticks else (1 - self.WEIGHT) * self.plain_ms + self.WEIGHT * extra
            self.plain_ticks += 1
        elif kind == "sync":
            self._sync.add(max(extra, 0.0))
            self._declining_ticks = 0

    def declined(self) -> None:
        """The gate declined a draft this tick."""
        self._declining_ticks += 1
        if self._declining_ticks >= SYNC_STALE_TICKS:
            self._sync.clear()


class ExplorationBudget:
    """Milliseconds the gate may lose verifying rows to look at them (rule 5): each tick adds
    ``EXPLORE_SHARE`` of its wall time, up to ``EXPLORE_SAVED_MS``; each plan's estimated loss is taken
    off, and may leave it below zero (later ticks pay it back before anyone explores again)."""

    def __init__(self):
        self.balance_ms = 0.0

    def earn(self, wall_ms: float) -> None:
        self.balance_ms = min(self.balance_ms + EXPLORE_SHARE * wall_ms, EXPLORE_SAVED_MS)

    def spend(self, ms: float) -> None:
        self.balance_ms -= ms


class MeasuredCosts:
    """The verify gate's costs as this engine measures them: synchronous forwards from
    ``engine.forward_cost``, pipelined plain steps from the decode loop (by batch size), and the ticks'
    overheads (``TickOverheads``, fed by ``observe_tick``), and what exploring may still lose
    (``ExplorationBudget``)."""

    def __init__(self, engine: Engine, decode_loop: DecodeLoop):
        self.engine = engine
        self.decode_loop = decode_loop
        self.overheads = TickOverheads()
        self.exploration = ExplorationBudget()

    def costs(self) -> Costs:
        return Costs(
            self.engine.forward_cost.estimate,
            self.overheads.plain_ms,
            self.overheads.sync_ms,
            self.plain_step_ms,
            self.exploration.balance_ms,
        )

    def plain_step_ms(self, rows: int) -> float | None:
        """A pipelined step of ``rows`` rows as the decode loop measured it; for a batch size it has not
        measured, the forward estimate scaled as the nearest measured size's step was (a pipelined step
        overlaps Python, so it costs less than a synchronous forward: on a small model about half)."""
        measured = self.decode_loop.step_ms_by_rows
        if rows in measured:
            return measured[rows]
        if not measured:
            return None
        nearest = min(measured, key=lambda n: (abs(n - rows), n))
        estimate = self.engine.forward_cost.estimate
        at_nearest, here = estimate(nearest, 1, 0.0), estimate(rows, 1, 0.0)
        if not at_nearest or here is None:
            return None
        return here * measured[nearest] / at_nearest

    def spent_exploring(self, ms: float) -> None:
        self.exploration.spend(ms)

    def declined(self, drafts: int) -> None:
        """The gate declined ``drafts`` proposals this tick (``TickOverheads.declined``)."""
        if drafts:
            self.overheads.declined()

    def observe_tick(self, rows: int, was_pipelined: bool, steps: int, wall_ms: float, forward_ms: float) -> None:
        """The scheduler's wall clock of one prompt-lookup decode phase (results applied), and the
        forward time in it (verify forwards, synchronous steps, teardowns: ``BatchScheduler._forward_ms_so_far``).
        A re-prime (synchronous before, pipelined after) submits a step whose tokens the next tick reads:
        its wall is the plain alternative's, not a synchronous tick's overhead."""
        if not rows:
            return
        self.exploration.earn(wall_ms)
        if was_pipelined and self.decode_loop.pipelined:
            step_ms = self.decode_loop.last_step_ms
            if step_ms is not None:  # the plain alternative: a tick of chained steps
                self.overheads.observe("plain", wall_ms, step_ms * steps)
        elif not self.decode_loop.pipelined:
            self.overheads.observe("sync", wall_ms, forward_ms)


class PromptLookupArm:
    def __init__(self, engine: Engine, decode_loop: DecodeLoop, max_batch: int | None):
        self.engine = engine
        self.decode_loop = decode_loop
        # what the policy weighs (``costs()``); the scheduler's update step feeds it (``TickResult``, ``observe_tick``)
        self.cost_model = MeasuredCosts(engine, decode_loop)
        self.max_batch = max_batch  # rule 1 (None: no bound; the verify gate decides)
        self.counters = {
            "verify_rounds": 0,
            "declined_gate": 0,
            "declined_governor": 0,
            "declined_cost": 0,
            "padded_forwards": 0,
        }

    def learn(self, result: TickResult) -> None:
        """The update step's share of a result, before its tokens: the plan's verdicts to the drafters
        (``DraftVerdicts.apply``), its exploration and declines to the cost model, the verify rounds counted."""
        result.verdicts.apply()
        self.cost_model.spent_exploring(result.explore_ms)
        self.cost_model.declined(result.declined)
        self.counters["verify_rounds"] += len(result.rounds)

    # -- plan --------------------------------------------------------------------------------------
    def plan(self, rows: list[RequestState], prefilling: int = 0, steps: int = 1) -> ArmPlan:
        """The plan of one decode tick over ``rows``; ``prefilling`` rows count toward the bound; ``steps``:
        the most chained steps a plain tick may submit (rule 3)."""
        drafting = [s for s in rows if s.drafter is not None]
        if self.max_batch is not None and len(rows) + prefilling > self.max_batch:
            self.counters["declined_gate"] += len(drafting)
            return ArmPlan(TickPlan(PlanMode.PIPELINED, steps=steps), rows, {s: "declined-gate" for s in drafting})
        proposals, forced, explore, held = self._propose(drafting)
        if not proposals and self.decode_loop.pipelined:  # rule 3, as plan_tick would have it, without the views
            plan = TickPlan(
                PlanMode.PIPELINED, steps=lookahead_steps([s.drafter.pacing.quiet_ticks for s in drafting], steps)
            )
        else:
            plan = plan_tick(
                self._views(rows, proposals, forced, explore),
                self.decode_loop.pipelined,
                steps,
                self.cost_model.costs(),
            )
        return self._settle_proposals(plan, rows, proposals, forced | explore, held, steps)

    def plan_after_read(self, rows: list[RequestState], again: list[RequestState], read: TickResult) -> ArmPlan:
        """The synchronous rest of a tick that read its lookahead step (rule 4), over the rows still
        decoding, once the update step has applied the read and settled its carried proposals: ``again``,
        the rows whose proposals the steps agreed with throughout, propose again from where the steps left
        them (a whole draft, where the rest of the old one would be a short one that seldom pays for its
        forward)."""
        proposals, forced, explore, held = self._propose(again)
        forced |= {state for state in proposals if state in read.carried_forced}
        plan = plan_tick(
            self._views(rows, proposals, forced, explore), False, read.carried_steps, self.cost_model.costs()
        )
        return self._settle_proposals(plan, rows, proposals, forced | explore, held)

    def _propose(
        self, drafting: list[RequestState]
    ) -> tuple[dict[RequestState, list[int]], set[RequestState], set[RequestState], dict[RequestState, str]]:
        """Every drafting row's one ``draft_block()`` of the tick. Returns the proposals to weigh, the
        forced ones and those worth a look at a loss (rule 5), and trace details of rows held back by
        their governor."""
        proposals: dict[RequestState, list[int]] = {}
        forced: set[RequestState] = set()
        explore: set[RequestState] = set()
        held: dict[RequestState, str] = {}
        for state in drafting:
            drafter = state.drafter
            if not drafter.pacing.may_propose(state.emitted):  # rule 5: a row the gate declined drafts again later
                continue
            proposal = drafter.draft_block()  # counts toward the governors' probe spacing
            if drafter.last_budget == 0:
                held[state] = "declined-governor"
                self.counters["declined_governor"] += 1
            if not proposal:
                continue
            grammar = state.seq.chain.grammar
            if grammar is not None and not grammar.allowed_prefix(proposal):
                drafter.retract_draft()  # rule 7: the grammar forbids even the first draft token
                continue
            if state.request.max_tokens - state.emitted <= 1:
                # one token left: the round would check no draft; a plain step gives that token
                drafter.retract_draft()
                continue
            if drafter.proposal_from_prediction:
                forced.add(state)  # rule 5: the client's own prediction
            elif drafter.proposal_is_probe or drafter.pacing.worth_a_look(state.emitted):
                explore.add(state)  # rule 5: a probe, or a look at a row the gate keeps declining
            proposals[state] = proposal
        return proposals, forced, explore, held

    def _views(
        self,
        rows: list[RequestState],
        proposals: dict[RequestState, list[int]],
        forced: set[RequestState],
        explore: set[RequestState],
    ) -> list[RowView]:
        widest = 1 + max((len(p) for p in proposals.values()), default=0)
        synchronous = not self.decode_loop.pipelined  # pipelines_plain_rounds() matters only then (rule 6)
        views = []
        for state in rows:
            proposal = proposals.get(state, [])
            drafter = state.drafter
            views.append(
                RowView(
                    state,
                    state.seq.kv.written,
                    can_pad=state.seq.params.logprobs is None and kv_room(state.seq) >= widest,
                    drafting=drafter is not None,
                    draft=len(proposal),
                    expected=drafter.expected_accepted(len(proposal)) if proposal else 0.0,
                    acceptance=drafter.acceptance_estimate() if proposal else 0.0,
                    forced=state in forced,
                    explore=state in explore,
                    quiet_ticks=drafter.pacing.quiet_ticks if drafter is not None else 0,
                    # a paused row will not propose next tick: it holds no pipelining back
                    pipelines=(
                        drafter.pipelines_plain_rounds()
                        if drafter is not None and synchronous and drafter.pacing.may_propose(state.emitted)
                        else True
                    ),
                ),
            )
        return views

    def _settle_proposals(
        self,
        plan: TickPlan,
        rows: list[RequestState],
        proposals: dict[RequestState, list[int]],
        forced: set[RequestState],
        held: dict[RequestState, str],
        steps: int = 1,
    ) -> ArmPlan:
        """The policy's plan as the arm runs it: the verified proposals cut to the plan's width, and the
        verdicts the update step applies to the drafters (``DraftVerdicts``): the declined proposals
        retracted (rule 5: no miss) and their rows paused, the drafters' pacing told the tick."""
        arm_plan = ArmPlan(plan, rows, dict(held), forced=forced, steps=steps)
        verdicts = arm_plan.verdicts
        declined = set(plan.declined)
        for state, proposal in proposals.items():
            if state in declined:  # rule 5: not worth its forward this tick; no miss
                verdicts.declined.append((state, state.emitted, state.drafter.last_match_is_long))
                arm_plan.details[state] = "declined-cost"
                self.counters["declined_cost"] += 1
            else:
                # the plan may cut long drafts to a narrower forward (tick_plan.py); the rest is not verified
                arm_plan.verify[state] = proposal if plan.width is None else proposal[: plan.width - 1]
                verdicts.verified.append(state)
        arm_plan.declined = len(declined)
        if plan.mode == PlanMode.READ:
            for state in arm_plan.verify:
                verdicts.proposed.append(state)
                arm_plan.drafts_from[state] = len(state.seq.tokens)  # the drafts start here
        elif plan.mode == PlanMode.PIPELINED and self.decode_loop.pipelined:
            # rule 3: one more pipelined tick without a proposal
            verdicts.quiet.extend(state for state in rows if state.drafter is not None)
        elif plan.mode == PlanMode.SYNCHRONOUS and arm_plan.verify and plan.layout == VerifyLayout.PADDED:
            self.counters["padded_forwards"] += 1
        return arm_plan

    # -- execute -----------------------------------------------------------------------------------
    def execute(self, arm_plan: ArmPlan, record: TickRecord) -> TickResult:
        """Run the plan on the engine: the steps in flight read (rule 4), a pipelined plain tick (rule 3),
        or the verify rounds beside one batched step or padded into one forward with it (rule 5). Changes
        no request state and no figure: what the forwards gave and took goes back to the update step."""
        plan, rows, verify = arm_plan.plan, arm_plan.rows, arm_plan.verify
        if plan.mode == PlanMode.READ:  # rule 4: read the steps in flight instead of priming; settle the drafts after
            result = self.decode_loop.teardown()
            result.carried = verify
            result.carried_forced = arm_plan.forced
            result.carried_from = arm_plan.drafts_from
            result.carried_steps = arm_plan.steps
        elif plan.mode == PlanMode.PIPELINED:
            record.steps = plan.steps
            result = self.decode_loop.tick(rows, plan.steps)
        else:
            result = TickResult()
            rest = [s for s in rows if s not in verify]
            if verify and plan.layout == VerifyLayout.PADDED:
                self._verify_all({**verify, **{s: [] for s in rest}}, result)
            else:
                if verify:
                    self._verify_all(verify, result)
                if rest:
                    result.merge(self.decode_loop.step_synchronously(rest))
        result.details, result.explore_ms, result.declined = arm_plan.details, plan.explore_ms, arm_plan.declined
        result.verdicts = arm_plan.verdicts
        return result

    def _verify_all(self, drafts: dict[RequestState, list[int]], result: TickResult) -> None:
        """The rows' verify rounds in one forward (``verify_rows_timed``; rows with an empty draft take their
        one token in it); if that forward fails, each row is retried alone, so a failure fails only its row."""
        states = list(drafts)
        outcomes: list[RoundOutcome] | list[RoundOutcome | None]  # None: that row's retry failed
        samples: list[ForwardSample]
        try:
            # EOS, max_tokens and the KV bound are cut inside the round; a stop string is found by the
            # finish step, which ends the row at that token (the row's slot is then released)
            outcomes, samples = verify_rows_timed(
                self.engine,
                [s.seq for s in states],
                [drafts[s] for s in states],
                [max(s.request.max_tokens - s.emitted, 1) for s in states],
            )
        except Exception as error:  # noqa: BLE001 - retried row by row below
            if len(states) == 1 or self.engine.lost:  # a lost distributed group: no retry
                for state in states:
                    self._verify_failed(state, error, result)
                return
            log.warning("batched verify of %d rows failed (%s); verifying them one by one", len(states), error)
            for state in states:
                self.engine.unwind_pending(state.seq)
            retried: list[RoundOutcome | None] = []
            samples = []
            for state in states:
                try:
                    row_outcomes, row_samples = verify_rows_timed(
                        self.engine, [state.seq], [drafts[state]], [max(state.request.max_tokens - state.emitted, 1)]
                    )
                except Exception as row_error:  # noqa: BLE001 - a failed verify fails only this row
                    self._verify_failed(state, row_error, result)
                    retried.append(None)
                    continue
                retried.append(row_outcomes[0])
                samples.extend(row_samples)
            outcomes = retried
        result.forwards.extend(samples)
        for state, outcome in zip(states, outcomes):
            if outcome is None:
                continue
            if not drafts[state]:  # a plain row of a padded forward: its one token, as a step gives it
                result.emitted.append((state, Emitted(outcome.emitted[0])))
                continue
            result.rounds.append((state, outcome))

    def _verify_failed(self, state: RequestState, error: Exception, result: TickResult) -> None:
        self.engine.mark_lost(error)  # a distributed group: the ranks may be out of step
        lost = self.engine.lost  # the group's reason, when the ranks parted
        if lost:
            result.failed.append((state, lost))  # nothing can be unwound: the group is gone
            return
        self.engine.unwind_pending(state.seq)
        result.failed.append((state, f"verify failed: {type(error).__name__}: {error}"))
