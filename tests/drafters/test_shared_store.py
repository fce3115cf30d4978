"""The shared draft store: earlier requests' tokens, longest-suffix lookup, drafts sized by continuation counts."""

from __future__ import annotations

import doctest

import pytest

import mlxd_drafters.shared_store as shared_store_module
from mlxd_drafters import (
    PromptLookupConfig,
    PromptLookupDrafter,
    SharedDraft,
    SharedDraftStore,
    SharedDraftStores,
    SharedStoreConfig,
)


def test_module_example():
    assert doctest.testmod(shared_store_module).failed == 0


def test_longest_suffix_wins_and_the_draft_runs_to_the_document_end():
    store = SharedDraftStore(SharedStoreConfig(min_ngram=2, max_ngram=4))
    store.add([1, 2, 3, 4, 50, 51])
    store.add([9, 3, 4, 60, 61, 62])  # (3, 4) newer here, but (2, 3, 4) matches longer in the first
    draft = store.lookup([7, 2, 3, 4], 10)
    assert draft.match_length == 3 and draft.tokens == (50, 51)
    draft = store.lookup([8, 8, 3, 4], 10)  # only (3, 4): two occurrences, 50 vs 60 (1:1) -> nothing
    assert draft.match_length == 2 and draft.tokens == ()
    assert store.lookup([5, 6], 4).tokens == ()
    assert not store.has_match([5, 6]) and store.has_match([3, 4])
    assert store.would_draft([7, 2, 3, 4]) and not store.would_draft([8, 8, 3, 4])  # a match, a 1:1 split


def test_a_store_match_that_splits_at_once_lets_plain_decode_pipeline():
    """pipelines_plain_rounds asks whether the store would draft a token, not whether it has a match: a
    phrase earlier replies continued two ways drafts nothing and must not hold the lookahead step back."""
    store = SharedDraftStore(SharedStoreConfig(min_ngram=2, max_ngram=4))
    store.add([3, 4, 60, 61])
    store.add([3, 4, 70, 71])
    drafter = PromptLookupDrafter(PromptLookupConfig(max_draft=4), shared=store)
    drafter.prime([1, 2, 3, 4])
    assert store.has_match([1, 2, 3, 4]) and drafter.draft_block() == []
    assert drafter.pipelines_plain_rounds() is True
    drafter.observe([60])  # (3, 4, 60) was continued one way only
    assert drafter.pipelines_plain_rounds() is False
    assert drafter.draft_block() == [61]


def test_continuation_counts_size_the_draft():
    store = SharedDraftStore(SharedStoreConfig(min_ngram=2, max_ngram=2, min_probability=0.6))
    for _ in range(2):
        store.add([1, 2, 3, 4, 5, 6])
    store.add([1, 2, 3, 4, 9, 9])
    draft = store.lookup([1, 2], 8)  # 3, 4 unanimous (3/3); then 5 (2 of 3): p = 0.67; then 6 (2/2)
    assert draft.tokens == (3, 4, 5, 6)
    assert draft.probability == pytest.approx(2 / 3)
    store.add([1, 2, 3, 4, 9, 9])  # now 5 vs 9 is 2:2 -> stop before it
    assert store.lookup([1, 2], 8).tokens == (3, 4)
    assert store.lookup([1, 2], 1).tokens == (3,)  # never past max_tokens
    assert store.lookup([1, 2], 0).tokens == ()


def test_a_short_match_drafts_little():
    store = SharedDraftStore(SharedStoreConfig(min_ngram=2, max_ngram=6, draft_per_match=2.0))
    store.add(list(range(100, 130)))
    assert store.lookup([0, 100, 101], 15).tokens == tuple(range(102, 106))  # 2 matched: at most 4
    assert store.lookup([102, 103, 104, 105, 106, 107], 15).tokens == tuple(range(108, 120))  # 6: 12
    assert store.lookup([0, 100, 101], 3).tokens == (102, 103, 104)  # and never past max_tokens


def test_no_ngram_spans_two_documents_and_drafts_stop_at_a_document_end():
    store = SharedDraftStore(SharedStoreConfig(min_ngram=2, max_ngram=3))
    store.add([1, 2, 3])
    store.add([4, 5, 6])
    assert not store.has_match([3, 4])  # 3 ends one document, 4 starts the next
    assert store.lookup([1, 2], 8).tokens == (3,)  # not on into the next document


