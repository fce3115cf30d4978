"""A predicted output as a draft source: matched by the context's suffix, followed in order."""

from __future__ import annotations

from mlxd_drafters import PromptLookupConfig, PromptLookupDrafter
from mlxd_drafters.prediction import PredictionSource


def test_proposes_what_follows_the_suffix_and_keeps_its_place():
    # the line "1 2 3" appears twice: the cursor picks the occurrence the reply has reached
    source = PredictionSource([1, 2, 3, 9, 1, 2, 3, 8, 7], max_ngram=2)
    assert source.propose([5, 1], 2) == [2, 3]
    source.record(2)
    assert source.propose([1, 2, 3], 3) == [9, 1, 2]
    source.record(3)
    assert source.propose([9, 1, 2], 2) == [3, 8]  # the second "1 2", where the reply is
    source.record(1)
    assert source.accepted == 6 and source.rejected == 3
    assert source.propose([42], 4) == []


def test_the_drafter_tries_the_prediction_first_then_the_context():
    drafter = PromptLookupDrafter(PromptLookupConfig(max_draft=3), prediction=[10, 11, 12, 13])
    drafter.observe([5, 6, 7, 5, 6, 10])
    assert drafter.draft_block() == [11, 12, 13]  # from the prediction
    drafter.accept_verified_tokens(3, 1)
    drafter.observe([11, 99])
    drafter.observe([5])
    assert drafter.draft_block() == [6, 10, 11]  # no prediction match for "99 5": the context's latest "5"
    drafter.retract_draft()
    assert drafter.prediction.accepted == 1
