"""Batched step exactness: rows at different positions in one forward equal each row alone."""

from __future__ import annotations

import random

import mlx.core as mx
import pytest

from mlxd_engine import Engine, KVStorageFull, prefill_and_record, read_and_record, step_and_record


def _prompt(rng: random.Random, length: int, vocab: int) -> list[int]:
    return [rng.randrange(1, vocab) for _ in range(length)]


def _last_logits_alone(loaded, prompt: list[int], extra: list[int]) -> mx.array:
    """Logits after feeding prompt + extra through a fresh single-row engine, one step at a time."""
    engine = Engine(loaded, max_sequences=1)
    seq = engine.add_sequence(prompt)
    prefill_and_record(engine, seq)
    seq.tokens[-1] = extra[0]  # force the step inputs, whatever was sampled
    handle = None
    for token in extra:
        seq.tokens[-1] = token
        handle = engine.submit_step([seq])
        read_and_record(engine, handle)
    return handle.logits[0]


@pytest.mark.parametrize("slots_order", ["contiguous", "scattered", "reversed"])
def test_rows_at_different_positions_match_rows_alone(tiny_random_model, slots_order):
    rng = random.Random(3)
    vocab = tiny_random_model.vocab_size
    lengths = [5, 17, 40]
    prompts = [_prompt(rng, n, vocab) for n in lengths]
    engine = Engine(tiny_random_model, max_sequences=6)
    if slots_order == "scattered":
        # occupy and free slots so the rows do not sit in consecutive slots (the gather path)
        fillers = [engine.add_sequence([1, 2]) for _ in range(3)]
        for filler in fillers[:2]:
            engine.release(filler)
    seqs = [engine.add_sequence(p) for p in prompts]
    if slots_order == "scattered":
        assert [s.kv.slot for s in seqs] != list(range(seqs[0].kv.slot, seqs[0].kv.slot + 3))
    if slots_order == "reversed":
        # rows given in descending slot order run in slot order (one slice read); logits come back per row
        seqs, prompts = seqs[::-1], prompts[::-1]
        assert engine.storage.read_order([s.kv for s in seqs]) == [2, 1, 0]
    for seq in seqs:
        prefill_and_record(engine, seq)
    steps = [[rng.randrange(1, vocab) for _ in range(3)] for _ in seqs]
    handle = None
    for i in range(3):
        for seq, forced in zip(seqs, steps):
            seq.tokens[-1] = forced[i]
        handle = engine.submit_step(seqs)
        read_and_record(engine, handle)
    batched = handle.logits
    for row, (prompt, forced) in enumerate(zip(prompts, steps)):
        alone = _last_logits_alone(tiny_random_model, prompt, forced)
        assert mx.allclose(batched[row], alone, atol=1e-4).item(), f"row {row} differs"


def test_unwind_then_step_equals_never_appending(tiny_random_model):
    rng = random.Random(5)
    prompt = _prompt(rng, 23, tiny_random_model.vocab_size)
    engine = Engine(tiny_random_model, max_sequences=2)
    a, b = engine.add_sequence(prompt), engine.add_sequence(prompt)
    prefill_and_record(engine, a)
    prefill_and_record(engine, b)
    b.tokens[-1] = a.tokens[-1]
    # a: a speculative forward of 5 tokens, all unwound, leaves garbage in the slot
    engine.verify(a, [a.tokens[-1], 11, 12, 13, 14])
    engine.unwind_appends(a, 5)
    assert a.kv.pending == 0 and a.kv.committed == len(prompt)
    ha, hb = engine.submit_step([a]), engine.submit_step([b])
    read_and_record(engine, ha)
    read_and_record(engine, hb)
    assert mx.allclose(ha.logits, hb.logits, atol=1e-5).item()
    assert a.tokens == b.tokens


def test_lookahead_step_equals_synchronous_steps(tiny_random_model):
    rng = random.Random(9)
    prompts = [_prompt(rng, n, tiny_random_model.vocab_size) for n in (7, 30)]

    def run(pipelined: bool) -> list[list[int]]:
        engine = Engine(tiny_random_model, max_sequences=2)
        seqs = [engine.add_sequence(p) for p in prompts]
        for seq in seqs:
            prefill_and_record(engine, seq)
        if not pipelined:
            for _ in range(12):
                step_and_record(engine, seqs)
            return [s.output for s in seqs]
        in_flight = engine.submit_step(seqs)
        for _ in range(11):
            next_handle = engine.submit_step(seqs, lookahead=in_flight)  # n+1 before reading n
            read_and_record(engine, in_flight)
            in_flight = next_handle
        read_and_record(engine, in_flight)
        return [s.output for s in seqs]

    assert run(pipelined=True) == run(pipelined=False)


def test_slots_are_handed_out_lowest_first(tiny_random_model):
    # a batch then tends to occupy adjacent slots, which a step reads as one slice
    engine = Engine(tiny_random_model, max_sequences=4)
    seqs = [engine.add_sequence([1, 2]) for _ in range(4)]
    assert [s.kv.slot for s in seqs] == [0, 1, 2, 3]
    engine.release(seqs[2])
    engine.release(seqs[0])
    assert [engine.add_sequence([1, 2]).kv.slot for _ in range(2)] == [0, 2]


def test_kv_bound_and_slots_are_enforced(tiny_random_model):
    engine = Engine(tiny_random_model, max_sequences=1, max_kv_size=16)
    with pytest.raises(KVStorageFull):
        engine.add_sequence(list(range(1, 17)))
    seq = engine.add_sequence([1, 2, 3])
    with pytest.raises(KVStorageFull):
        engine.add_sequence([1, 2])
    engine.release(seq)
    engine.add_sequence([1, 2])
    with pytest.raises(ValueError):
        engine.add_sequence([])


def test_rows_with_slot_gaps_are_read_as_runs_of_adjacent_slots():
    from mlxd_engine.storage.kv_storage import RowPlan, SlotState

    def runs(slots):
        return RowPlan.make([SlotState(slot=s) for s in slots], 1).slot_runs()

    assert runs([0, 1, 2, 4, 5, 7]) == [(0, 3), (4, 6), (7, 8)]
    assert runs([3]) == [(3, 4)]
    assert runs([2, 0]) is None  # not ascending: the gather reads them
