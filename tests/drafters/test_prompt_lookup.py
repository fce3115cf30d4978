"""Tests for PromptLookupDrafter, PromptLookupStats and PromptLookupConfig."""

import dataclasses

import pytest

from mlxd_drafters import KNOWN_POLICIES, PromptLookupConfig, PromptLookupDrafter

# "def f ( x ) :" twice; the suffix "def f" matches the first occurrence.
REPEATING_CONTEXT = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 99, 10, 11]


def make_drafter(context=REPEATING_CONTEXT, **overrides) -> PromptLookupDrafter:
    drafter = PromptLookupDrafter(PromptLookupConfig(**overrides))
    drafter.observe(context)
    return drafter


def shut_off(drafter: PromptLookupDrafter) -> None:
    for _ in range(drafter.config.governor_window):
        drafter.accept_verified_tokens(n_drafted=4, n_accepted=0)


def test_docstring_example():
    drafter = PromptLookupDrafter(PromptLookupConfig(max_draft=3))
    drafter.observe([5, 6, 7, 8, 9, 5, 6])
    assert drafter.draft_block() == [7, 8, 9]
    drafter.accept_verified_tokens(n_drafted=3, n_accepted=2)
    drafter.observe([7, 8, 0])
    assert drafter.stats.accepted_per_verify == 2.0
    assert drafter.context_length == 10


def test_draft_block_respects_max_draft():
    drafter = make_drafter(max_draft=3)
    assert drafter.draft_block() == [12, 13, 14]
    assert drafter.stats.proposals == 1
    assert drafter.stats.drafted_tokens == 3


def test_draft_block_respects_governor_budget():
    drafter = make_drafter(policy="graded", governor_window=4)
    for _ in range(4):
        drafter.accept_verified_tokens(n_drafted=8, n_accepted=2)
    assert drafter.governor.peek_budget() == 3
    assert drafter.draft_block() == [12, 13, 14]


def test_no_proposal_on_unique_context_counts_nothing():
    drafter = make_drafter(context=list(range(50)))
    assert drafter.draft_block() == []
    assert drafter.stats.proposals == 0
    assert drafter.stats.drafted_tokens == 0
    assert drafter.outstanding_draft is None


def test_no_proposal_when_governor_off():
    drafter = make_drafter(policy="gated", probe_interval=100)
    shut_off(drafter)
    assert drafter.draft_block() == []
    assert drafter.stats.proposals == 0


def test_retract_records_no_miss_and_leaves_governor_unchanged():
    drafter = make_drafter(max_draft=4)
    drafter.accept_verified_tokens(n_drafted=2, n_accepted=1)
    history_before = drafter.governor.history
    stats_before = dataclasses.replace(drafter.stats)
    assert drafter.draft_block() == [12, 13, 14, 15]
    drafter.retract_draft()
    assert drafter.governor.history == history_before
    assert drafter.stats.misses == stats_before.misses
    assert drafter.stats.verify_rounds == stats_before.verify_rounds
    assert drafter.stats.proposals == stats_before.proposals
    assert drafter.stats.drafted_tokens == stats_before.drafted_tokens
    assert drafter.stats.retracted == 1
    assert drafter.outstanding_draft is None
    drafter.retract_draft()  # nothing outstanding: no-op
    assert drafter.stats.retracted == 1


def test_a_retracted_draft_is_scored_against_the_tokens_that_follow_it():
    """A declined draft teaches the governor what a verify would have accepted: it is compared with the
    committed tokens that follow it, and the round ends at its first mismatch or at its end."""
    drafter = make_drafter(max_draft=4)
    assert drafter.draft_block() == [12, 13, 14, 15]
    drafter.retract_draft()
    drafter.observe([12, 13])
    assert drafter.governor.history == ()  # still open: no mismatch yet, not at its end
    drafter.observe([99, 5])
    assert drafter.governor.history == ((3, 2),)  # rejected at its third token
    assert drafter.stats.scored_rounds == 1 and drafter.stats.misses == 0 and drafter.stats.verify_rounds == 0

    drafter = make_drafter(max_draft=4)
    drafter.draft_block()
    drafter.retract_draft()
    drafter.observe([12, 13, 14, 15, 16])
    assert drafter.governor.history == ((4, 4),)  # all of it matched


def test_a_score_still_open_at_the_next_draft_counts_what_matched_so_far():
    drafter = make_drafter(max_draft=4)
    drafter.draft_block()
    drafter.retract_draft()
    drafter.observe([12])
    drafter.draft_block()  # the next proposal settles the open score: one token matched, no rejection seen
    assert drafter.governor.history == ((1, 1),)
    drafter.retract_draft()
    drafter.draft_block()  # nothing observed in between: nothing to record
    assert drafter.governor.history == ((1, 1),)


def test_second_draft_block_retracts_unresolved_proposal():
    drafter = make_drafter(max_draft=2)
    drafter.draft_block()
    drafter.draft_block()
    assert drafter.stats.proposals == 1
    assert drafter.stats.drafted_tokens == 2
    assert drafter.stats.retracted == 1


