"""The prompt-lookup tick's pure policy: pipelining, and which drafts pay for their forward, in which layout."""

from __future__ import annotations

from mlxd_scheduler.tick_plan import VERIFY_MARGIN, Costs, RowView, plan_tick


def linear(fixed: float, per_token: float):
    return lambda rows, width, context: fixed + per_token * rows * width


def no_estimate(*args):
    return None


def rows(*drafts, expected=None, forced=(), can_pad=True, pipelines=True):
    """Row i proposes drafts[i] tokens (0: none) expecting expected[i] accepted."""
    expected = expected or [0.0] * len(drafts)
    return [
        RowView(i, 100, can_pad=can_pad, drafting=True, draft=d, expected=e, forced=i in forced, pipelines=pipelines)
        for i, (d, e) in enumerate(zip(drafts, expected))
    ]


def synchronous(views, costs):
    return plan_tick(views, pipelined=False, max_steps=8, costs=costs)


def test_pipelined_without_proposals_backs_off_by_the_quietest_row():
    views = [RowView(0, 10, drafting=True, quiet_ticks=2), RowView(1, 10, drafting=True, quiet_ticks=5), RowView(2, 10)]
    plan = plan_tick(views, pipelined=True, max_steps=8, costs=no_estimate)
    assert plan.mode == "pipelined" and plan.steps == 4
    assert plan_tick(views[2:], pipelined=True, max_steps=8, costs=no_estimate).steps == 8  # nobody drafts


def test_a_proposal_that_pays_while_pipelined_reads_the_step_in_flight():
    plan = plan_tick(rows(0, 8, expected=[0, 7.0]), pipelined=True, max_steps=8, costs=linear(10, 0.1))
    assert plan.mode == "read"


def test_a_proposal_that_does_not_pay_while_pipelined_keeps_the_pipeline_and_counts_as_quiet():
    views = [
        RowView(0, 100, drafting=True, draft=2, expected=0.5, quiet_ticks=0),
        RowView(1, 100, drafting=True, quiet_ticks=3),
    ]
    plan = plan_tick(views, pipelined=True, max_steps=8, costs=linear(0, 1))
    assert plan.mode == "pipelined" and plan.declined == [0] and plan.steps == 2


def test_tick_overheads_weigh_against_verifying():
    # the forward alone would pay (10 ms for 9 tokens against 8 ms for 1), the synchronous tick's own
    # 20 ms do not: a verify tick costs what reading, settling and re-priming cost as well
    views = rows(8, expected=[1.0])
    assert synchronous(views, Costs(linear(8, 0.25))).verify == [0]
    assert synchronous(views, Costs(linear(8, 0.25), sync_overhead_ms=20.0)).verify == []
    # and a pipelined plain step whose Python hides behind the model costs less than its forward (8 steps
    # chained a tick: each step saves an eighth of the tick's -32 ms)
    assert synchronous(views, Costs(linear(8, 0.25), plain_overhead_ms=-32.0)).verify == []


def test_the_plain_alternative_shares_a_ticks_overhead_among_the_steps_it_would_chain():
    costs = Costs(linear(2, 0.5), plain_overhead_ms=4.0)
    views = [RowView(0, 100, drafting=True, draft=3, expected=0.3)]  # verify: 1.3 tokens for 4 ms
    assert plan_tick(views, pipelined=False, max_steps=8, costs=costs).verify == []  # plain: 3 ms a token
    assert plan_tick(views, pipelined=False, max_steps=2, costs=costs).verify == [0]  # plain: 4.5 ms a token


def test_a_measured_pipelined_step_prices_the_plain_alternative():
    views = rows(8, expected=[1.0])
    slow_steps = Costs(linear(8, 0.25), plain_step_ms=lambda rows: 30.0)
    assert synchronous(views, Costs(linear(8, 0.25))).verify == [0]
    assert synchronous(views, Costs(linear(8, 0.25), plain_step_ms=lambda rows: 4.0)).verify == []
    assert synchronous(views, slow_steps).verify == [0]


def test_synchronous_without_proposals_reprimes_only_when_every_drafter_pipelines():
    assert synchronous(rows(0, 0), linear(1, 1)).mode == "pipelined"
    assert synchronous(rows(0, 0, pipelines=False), linear(1, 1)).mode == "synchronous"


