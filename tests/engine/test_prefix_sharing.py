"""Prefix sharing on paged storage: cache entries and the sequences started from them share blocks.

A finished sequence's entry holds references on its blocks (no copy); a hit puts the entry's whole blocks
into the new table by reference and copies a partly reused last block (copy-on-write). These tests check
the block tables and reference counts directly, that no shared block is ever written (the entry's K/V
stay bit-identical through appends, verify rounds and unwinds), that eviction frees a block only when its
last reference goes, that an admission evicts entries for room before it is refused, and that outputs
equal a cold prefill's.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlxd_engine import Engine, KVStorageFull, prefill_and_record, step_and_record
from mlxd_engine.storage.paged_kv_storage import SharedPrefix
from mlxd_scheduler.single_sequence import generate_plain, generate_with_prompt_lookup

BLOCK = 16
BUDGET = 64 * 2**20
FIRST = [(7 * i + 3) % 200 + 1 for i in range(40)]  # 40 tokens: blocks 0-1 whole, block 2 partly filled


def _paged(model, pool=2048, budget=BUDGET, max_sequences=2, **kwargs):
    return Engine(
        model,
        max_sequences=max_sequences,
        storage="paged",
        kv_block_size=BLOCK,
        kv_pool_tokens=pool,
        max_kv_size=256,
        prefix_cache_bytes=budget,
        **kwargs,
    )


def _turn(engine, tokens, n=12, lookup=False):
    run = generate_with_prompt_lookup if lookup else generate_plain
    return run(engine, tokens, n).tokens


def _only_entry(engine):
    (entry,) = engine.prefix_cache._entries.values()
    assert isinstance(entry.snapshot, SharedPrefix)
    return entry


def _blocks_kv(storage, blocks):
    """Every layer's keys and values in ``blocks``, evaluated (to compare before and after)."""
    index = mx.array(list(blocks))
    arrays = [a[index] for layer in range(storage.n_layers) for a in (storage.keys[layer], storage.values[layer])]
    mx.eval(arrays)
    return arrays


def _refs(storage, blocks):
    return [int(storage._refs[b]) for b in blocks]


def _check_counts(engine):
    """Every block's count is the tables and cache entries holding it; the free list is the blocks at 0."""
    storage = engine.storage
    expected = np.zeros(storage.n_blocks, dtype=np.int64)
    cached = np.zeros(storage.n_blocks, dtype=np.int64)
    for state in storage.sequences:
        np.add.at(expected, state.blocks, 1)
    for entry in engine.prefix_cache._entries.values():
        np.add.at(expected, list(entry.snapshot.blocks), 1)
        np.add.at(cached, list(entry.snapshot.blocks), 1)
    assert (storage._refs == expected).all() and (storage._snapshot_refs == cached).all()
    assert sorted(storage._free) == [b for b in range(storage.n_blocks) if expected[b] == 0]


