"""A prompt-lookup row's pacing: pauses after declines, the look at a loss, quiet ticks."""

from __future__ import annotations

from mlxd_drafters.pacing import (
    DECLINE_PAUSE_TOKENS,
    EXPLORE_AFTER_DECLINED_TOKENS,
    LONG_MATCH_DECLINE_PAUSE,
    DraftPacing,
)


def test_declines_pause_longer_each_time_and_a_verify_ends_them():
    pacing = DraftPacing()
    assert pacing.may_propose(0)
    emitted = 10
    for pause in DECLINE_PAUSE_TOKENS + (DECLINE_PAUSE_TOKENS[-1],):
        pacing.declined(emitted, long_match=False)
        assert not pacing.may_propose(emitted + pause - 1) and pacing.may_propose(emitted + pause)
        emitted += pause
    assert pacing.declined_since == 10
    pacing.verified()
    pacing.declined(emitted, long_match=False)
    assert pacing.drafts_from == emitted + DECLINE_PAUSE_TOKENS[0]  # the pauses start over
    assert pacing.declined_since == emitted


def test_a_declined_long_match_is_asked_again_at_once_and_a_long_decline_is_worth_a_look():
    pacing = DraftPacing()
    pacing.declined(5, long_match=True)
    assert pacing.drafts_from == 5 + LONG_MATCH_DECLINE_PAUSE
    assert not pacing.worth_a_look(5 + EXPLORE_AFTER_DECLINED_TOKENS - 1)
    assert pacing.worth_a_look(5 + EXPLORE_AFTER_DECLINED_TOKENS)
    pacing.verified()
    assert not pacing.worth_a_look(1000)


def test_quiet_ticks_count_until_a_proposal():
    pacing = DraftPacing()
    for _ in range(3):
        pacing.quiet_tick()
    assert pacing.quiet_ticks == 3
    pacing.proposed()
    assert pacing.quiet_ticks == 0