def test_budget_evicts_the_oldest_documents_and_their_index_entries():
    store = SharedDraftStore(SharedStoreConfig(max_tokens=10, min_ngram=2, max_ngram=2))
    store.add([1, 2, 3, 4])
    store.add([5, 6, 7, 8])
    assert store.token_count == 8 and store.document_count == 2
    store.add([9, 10, 11])  # 11 > 10: the first document goes
    assert store.token_count == 7 and store.documents_evicted == 1
    assert store.lookup([1, 2], 4).tokens == ()
    assert store.lookup([5, 6], 4).tokens == (7, 8)
    assert store.lookup([9, 10], 4).tokens == (11,)
    held = store._ends.values()  # noqa: SLF001
    assert all(end >= store._base for ends in held for end in ([ends] if isinstance(ends, int) else ends))  # noqa: SLF001
    store.add(list(range(100, 130)))  # longer than the budget: its last 10 tokens, alone
    assert store.token_count == 10 and store.document_count == 1
    assert store.lookup([125, 126], 8).tokens == (127, 128, 129)
    assert len(store._ends) == 8  # noqa: SLF001 - the kept document's bigrams with a next token


def test_occurrences_per_ngram_are_capped_to_the_most_recent():
    store = SharedDraftStore(SharedStoreConfig(min_ngram=2, max_ngram=2, max_occurrences=2))
    store.add([1, 2, 7, 7])
    store.add([1, 2, 8, 8])
    store.add([1, 2, 8, 8])
    assert store.lookup([1, 2], 3).tokens == (8, 8)  # the 7 was forgotten: 2 of 2 say 8


def test_a_hash_collision_is_not_a_match(monkeypatch):
    store = SharedDraftStore(SharedStoreConfig(min_ngram=2, max_ngram=2))
    store.add([1, 2, 3])
    monkeypatch.setattr(shared_store_module, "hash", lambda _: 0, raising=False)  # every n-gram collides
    store.add([4, 5, 6])
    assert store.lookup([4, 5], 4).tokens == (6,)
    assert store.lookup([9, 9], 4).tokens == ()


def test_stores_are_per_key_and_bounded():
    stores = SharedDraftStores(SharedStoreConfig(min_ngram=2, max_ngram=2, max_stores=2))
    stores.add("alice", [0, 1], [1, 2, 3, 4])
    assert stores.store("alice").lookup([2, 3], 4).tokens == (4,)
    assert stores.store("bob").lookup([2, 3], 4).tokens == ()  # nothing of alice's drafts for bob
    assert stores.store(None).lookup([2, 3], 4).tokens == ()  # three keys: alice (least recent) dropped
    assert len(stores) == 2
    assert stores.store("alice").token_count == 0
    assert stores.summary() == {"stores": 2, "tokens": 0, "documents": 0}


def test_documents_lead_with_the_prompt_tail_or_the_whole_prompt():
    stores = SharedDraftStores(SharedStoreConfig(min_ngram=2, max_ngram=2))
    stores.add(None, [10, 11, 12, 13], [20, 21])
    assert stores.store(None).lookup([12, 13], 4).tokens == (20, 21)  # a reply's start is found
    assert stores.store(None).lookup([10, 11], 4).tokens == ()  # the rest of the prompt is not kept
    with_prompts = SharedDraftStores(SharedStoreConfig(min_ngram=2, max_ngram=2, include_prompts=True))
    with_prompts.add(None, [10, 11, 12, 13], [20, 21])
    assert with_prompts.store(None).lookup([10, 11], 4).tokens == (12, 13, 20, 21)


def test_config_is_validated():
    for bad in (
        {"max_tokens": 0},
        {"min_ngram": 0},
        {"min_ngram": 3, "max_ngram": 2},
        {"max_occurrences": 0},
        {"min_probability": 0.0},
        {"max_stores": 0},
        {"draft_per_match": 0.0},
    ):
        with pytest.raises(ValueError):
            SharedStoreConfig(**bad)


# -- the drafter with a shared store -----------------------------------------------------------------


def test_drafter_asks_the_store_when_its_own_context_has_no_match():
    store = SharedDraftStore(SharedStoreConfig(min_ngram=2, max_ngram=4))
    store.add([30, 31, 32, 33, 34, 35])
    drafter = PromptLookupDrafter(PromptLookupConfig(max_draft=4, policy="always"), shared=store)
    drafter.prime([1, 2, 3, 30, 31])
    assert drafter.pipelines_plain_rounds() is False  # the store has a match
    assert drafter.draft_block() == [32, 33, 34, 35]
    assert drafter.outstanding_source == "shared"
    drafter.accept_verified_tokens(4, 4)
    assert drafter.outstanding_source is None