def test_an_entry_references_the_finished_sequences_blocks_without_copying(embedded_model):
    engine = _paged(embedded_model)
    storage = engine.storage
    seq = engine.add_sequence(FIRST, max_new_tokens=8)
    prefill_and_record(engine, seq)
    for _ in range(3):
        step_and_record(engine, [seq])
    table, end = list(seq.kv.blocks), seq.kv.committed  # 43 tokens in storage
    before = _blocks_kv(storage, table)
    engine.release(seq)
    entry = _only_entry(engine)
    assert entry.snapshot.blocks == tuple(table[: -(-end // BLOCK)]) and entry.snapshot.tokens == end
    assert entry.nbytes == len(entry.snapshot.blocks) * storage.bytes_per_block() <= engine.prefix_cache.budget_bytes
    assert _refs(storage, entry.snapshot.blocks) == [1, 1, 1]  # the cache's reference only
    usage = storage.usage()
    assert usage["blocks_used"] == usage["blocks_cached"] == usage["blocks_cache_only"] == 3
    assert usage["blocks_reserved"] == 0 and usage["blocks_shared"] == 0
    assert all(mx.array_equal(a, b).item() for a, b in zip(before, _blocks_kv(storage, table)))


@pytest.mark.parametrize("reused", [37, 32])  # inside block 2 (copy-on-write) / at the end of block 1
def test_a_hit_shares_whole_blocks_and_copies_a_partly_reused_last_block(embedded_model, reused):
    engine = _paged(embedded_model)
    storage = engine.storage
    _turn(engine, FIRST, 4)
    entry = _only_entry(engine)
    shared = entry.snapshot.blocks[: reused // BLOCK]
    free_before = storage.free_blocks
    prompt = FIRST[:reused] + [250, 251, 252]
    seq = engine.add_sequence(prompt, max_new_tokens=20)
    assert seq.cached_tokens == reused and seq.kv.shared == len(shared) == 2
    assert seq.kv.blocks[:2] == list(shared) and _refs(storage, shared) == [2, 2]
    # the reservation covers prompt + max_new less the shared blocks
    assert seq.kv.reserved_blocks == -(-(len(prompt) + 20) // BLOCK) - 2
    if reused % BLOCK:
        partial = entry.snapshot.blocks[2]
        assert len(seq.kv.blocks) == 3 and seq.kv.blocks[2] not in entry.snapshot.blocks
        assert _refs(storage, [partial, seq.kv.blocks[2]]) == [1, 1]
        assert storage.free_blocks == free_before - 1  # the copy's block, nothing for the shared ones
        offsets = reused % BLOCK
        for layer in range(storage.n_layers):
            for pool in (storage.keys[layer], storage.values[layer]):
                assert mx.array_equal(pool[seq.kv.blocks[2], :, :offsets], pool[partial, :, :offsets]).item()
    else:
        assert len(seq.kv.blocks) == 2 and storage.free_blocks == free_before
    assert storage.usage()["blocks_shared"] == 2
    _check_counts(engine)
    prefill_and_record(engine, seq)
    assert seq.kv.blocks[:2] == list(shared) and len(set(seq.kv.blocks)) == len(seq.kv.blocks)
    _check_counts(engine)
    engine.release(seq, keep_prefix=False)
    assert _refs(storage, shared) == [1, 1] and storage.usage()["blocks_reserved"] == 0


def test_appends_verify_and_unwind_after_a_shared_prefix_never_write_a_shared_block(embedded_model):
    engine = _paged(embedded_model)
    storage = engine.storage
    _turn(engine, FIRST, 4)
    entry = _only_entry(engine)
    before = _blocks_kv(storage, entry.snapshot.blocks)
    prompt = FIRST[:35] + [9, 8, 7]  # shares blocks 0-1, copies block 2
    seq = engine.add_sequence(prompt, max_new_tokens=40)
    prefill_and_record(engine, seq)
    for _ in range(3):
        step_and_record(engine, [seq])
        engine.verify(seq, [seq.tokens[-1]] + [5] * 20)  # past two block boundaries
        engine.unwind_appends(seq, 21)
    engine.verify(seq, [seq.tokens[-1], 4, 4])
    engine.commit_appends(seq, 1)
    engine.unwind_appends(seq, 2)
    assert seq.kv.blocks[:2] == list(entry.snapshot.blocks[:2]) and seq.kv.shared == 2
    _check_counts(engine)
    after = _blocks_kv(storage, entry.snapshot.blocks)
    assert all(mx.array_equal(a, b).item() for a, b in zip(before, after))  # the entry's K/V, bit for bit
    engine.release(seq, keep_prefix=False)
    # and a speculative run from the same entry equals a cold one
    cold = Engine(
        embedded_model, max_sequences=1, storage="paged", kv_block_size=BLOCK, kv_pool_tokens=2048, max_kv_size=256
    )
    assert _turn(engine, prompt, 24, lookup=True) == _turn(cold, prompt, 24, lookup=True)
    after = _blocks_kv(storage, entry.snapshot.blocks)
    assert all(mx.array_equal(a, b).item() for a, b in zip(before, after))


def test_appending_into_a_block_someone_else_holds_is_refused(embedded_model):
    """The guard behind copy-on-write: a snapshot of a running row's partly filled block makes its next
    append a write into a shared block, which ``reserve`` refuses."""
    engine = _paged(embedded_model)
    seq = engine.add_sequence(FIRST, max_new_tokens=8)
    prefill_and_record(engine, seq)
    snapshot = engine.storage.read_prefix(seq.kv, seq.kv.committed)  # 40 tokens: block 2 partly filled
    with pytest.raises(ValueError, match="shared"):
        step_and_record(engine, [seq])
    engine.storage.release_prefix(snapshot)
    step_and_record(engine, [seq])  # its own block again
    engine.release(seq, keep_prefix=False)


@pytest.mark.parametrize("lookup", [False, True])
def test_cached_equals_cold_with_shared_blocks(embedded_model, lookup):
    engine = _paged(embedded_model)
    cold = Engine(
        embedded_model, max_sequences=2, storage="paged", kv_block_size=BLOCK, kv_pool_tokens=2048, max_kv_size=256
    )
    output = _turn(engine, FIRST, 12, lookup)
    cases = {
        "hit": FIRST + output + [5, 9, 13],
        "at a block boundary": FIRST[:32] + [11, 12, 13],
        "inside a block": FIRST[:21] + [11, 12, 13],
        "exact": list(FIRST),
        "miss": [250 - t for t in FIRST[:30]],
    }
    for name, tokens in cases.items():
        assert _turn(engine, tokens, 16, lookup) == _turn(cold, tokens, 16, lookup), name
    stats = engine.prefix_cache.stats()
    assert stats["hits"] >= 4 and stats["bytes"] <= BUDGET


def test_eviction_frees_a_block_only_when_its_last_reference_goes(embedded_model):
    engine = _paged(embedded_model)
    storage = engine.storage
    _turn(engine, FIRST, 4)
    entry = _only_entry(engine)
    blocks = entry.snapshot.blocks  # 3 blocks (43 tokens)
    seq = engine.add_sequence(FIRST[:33] + [1, 2], max_new_tokens=10)  # shares blocks 0-1, copies block 2
    assert _refs(storage, blocks) == [2, 2, 1]
    engine.prefix_cache.clear()  # the entry goes: the running sequence keeps blocks 0-1
    assert entry.snapshot.released and _refs(storage, blocks) == [1, 1, 0]
    assert blocks[2] in storage._free and blocks[0] not in storage._free and blocks[1] not in storage._free
    prefill_and_record(engine, seq)
    engine.release(seq, keep_prefix=False)
    assert storage.free_blocks == storage.n_blocks and not storage._refs.any()
    assert sorted(storage._free) == list(range(storage.n_blocks))


def test_store_budget_holds_and_an_entry_over_it_gives_its_blocks_back(embedded_model):
    per_block = None
    engine = _paged(embedded_model)
    _turn(engine, FIRST, 4)
    per_block = engine.storage.bytes_per_block()
    # a budget of 4 blocks: a 3-block entry fits, two do not (the older goes), a 5-block one is not kept
    small = _paged(embedded_model, budget=4 * per_block)
    _turn(small, FIRST, 4)  # 43 tokens: 3 blocks
    _turn(small, [200 - t for t in FIRST], 4)  # another 3 blocks: the first entry is evicted
    assert len(small.prefix_cache) == 1 and small.prefix_cache.evictions == 1
    assert small.storage.usage()["blocks_cached"] == 3
    _turn(small, [100 + t % 50 for t in range(80)], 4)  # 83 tokens: 6 blocks, over the whole budget
    assert len(small.prefix_cache) == 1 and small.storage.usage()["blocks_cached"] == 3
    assert small.prefix_cache.stats()["bytes"] == 3 * per_block <= small.prefix_cache.budget_bytes
    assert small.storage.usage()["blocks_used"] == 3  # the refused entry's blocks went back


def test_an_admission_that_needs_the_caches_blocks_evicts_least_recently_used_first(embedded_model):
    # 24 blocks; three finished sequences leave 3 entries of 3 blocks each (9 blocks held by the cache only)
    engine = _paged(embedded_model, pool=24 * BLOCK, max_sequences=3)
    storage = engine.storage
    prompts = [[(t + 17 * i) % 200 + 1 for t in FIRST] for i in range(3)]
    for p in prompts:
        _turn(engine, p, 4)
    engine.prefix_cache.lookup(prompts[0] + [1])  # prompts[0] is now the most recently used
    assert storage.usage()["blocks_cache_only"] == 9 and storage.free_blocks == 15
    # a miss that needs 16 blocks: not admissible from the free list, admissible after evicting one entry
    assert not storage.can_admit(256) and engine.can_admit(100, 156)
    seq = engine.add_sequence([3] * 100, max_new_tokens=156)
    assert engine.prefix_cache.evictions == 1 and len(engine.prefix_cache) == 2
    remaining = {key[: len(FIRST)] for key in engine.prefix_cache._entries}
    assert remaining == {tuple(prompts[0]), tuple(prompts[2])}  # prompts[1], the least recently used, went
    assert storage.free_blocks == 18 and storage.usage()["blocks_reserved"] == 16
    # a hit while the pool is short: it needs 4 new blocks (6 less 2 shared), 2 are unreserved; the other entry
    # (the most recently used, but not the one hit) goes, the one hit stays and is shared
    hit = engine.add_sequence(prompts[2] + [1999, 1998], max_new_tokens=50)
    assert hit.cached_tokens == len(FIRST) and hit.kv.shared == 2 and hit.kv.reserved_blocks == 4
    assert [tuple(k[: len(FIRST)]) for k in engine.prefix_cache._entries] == [tuple(prompts[2])]
    assert engine.prefix_cache.evictions == 2
    # nothing more to free (the entry left shares its blocks with the hit but one) and no room: refused,
    # and the cache is left as it is
    assert storage.evictable_blocks() == 1 and not engine.can_admit(100, 60)
    with pytest.raises(KVStorageFull):
        engine.add_sequence([4] * 100, max_new_tokens=60)
    assert len(engine.prefix_cache) == 1
    _check_counts(engine)
    # the hit's output equals a cold run's
    cold = Engine(
        embedded_model, max_sequences=1, storage="paged", kv_block_size=BLOCK, kv_pool_tokens=256, max_kv_size=256
    )
    reference = generate_plain(cold, prompts[2] + [1999, 1998], 10).tokens
    prefill_and_record(engine, hit)
    while len(hit.output) < 10:
        step_and_record(engine, [hit])
    assert hit.output[:10] == reference
    for s in (seq, hit):
        engine.release(s, keep_prefix=False)
    engine.prefix_cache.clear()
    assert storage.free_blocks == storage.n_blocks and not storage._refs.any()
    assert storage.usage()["blocks_reserved"] == 0


def test_the_entry_hit_may_itself_be_evicted_for_room_its_reused_blocks_stay(embedded_model):
    """16 blocks, one entry of 7 (103 tokens). A partial hit (40 tokens: 2 shared blocks, block 2 copied)
    that needs 10 new blocks, 9 free: the entry hit is evicted, its blocks past the hit freed, and the hit
    still shares its 2 blocks (pinned while evicting). One that needs the whole pool cannot keep the hit's
    blocks: it is admitted as a miss instead of being refused (can_admit said yes)."""
    engine = _paged(embedded_model, pool=16 * BLOCK)
    storage = engine.storage
    first = [(5 * i + 1) % 300 + 1 for i in range(100)]
    _turn(engine, first, 4)
    entry = _only_entry(engine)
    blocks = entry.snapshot.blocks
    assert len(blocks) == 7 and storage.free_blocks == 9
    prompt = first[:40] + [1999, 1998]
    assert engine.can_admit(len(prompt), 150)
    seq = engine.add_sequence(prompt, max_new_tokens=150)  # 192 tokens: 12 blocks, 10 of them new
    assert seq.cached_tokens == 40 and seq.kv.shared == 2 and seq.kv.blocks[:2] == list(blocks[:2])
    assert len(engine.prefix_cache) == 0 and engine.prefix_cache.evictions == 1 and entry.snapshot.released
    assert _refs(storage, blocks[:2]) == [1, 1]  # only the sequence's references are left
    _check_counts(engine)
    cold = Engine(
        embedded_model, max_sequences=1, storage="paged", kv_block_size=BLOCK, kv_pool_tokens=256, max_kv_size=256
    )
    reference = generate_plain(cold, prompt, 8).tokens
    prefill_and_record(engine, seq)
    while len(seq.output) < 8:
        step_and_record(engine, [seq])
    assert seq.output[:8] == reference
    engine.release(seq, keep_prefix=False)
    assert storage.free_blocks == storage.n_blocks and not storage._refs.any()

    _turn(engine, first, 4)
    lookups = engine.prefix_cache.lookups
    assert engine.can_admit(len(prompt), 214)
    whole = engine.add_sequence(prompt, max_new_tokens=214)  # 256 tokens: the whole pool
    assert whole.cached_tokens == 0 and len(engine.prefix_cache) == 0 and storage.usage()["blocks_reserved"] == 16
    assert engine.prefix_cache.lookups == lookups + 1 and not storage._snapshot_refs.any()
    engine.release(whole, keep_prefix=False)
    assert storage.free_blocks == storage.n_blocks and not storage._refs.any()
