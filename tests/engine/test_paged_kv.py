"""Paged KV storage: same results as contiguous, unwinds across block boundaries, pool accounting."""

from __future__ import annotations

import random

import mlx.core as mx
import pytest

from mlxd_drafters import PromptLookupConfig
from mlxd_engine import Engine, KVStorageFull, prefill_and_record, read_and_record
from mlxd_scheduler import (
    BatchScheduler,
    Request,
    SchedulerOptions,
    SpeculativeRequest,
    generate_plain,
    generate_with_prompt_lookup,
)


def paged(loaded, block=4, pool=4096, **kwargs):
    return Engine(loaded, storage="paged", kv_block_size=block, kv_pool_tokens=pool, **kwargs)


@pytest.mark.parametrize("text", ["Once upon a time", "Lily and Ben went to the park."])
def test_paged_equals_contiguous_plain_and_prompt_lookup(stories_model, text):
    prompt = stories_model.tokenizer.encode(text)
    contiguous = Engine(stories_model, max_sequences=1)
    reference = generate_plain(contiguous, prompt, 150).tokens
    for block in (4, 16):
        engine = paged(stories_model, block=block, max_sequences=1)
        assert generate_plain(engine, prompt, 150).tokens == reference
        speculative = generate_with_prompt_lookup(engine, prompt, 150, config=PromptLookupConfig(policy="always"))
        assert speculative.tokens == reference
        assert speculative.verify_rounds > 0 and speculative.drafted > speculative.accepted  # some unwinds happened
        assert engine.storage.free_blocks == engine.storage.n_blocks


def test_unwind_across_a_block_boundary_frees_the_block(tiny_random_model):
    engine = paged(tiny_random_model, block=4, pool=64, max_sequences=2)
    seq = engine.add_sequence([1, 2, 3, 4, 5, 6], max_new_tokens=10)  # 6 tokens: blocks 0-1 (second half full)
    prefill_and_record(engine, seq)
    assert len(seq.kv.blocks) == 2
    free_before = engine.storage.free_blocks
    engine.verify(seq, [seq.tokens[-1], 9, 9, 9, 9])  # positions 6..10: a third block
    assert len(seq.kv.blocks) == 3 and engine.storage.free_blocks == free_before - 1
    engine.unwind_appends(seq, 5)
    assert len(seq.kv.blocks) == 2 and engine.storage.free_blocks == free_before
    # a step after the unwind equals a fresh sequence's step
    other = engine.add_sequence([1, 2, 3, 4, 5, 6], max_new_tokens=10)
    prefill_and_record(engine, other)
    other.tokens[-1] = seq.tokens[-1]
    a, b = engine.submit_step([seq]), engine.submit_step([other])
    read_and_record(engine, a)
    read_and_record(engine, b)
    assert mx.allclose(a.logits, b.logits, atol=1e-5).item()


def test_batched_paged_rows_match_rows_alone(tiny_random_model):
    rng = random.Random(1)
    prompts = [[rng.randrange(1, 97) for _ in range(n)] for n in (3, 9, 22)]
    engine = paged(tiny_random_model, block=4, pool=256, max_sequences=4)
    seqs = [engine.add_sequence(p, max_new_tokens=8) for p in prompts]
    for seq in seqs:
        prefill_and_record(engine, seq)
    batched = engine.submit_step(seqs)
    read_and_record(engine, batched)
    for row, prompt in enumerate(prompts):
        alone = Engine(tiny_random_model, max_sequences=1)
        seq = alone.add_sequence(prompt)
        prefill_and_record(alone, seq)
        seq.tokens[-1] = seqs[row].tokens[-2]
        handle = alone.submit_step([seq])
        read_and_record(alone, handle)
        assert mx.allclose(batched.logits[row], handle.logits[0], atol=1e-4).item()