def test_the_longer_match_wins_and_a_tie_goes_to_the_own_context():
    store = SharedDraftStore(SharedStoreConfig(min_ngram=2, max_ngram=4))
    store.add([7, 8, 9, 50, 51])
    drafter = PromptLookupDrafter(PromptLookupConfig(max_draft=2, policy="always"), shared=store)
    drafter.prime([9, 60, 61, 7, 8, 9])  # own: (9) ends at 0 -> 60, 61 (length 1); store: (7, 8, 9), longer
    assert drafter.draft_block() == [50, 51]
    assert drafter.outstanding_source == "shared"
    drafter.retract_draft()
    tie = PromptLookupDrafter(PromptLookupConfig(max_draft=2, policy="always"), shared=store)
    tie.prime([8, 9, 60, 61, 8, 9])  # own (8, 9) -> 60, 61; the store's (8, 9) is no longer
    assert tie.draft_block() == [60, 61]
    assert tie.outstanding_source == "prompt"


def test_a_longer_store_match_expected_to_do_worse_leaves_the_own_draft():
    """A store draft replacing an own one that its governor expects more of would cost the row that draft
    where the gate declines the store's (it did on a copying model: code_notes#source-choice)."""
    store = SharedDraftStore(SharedStoreConfig(min_ngram=2, max_ngram=4))
    store.add([7, 8, 9, 50, 51])
    drafter = PromptLookupDrafter(PromptLookupConfig(max_draft=2, policy="always"), shared=store)
    for _ in range(4):
        drafter.shared_governor.record(2, 0)  # the store's drafts were all rejected in this request
    drafter.prime([9, 60, 61, 7, 8, 9])  # own (9) -> 60, 61; store (7, 8, 9) -> 50, 51: longer, but expected less
    assert drafter.draft_block() == [60, 61]
    assert drafter.outstanding_source == "prompt"
    assert drafter.shared_governor.expected_accepted(2) < drafter.governor.expected_accepted(2)


def test_own_sources_are_told_apart():
    drafter = PromptLookupDrafter(PromptLookupConfig(max_draft=2, policy="always"))
    drafter.prime([1, 2, 3, 1, 2])
    assert drafter.draft_block() == [3, 1]
    assert drafter.outstanding_source == "prompt"
    drafter.accept_verified_tokens(2, 0)
    drafter.observe([40, 41, 42, 40])  # the output repeats its own start
    assert drafter.draft_block() == [41, 42]
    assert drafter.outstanding_source == "output"
    predicted = PromptLookupDrafter(PromptLookupConfig(max_draft=2, policy="always"), prediction=[5, 6, 7])
    predicted.prime([0, 5])
    assert predicted.draft_block() == [6, 7]
    assert predicted.outstanding_source == "prediction"


def test_the_store_has_a_governor_of_its_own():
    """Rejected store drafts shut the store's drafts off, not the request's own; each proposal's expected
    acceptance comes from its source's governor."""
    store = SharedDraftStore(SharedStoreConfig(min_ngram=2, max_ngram=4))
    store.add(list(range(70, 90)))
    config = PromptLookupConfig(max_draft=4, probe_interval=1000)
    drafter = PromptLookupDrafter(config, shared=store)
    drafter.prime([1, 2, 3, 1, 2, 3, 1])  # its own context repeats: (3, 1) -> 2, 3, 1, 2
    for i in range(4):  # the store's drafts are rejected at their first token
        drafter.observe([70 + 2 * i, 71 + 2 * i])
        assert drafter.draft_block() == [72 + 2 * i, 73 + 2 * i, 74 + 2 * i, 75 + 2 * i]
        assert drafter.outstanding_source == "shared"
        drafter.accept_verified_tokens(4, 0)
        drafter.observe([99])
    assert drafter.shared_governor.is_off and not drafter.governor.is_off
    drafter.observe([80, 81])
    assert drafter.draft_block() == []  # the store's governor grants nothing now
    assert drafter.last_budget == 4  # ... but the own governor did (its context had no match)
    drafter.observe([1, 2, 3])
    assert len(drafter.draft_block()) == 4  # the own context's match keeps its whole budget
    assert drafter.outstanding_source == "prompt"
    assert drafter.acceptance_estimate() == drafter.governor.acceptance_estimate(False)
    assert drafter.expected_accepted(4) > 1.0  # the own governor has seen no round: its prior