def test_without_an_estimate_every_candidate_is_verified_beside_the_step():
    plan = synchronous(rows(8, 2, 0, expected=[0.1, 0.1, 0]), no_estimate)
    assert plan.mode == "synchronous" and plan.verify == [0, 1] and plan.layout == "beside"


def test_per_token_cost_declines_drafts_that_do_not_pay_and_reprimes():
    # each query token costs a step's worth: a 9-token round must gain 8 tokens to pay, and is expected to gain 3
    plan = synchronous(rows(8, expected=[3.0]), linear(0, 1))
    assert plan.verify == [] and plan.declined == [0]
    assert plan.mode == "pipelined"  # a declined draft does not hold pipelining back


def test_a_verify_must_beat_the_plain_tick_by_the_margin():
    # plain: 1 token in 10.1 ms; a 9-token round costs 10.9 ms: 1.15 tokens beat plain by 6.5% (declined),
    # 1.3 tokens by 20% (verified)
    assert VERIFY_MARGIN == 1.1
    assert synchronous(rows(8, expected=[0.15]), linear(10, 0.1)).verify == []
    assert synchronous(rows(8, expected=[0.3]), linear(10, 0.1)).verify == [0]


def test_at_one_row_a_round_pays_when_the_forward_is_mostly_fixed_cost():
    assert synchronous(rows(8, expected=[1.0]), linear(10, 0.1)).verify == [0]


def test_fixed_cost_pads_every_row_into_one_forward():
    plan = synchronous(rows(8, 0, 0, 0, expected=[2.0, 0, 0, 0]), linear(10, 0.01))
    assert plan.verify == [0] and plan.layout == "padded"


def test_per_token_cost_keeps_the_plain_rows_in_their_own_step():
    # padding 3 plain rows to 9 tokens costs 12 ms more than their step; a second forward costs 4
    plan = synchronous(rows(8, 0, 0, 0, expected=[7.0, 0, 0, 0]), linear(4, 0.5))
    assert plan.verify == [0] and plan.layout == "beside"


def test_a_row_that_cannot_pad_rules_the_padded_layout_out():
    views = rows(8, 0, 0, expected=[2.0, 0, 0]) + [RowView(3, 100, can_pad=False)]
    assert synchronous(views, linear(10, 0.01)).layout == "beside"


def test_the_best_rows_are_chosen_and_the_poor_ones_declined():
    # two rows expect long accepted runs, two almost nothing: verifying the poor ones costs more than they give
    plan = synchronous(rows(8, 8, 8, 8, expected=[7.5, 0.05, 7.0, 0.05]), linear(4, 0.5))
    assert plan.verify == [0, 2] and plan.declined == [1, 3]


def test_forced_candidates_are_verified_even_when_they_do_not_pay():
    plan = synchronous(rows(2, expected=[0.0], forced={0}), linear(0, 1))
    assert plan.verify == [0] and plan.mode == "synchronous"


def explorer_rows(expected=0.5):
    """Four plain rows and one whose governor turned off, probing with a 2-token draft."""
    return [RowView(0, 100, drafting=True, draft=2, expected=expected, explore=True)] + [
        RowView(i, 100) for i in range(1, 5)
    ]


def test_an_explorer_that_does_not_pay_is_verified_only_while_the_budget_lasts():
    costs = dict(forward=linear(1, 0.5))
    spent = synchronous(explorer_rows(), Costs(**costs, explore_budget_ms=0.0))
    assert spent.verify == [] and spent.declined == [0] and spent.explore_ms == 0.0
    saved = synchronous(explorer_rows(), Costs(**costs, explore_budget_ms=5.0))
    assert saved.verify == [0] and saved.explore_ms > 0.0  # the estimated loss goes back to the arm
    # the same row, pipelined: the budget decides whether the steps in flight are read for it
    assert (
        plan_tick(explorer_rows(), pipelined=True, max_steps=1, costs=Costs(**costs, explore_budget_ms=0.0)).mode
        == "pipelined"
    )
    assert (
        plan_tick(explorer_rows(), pipelined=True, max_steps=1, costs=Costs(**costs, explore_budget_ms=5.0)).mode
        == "read"
    )