def test_pool_accounting_after_mixed_requests(stories_model):
    engine = paged(stories_model, block=8, pool=8 * 64, max_sequences=8)
    scheduler = BatchScheduler(engine, SchedulerOptions(max_batch=8, prompt_lookup=PromptLookupConfig(policy="always")))
    tokenizer = stories_model.tokenizer
    prompts = ["Once upon a time", "Lily and Ben went to the park.", "The cat", "Tom had a ball"] * 3
    finished = {}
    for i, text in enumerate(prompts):
        speculative = SpeculativeRequest(enabled=i % 2 == 0)
        scheduler.submit(
            Request(str(i), tokenizer.encode(text), max_tokens=40 + 5 * i, speculative=speculative),
            lambda e, i=i: finished.__setitem__(i, e) if hasattr(e, "finish_reason") else None,
        )
    peak = 0
    for tick in range(10_000):
        if not scheduler.has_work:
            break
        if tick == 12:
            scheduler.cancel("1")
            scheduler.cancel("6")
        scheduler.tick()
        peak = max(peak, engine.storage.n_blocks - engine.storage.free_blocks)
    assert len(finished) == len(prompts)
    assert {finished[1].finish_reason, finished[6].finish_reason} <= {"cancelled", "length", "stop"}
    assert engine.storage.free_blocks == engine.storage.n_blocks and engine.storage._reserved == 0
    assert 0 < peak <= engine.storage.n_blocks


def test_admission_waits_for_room_and_impossible_requests_are_refused(stories_model):
    engine = paged(stories_model, block=16, pool=16 * 12, max_sequences=8)  # room for about two requests
    scheduler = BatchScheduler(engine, SchedulerOptions(max_batch=8))
    prompt = stories_model.tokenizer.encode("Once upon a time")
    done = {}
    for i in range(4):
        scheduler.submit(
            Request(str(i), prompt, max_tokens=80),
            lambda e, i=i: done.__setitem__(i, e) if hasattr(e, "finish_reason") else None,
        )
    max_active = 0
    while scheduler.has_work:
        scheduler.tick()
        max_active = max(max_active, scheduler.active)
    assert max_active == 2 and all(done[i].finish_reason == "length" for i in range(4))
    assert all(done[i].tokens == done[0].tokens for i in range(4))
    with pytest.raises(ValueError, match="can never fit"):
        scheduler.submit(Request("big", prompt, max_tokens=16 * 12 + 1), lambda e: None)
    with pytest.raises(KVStorageFull):
        engine.storage.allocate(16 * 13)


def test_cancelling_one_of_identical_waiting_sequences_leaks_nothing():
    """Identical requests admitted together wait for prefill with equal records (same reservation, no
    blocks yet). Cancelling one must release that one: every block and reservation comes back."""
    from tests.scheduler.stub_model import stub_loaded

    engine = paged(stub_loaded(), block=4, pool=256, max_sequences=4)
    scheduler = BatchScheduler(engine, SchedulerOptions(max_batch=4, prefill_chunk=4))
    prompt = list(range(1, 13))  # three prefill chunks: the others wait with no blocks meanwhile
    finished = {}
    for name in ("a", "b", "c"):
        scheduler.submit(
            Request(name, prompt, max_tokens=6),
            lambda e, name=name: finished.__setitem__(name, e) if hasattr(e, "finish_reason") else None,
        )
    scheduler.tick()  # admits all three, prefills a's first chunk: b and c hold equal records
    b, c = (scheduler.by_id[name].seq.kv for name in ("b", "c"))
    assert not b.blocks and not c.blocks and b.reserved_blocks == c.reserved_blocks
    scheduler.cancel("c")
    scheduler.run_until_idle()
    assert finished["c"].finish_reason == "cancelled"
    assert finished["a"].finish_reason == finished["b"].finish_reason == "length"
    assert finished["a"].tokens == finished["b"].tokens
    usage = engine.storage.usage()
    assert engine.storage.free_blocks == engine.storage.n_blocks, usage
    assert usage["blocks_reserved"] == 0 and usage["sequences"] == 0, usage
    assert engine.storage.free_slots == 4


def test_release_removes_that_record_not_an_equal_one(tiny_random_model):
    storage = paged(tiny_random_model, block=4, pool=64, max_sequences=4).storage
    first, second = storage.allocate(8), storage.allocate(8)  # equal by value: same reservation, no blocks
    storage.release(second)
    storage.reserve([first], 5)  # first takes its two promised blocks
    storage.release(first)
    assert storage.free_blocks == storage.n_blocks and storage.usage()["blocks_reserved"] == 0
    assert storage.free_slots == 4