def test_the_store_drafts_while_the_own_governor_is_off():
    store = SharedDraftStore(SharedStoreConfig(min_ngram=2, max_ngram=4))
    store.add([70, 71, 72, 73, 74, 75])
    drafter = PromptLookupDrafter(PromptLookupConfig(max_draft=3, probe_interval=1000), shared=store)
    drafter.prime([5, 6, 7, 5, 6])
    for i in range(4):  # its own drafts are rejected
        assert drafter.draft_block() != []
        assert drafter.outstanding_source in ("prompt", "output")
        drafter.accept_verified_tokens(len(drafter.outstanding_draft), 0)
        drafter.observe([90 + i, 5, 6])
    assert drafter.governor.is_off and not drafter.shared_governor.is_off
    drafter.observe([70, 71])
    assert drafter.draft_block() == [72, 73, 74]
    assert drafter.outstanding_source == "shared"
    shared_prior = drafter.shared_governor.acceptance_estimate(False)
    assert drafter.acceptance_estimate() == shared_prior > drafter.governor.acceptance_estimate(False)
    drafter.retract_draft()  # declined: scored against what follows, into the store's governor
    drafter.observe([72, 0])
    assert drafter.shared_governor.history == ((2, 1),)
    assert len(drafter.governor.history) == 4


def test_a_store_match_is_long_only_with_two_occurrences_behind_it():
    """The gate's copy prior goes to a store proposal whose match has the drafter's max_ngram tokens and whose
    first token at least LONG_MATCH_SUPPORT earlier occurrences continued with; one seen once gets the plain
    prior (a phrase two replies share by chance)."""
    store = SharedDraftStore(SharedStoreConfig(min_ngram=2, max_ngram=6))
    store.add([1, 2, 3, 4, 5, 60, 61])
    config = PromptLookupConfig(max_draft=2, policy="always", max_ngram=4)
    once = PromptLookupDrafter(config, shared=store)
    once.prime([9, 1, 2, 3, 4, 5])
    assert once.draft_block() == [60, 61] and once.outstanding_source == "shared"
    assert store.lookup([1, 2, 3, 4, 5], 2).support == 1
    assert not once.last_match_is_long
    assert once.acceptance_estimate() == once.shared_governor.acceptance_estimate(False)
    store.add([1, 2, 3, 4, 5, 60, 62])  # a second occurrence agrees on 60 (then splits 1:1)
    assert store.lookup([1, 2, 3, 4, 5], 2) == SharedDraft(5, (60,), 1.0, 2)
    twice = PromptLookupDrafter(config, shared=store)
    twice.prime([9, 1, 2, 3, 4, 5])
    assert twice.draft_block() == [60]
    assert twice.last_match_is_long
    assert twice.acceptance_estimate() == twice.shared_governor.acceptance_estimate(True)
    short = PromptLookupDrafter(config, shared=store)
    short.prime([9, 8, 4, 5])  # (4, 5): two occurrences, but a 2-token match
    assert short.draft_block() == [60]
    assert not short.last_match_is_long


def test_without_a_store_nothing_changes():
    drafter = PromptLookupDrafter(PromptLookupConfig(max_draft=4, policy="always"))
    drafter.prime([1, 2, 3, 30, 31])
    assert drafter.draft_block() == []
    assert drafter.pipelines_plain_rounds() is True


def test_the_budget_bounds_all_stores_together_least_recently_used_first():
    stores = SharedDraftStores(SharedStoreConfig(max_tokens=10, min_ngram=2, max_ngram=2))
    stores.add("alice", [0, 1], [1, 2, 3, 4])  # 6 tokens (the prompt's last 2 lead)
    stores.add("bob", [0, 1], [5, 6, 7, 8])  # 12 > 10: alice's oldest goes, not bob's new one
    assert stores.store("alice").token_count == 0
    assert stores.store("bob").lookup([5, 6], 4).tokens == (7, 8)
    assert stores.summary()["tokens"] == 6
    stores.add("bob", [0, 1], [9, 10, 11, 12])  # alone, bob's store evicts its own oldest
    assert stores.summary() == {"stores": 2, "tokens": 6, "documents": 1}


def test_single_and_repeated_occurrences_survive_eviction_alike():
    store = SharedDraftStore(SharedStoreConfig(max_tokens=12, min_ngram=2, max_ngram=2))
    store.add([1, 2, 3, 4])
    store.add([1, 2, 3, 5])  # (1, 2) now has two occurrences
    store.add([1, 2, 9, 9])  # and three
    assert store.lookup([1, 2], 2).tokens == (3,)  # 2 of 3 say 3, then 4 vs 5 (1:1)
    store.add([7, 1, 2, 9])  # 16 > 12: the first document goes, (1, 2) keeps two newer ends
    assert store.evict_oldest() == 4  # the second too
    assert store.lookup([1, 2], 2).tokens == (9, 9)
    assert store.evict_oldest() == 4 and store.lookup([1, 2], 2).tokens == (9,)
    assert store.evict_oldest() == 4 and store.evict_oldest() == 0
    assert store._ends == {}  # noqa: SLF001 - every entry went with its document