def test_an_explorer_beside_a_plain_tick_is_looked_at_through_its_first_tokens():
    views = [RowView(0, 100, drafting=True, draft=15, expected=0.6, acceptance=0.4, explore=True)] + [
        RowView(i, 100) for i in range(1, 4)
    ]
    plan = synchronous(views, Costs(linear(1, 0.5), explore_budget_ms=5.0))
    assert plan.verify == [0] and plan.width == 3  # a 3-token forward, not the whole 15-token draft


def test_an_explorer_whose_draft_pays_costs_no_budget():
    plan = synchronous(explorer_rows(expected=1.9), Costs(linear(10, 0.01), explore_budget_ms=0.0))
    assert plan.verify == [0] and plan.explore_ms == 0.0


def test_a_forced_prediction_is_verified_whatever_the_budget():
    views = [RowView(0, 100, drafting=True, draft=2, expected=0.0, forced=True), RowView(1, 100)]
    assert synchronous(views, Costs(linear(0, 1), explore_budget_ms=-100.0)).verify == [0]


def copying(draft, acceptance, n_plain=0):
    """A row proposing ``draft`` tokens at per-token acceptance ``acceptance``, beside ``n_plain`` plain rows."""
    p = acceptance
    row = RowView(0, 100, drafting=True, draft=draft, expected=p * (1 - p**draft) / (1 - p), acceptance=p)
    return [row] + [RowView(i, 100) for i in range(1, n_plain + 1)]


def test_a_lone_row_verifies_its_whole_long_draft_when_it_copies():
    plan = synchronous(copying(15, 0.97), linear(2, 0.05))
    assert plan.verify == [0] and plan.width is None


def test_beside_other_rows_a_long_draft_is_cut_to_the_batched_width():
    from mlxd_scheduler.tick_plan import MAX_BATCHED_WIDTH

    plan = synchronous(copying(15, 0.97, n_plain=3), linear(2, 0.05))
    assert plan.verify == [0] and plan.width is not None and plan.width <= MAX_BATCHED_WIDTH


def test_where_query_tokens_cost_a_doubtful_draft_is_cut_rather_than_declined():
    # p = 0.6: the 15th token is accepted with p**15 (0.05%), yet costs as much as the first
    plan = synchronous(copying(15, 0.6), linear(1, 0.4))
    assert plan.verify == [0] and plan.width is not None and plan.width < 16
    whole = synchronous(
        [RowView(0, 100, drafting=True, draft=15, expected=1.5)], linear(1, 0.4)
    )  # no acceptance: whole
    assert whole.width is None


def test_in_the_fast_step_regime_a_long_exact_match_is_verified():
    """A small model on a CPU: a plain step costs well under a millisecond and 8 of them chain a tick (its
    overhead shared), a verify tick pays a synchronous overhead as large as a step or more. A fresh row
    whose draft continues a longest-n-gram match (the long-match prior, nothing verified yet) and a row
    whose drafts were all accepted both verify their whole 15-token draft, read out of the pipeline."""
    from mlxd_drafters import DraftGovernor, PromptLookupConfig

    forward = linear(0.63, 0.067)  # 0.70 ms for one token, 1.70 ms for sixteen
    costs = Costs(forward, plain_overhead_ms=0.25, sync_overhead_ms=1.0, plain_step_ms=lambda rows: 0.6)
    fresh = DraftGovernor(PromptLookupConfig())
    copying = DraftGovernor(PromptLookupConfig())
    for _ in range(3):
        copying.record(15, 15)
    for governor, long_match in ((fresh, True), (copying, False)):
        view = RowView(
            0,
            130,
            drafting=True,
            draft=15,
            expected=governor.expected_accepted(15, long_match),
            acceptance=governor.acceptance_estimate(long_match),
        )
        plan = plan_tick([view], pipelined=True, max_steps=8, costs=costs)
        assert plan.mode == "read" and plan.verify == [0] and plan.width is None
        assert synchronous([view], costs).verify == [0]
    # the same match priced with a one-off 10 ms tick as its overhead is declined: the figure the gate is
    # given must not keep such a spike (prompt_lookup_arm.TickOverheads)
    spiked = Costs(forward, plain_overhead_ms=0.25, sync_overhead_ms=10.0, plain_step_ms=lambda rows: 0.6)
    view = RowView(0, 130, drafting=True, draft=15, expected=fresh.expected_accepted(15, True), acceptance=0.9)
    assert plan_tick([view], pipelined=True, max_steps=8, costs=spiked).verify == []