def test_accept_verified_tokens_counts_rounds_and_misses():
    drafter = make_drafter(max_draft=3)
    drafter.draft_block()
    drafter.accept_verified_tokens(n_drafted=3, n_accepted=0)
    drafter.observe([50])
    drafter.observe([10, 11])
    drafter.draft_block()
    drafter.accept_verified_tokens(n_drafted=3, n_accepted=3)
    stats = drafter.stats
    assert (stats.verify_rounds, stats.misses, stats.accepted_tokens) == (2, 1, 3)
    assert stats.proposals == 2 and stats.drafted_tokens == 6
    assert stats.acceptance_rate == 0.5
    assert stats.accepted_per_verify == 1.5
    assert drafter.governor.history == ((3, 0), (3, 3))
    assert drafter.outstanding_draft is None


def test_trimmed_verification_corrects_drafted_tokens():
    drafter = make_drafter(max_draft=4)
    drafter.draft_block()
    drafter.accept_verified_tokens(n_drafted=2, n_accepted=2)
    assert drafter.stats.drafted_tokens == 2
    assert drafter.stats.acceptance_rate == 1.0


def test_accept_verified_tokens_validates_counts():
    drafter = make_drafter()
    with pytest.raises(ValueError):
        drafter.accept_verified_tokens(n_drafted=2, n_accepted=3)
    assert drafter.stats.verify_rounds == 0


def test_returned_proposal_is_callers_copy():
    drafter = make_drafter(max_draft=2)
    proposal = drafter.draft_block()
    proposal.clear()
    assert drafter.outstanding_draft == [12, 13]


def test_pipelines_plain_rounds():
    assert make_drafter(context=list(range(30))).pipelines_plain_rounds()
    assert not make_drafter().pipelines_plain_rounds()


def test_pipelines_plain_rounds_when_governor_off_except_probe_round():
    drafter = make_drafter(policy="gated", probe_interval=3)
    shut_off(drafter)
    assert drafter.pipelines_plain_rounds()
    assert drafter.pipelines_plain_rounds()  # peeking does not advance probes
    assert drafter.draft_block() == []
    assert drafter.draft_block() == []
    # The next budget() call is a probe, and the context matches.
    assert not drafter.pipelines_plain_rounds()
    assert drafter.draft_block() == [12, 13]
    assert drafter.stats.proposals == 1


def test_stats_as_dict():
    drafter = make_drafter(max_draft=2)
    drafter.draft_block()
    drafter.accept_verified_tokens(n_drafted=2, n_accepted=1)
    assert drafter.stats.as_dict() == {
        "proposals": 1,
        "drafted_tokens": 2,
        "accepted_tokens": 1,
        "verify_rounds": 1,
        "misses": 0,
        "retracted": 0,
        "scored_rounds": 0,
        "accepted_per_verify": 1.0,
        "acceptance_rate": 0.5,
    }


def test_empty_stats_rates_are_zero():
    stats = PromptLookupDrafter().stats
    assert stats.acceptance_rate == 0.0
    assert stats.accepted_per_verify == 0.0


def test_config_defaults():
    config = PromptLookupConfig()
    assert (config.max_draft, config.min_ngram, config.max_ngram) == (15, 1, 4)
    assert config.policy == "graded"
    assert (config.governor_window, config.probe_interval, config.min_draft) == (
        8,
        16,
        1,
    )
    assert config.gated_cutoff == config.graded_cutoff == 0.2
    assert config.probe_budget == 2


def test_config_rejects_unknown_policy_listing_known_ones():
    with pytest.raises(ValueError) as error:
        PromptLookupConfig(policy="sometimes")
    for policy in KNOWN_POLICIES:
        assert policy in str(error.value)


@pytest.mark.parametrize(
    "overrides",
    [
        {"max_draft": 0},
        {"min_ngram": 0},
        {"min_ngram": 3, "max_ngram": 2},
        {"governor_window": 0},
        {"gated_cutoff": 1.5},
        {"graded_cutoff": -0.1},
        {"probe_interval": 0},
        {"probe_draft": 0},
        {"min_draft": 0},
        {"min_draft": 16},
        {"max_draft": 8, "min_draft": 9},
    ],
)
def test_config_rejects_invalid_values(overrides):
    with pytest.raises(ValueError):
        PromptLookupConfig(**overrides)


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        PromptLookupConfig().max_draft = 3  # type: ignore[misc]


def test_with_max_draft_clamps_and_copies():
    config = PromptLookupConfig(max_draft=6, min_draft=4)
    assert config.with_max_draft(20).max_draft == 6
    lowered = config.with_max_draft(3)
    assert (lowered.max_draft, lowered.min_draft) == (3, 3)
    assert (config.max_draft, config.min_draft) == (6, 4)
    with pytest.raises(ValueError):
        config.with_max_draft(0)
