"""Tests for DraftGovernor policies, windowing and probing."""

import pytest

from mlxd_drafters import DraftGovernor, PromptLookupConfig


def make_governor(**overrides) -> DraftGovernor:
    """A governor drafting at most 8 tokens unless told otherwise (the tests' numbers assume it)."""
    return DraftGovernor(PromptLookupConfig(**{"max_draft": 8, **overrides}))


def record_many(governor: DraftGovernor, rounds: int, drafted: int, accepted: int):
    for _ in range(rounds):
        governor.record(drafted, accepted)


def test_always_never_shuts_off():
    governor = make_governor(policy="always", max_draft=6)
    record_many(governor, 20, drafted=6, accepted=0)
    assert [governor.budget() for _ in range(40)] == [6] * 40
    assert not governor.is_off


@pytest.mark.parametrize("policy", ["gated", "graded"])
def test_full_budget_until_enough_rounds(policy):
    governor = make_governor(policy=policy)
    record_many(governor, 3, drafted=8, accepted=0)
    assert governor.budget() == 8
    governor.record(8, 0)
    assert governor.budget() == 0


def test_gated_shuts_off_below_cutoff_and_stays_on_above():
    governor = make_governor(policy="gated", gated_cutoff=0.25)
    record_many(governor, 8, drafted=8, accepted=2)  # rate exactly 0.25
    assert governor.budget() == 8
    governor.record(8, 1)  # window now 15 / 64 < 0.25
    assert governor.is_off
    assert governor.budget() == 0


def test_probe_every_interval_while_off_and_peek_has_no_side_effect():
    governor = make_governor(policy="gated", probe_interval=5, probe_draft=3)
    record_many(governor, 8, drafted=8, accepted=0)
    budgets = []
    for _ in range(15):
        peeked = governor.peek_budget()
        assert governor.peek_budget() == peeked
        budgets.append(governor.budget())
        assert budgets[-1] == peeked
    assert budgets == [0, 0, 0, 0, 3] * 3


def test_probe_budget_never_exceeds_max_draft():
    governor = make_governor(policy="gated", max_draft=1, probe_interval=1)
    record_many(governor, 8, drafted=1, accepted=0)
    assert governor.budget() == 1


# Graded: 4 old misses + 4 full probes of 2 -> run 8/4 = 2 -> budget 3.
@pytest.mark.parametrize(("policy", "recovered_budget"), [("gated", 8), ("graded", 3)])
def test_recovers_through_successful_probes(policy, recovered_budget):
    governor = make_governor(policy=policy, probe_interval=16)
    record_many(governor, 8, drafted=8, accepted=0)
    calls = 0
    while governor.is_off:
        calls += 1
        assert calls < 16 * 20, "governor never recovered"
        budget = governor.budget()
        if budget:
            assert budget == 2
            governor.record(budget, budget)
    assert governor.budget() == recovered_budget
    # Recovery took several probes, each spaced by probe_interval calls.
    assert calls >= 16 * 2
    # After recovery the probe counter restarted: a relapse waits a full
    # interval again before probing.
    record_many(governor, 8, drafted=8, accepted=0)
    assert [governor.budget() for _ in range(16)] == [0] * 15 + [2]


def test_graded_budget_shrinks_as_acceptance_falls():
    governor = make_governor(policy="graded", governor_window=4)
    budgets = []
    for accepted in (8, 7, 3, 2, 1):
        record_many(governor, 4, drafted=8, accepted=accepted)
        budgets.append(governor.budget())
    # successes/failures: 7 -> 7+1=8, 3 -> 4, 2 -> 3, rate 1/8 < 0.2 -> 0.
    assert budgets == [8, 8, 4, 3, 0]


def test_graded_restores_full_budget_after_good_rounds():
    governor = make_governor(policy="graded", governor_window=4)
    record_many(governor, 4, drafted=8, accepted=2)
    assert governor.budget() == 3
    record_many(governor, 4, drafted=3, accepted=3)
    assert governor.budget() == 8


def test_graded_rule_uses_censoring_aware_run_length():
    governor = make_governor(policy="graded", max_draft=16)
    for drafted, accepted in [(8, 8), (8, 0), (8, 3), (8, 8)]:
        governor.record(drafted, accepted)
    # 19 successes, 2 failures (only rounds with a rejection count).
    assert governor.budget() == 10 + 1


def test_graded_budget_clamped_to_min_draft():
    governor = make_governor(policy="graded", min_draft=3, governor_window=4)
    record_many(governor, 4, drafted=4, accepted=1)  # run 1 -> size 2
    assert governor.budget() == 3


def test_window_forgets_old_rounds():
    governor = make_governor(policy="gated", governor_window=4)
    record_many(governor, 4, drafted=8, accepted=0)
    assert governor.budget() == 0
    record_many(governor, 4, drafted=8, accepted=8)
    assert governor.history == ((8, 8),) * 4
    assert governor.acceptance_rate == 1.0
    assert governor.budget() == 8


def test_record_validates_and_ignores_empty_rounds():
    governor = make_governor()
    governor.record(0, 0)
    assert governor.rounds_recorded == 0
    assert governor.acceptance_rate is None
    for drafted, accepted in [(2, 3), (-1, 0), (2, -1)]:
        with pytest.raises(ValueError):
            governor.record(drafted, accepted)


def test_reset_clears_history():
    governor = make_governor(policy="gated")
    record_many(governor, 8, drafted=8, accepted=0)
    governor.reset()
    assert governor.rounds_recorded == 0
    assert governor.budget() == 8


def test_a_retracted_probe_is_offered_again():
    """A probe whose proposal was never verified (retracted) goes back: the next call grants it again,
    not one ``probe_interval`` later; a verified probe is spent."""
    config = PromptLookupConfig(policy="gated", probe_interval=3, probe_draft=2)
    governor = DraftGovernor(config)
    for _ in range(4):
        governor.record(8, 0)  # off
    assert [governor.budget() for _ in range(3)] == [0, 0, 2]
    assert governor.probe_granted
    governor.return_probe()
    assert not governor.probe_granted
    assert governor.peek_budget() == 2 and governor.budget() == 2
    governor.record(2, 0)  # verified: spent
    assert not governor.probe_granted
    governor.return_probe()  # nothing to give back now
    assert [governor.budget() for _ in range(3)] == [0, 0, 2]
    governor.return_probe()
    governor.return_probe()  # only the last grant can go back
    assert [governor.budget() for _ in range(3)] == [2, 0, 0]


def test_expected_accepted_trusts_a_long_match_more_until_rounds_say_otherwise():
    governor = DraftGovernor(PromptLookupConfig())
    short, long = governor.expected_accepted(8), governor.expected_accepted(8, long_match=True)
    assert 1.5 < short < 2.0 and 5.0 < long < 6.0  # p = 2/3 and 0.9 before any round
    for _ in range(8):
        governor.record(8, 0)  # every draft rejected at once
    assert governor.expected_accepted(8, long_match=True) < 1.0
    assert governor.expected_accepted(0) == 0.0
