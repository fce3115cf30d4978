"""The compiled forward (decode steps, verify forwards) against the op-by-op forward it replaces."""

from __future__ import annotations

import random

import mlx.core as mx
import mlx.nn as nn
import pytest

from mlxd_engine import Engine, prefill_and_record, read_and_record, step_and_record
from mlxd_engine.storage.kv_storage import GROW_CHUNK


def _run(loaded, compiled: bool, prompts: list[list[int]], forced: list[list[int]], first_slot: int = 0):
    """Prefill the prompts in slots ``first_slot``, ``first_slot + 1``, ... (the lower slots are held by
    idle sequences), then feed each row its forced tokens one batched step at a time. Returns the logits
    of every step and the engine."""
    engine = Engine(loaded, max_sequences=6, compile_decode=compiled)
    if compiled:
        engine.compiled_decode.max_rows = 6  # batches too (off by default, where it does not pay)
    for _ in range(first_slot):
        engine.add_sequence([1, 2])
    seqs = [engine.add_sequence(p) for p in prompts]
    assert [s.kv.slot for s in seqs] == list(range(first_slot, first_slot + len(seqs)))
    for seq in seqs:
        prefill_and_record(engine, seq)
    logits = []
    for i in range(len(forced[0])):
        for seq, tokens in zip(seqs, forced):
            seq.tokens[-1] = tokens[i]
        handle = engine.submit_step(seqs)
        read_and_record(engine, handle)
        logits.append(handle.logits)
    return logits, engine


def _random_rows(vocab: int, lengths: list[int], steps: int, seed: int = 5):
    rng = random.Random(seed)
    prompts = [[rng.randrange(1, vocab) for _ in range(n)] for n in lengths]
    forced = [[rng.randrange(1, vocab) for _ in range(steps)] for _ in lengths]
    return prompts, forced


@pytest.mark.parametrize("lengths,first_slot", [([7], 0), ([7], 3), ([5, 17, 40], 0), ([5, 17, 40], 1)])
def test_compiled_step_matches_the_ordinary_forward(tiny_random_model, lengths, first_slot):
    prompts, forced = _random_rows(tiny_random_model.vocab_size, lengths, 4)
    plain, _ = _run(tiny_random_model, False, prompts, forced, first_slot)
    compiled, engine = _run(tiny_random_model, True, prompts, forced, first_slot)
    assert engine.compiled_decode.enabled
    assert engine.compiled_decode.steps == 4  # every step took the compiled path
    for a, b in zip(plain, compiled):
        assert mx.allclose(a, b, atol=1e-4, rtol=1e-4).item()
        assert mx.array_equal(mx.argmax(a, axis=-1), mx.argmax(b, axis=-1)).item()


def test_batches_take_the_ordinary_forward_by_default(tiny_random_model):
    engine = Engine(tiny_random_model, max_sequences=4, compile_decode=True)
    a, b = engine.add_sequence([3, 4, 5]), engine.add_sequence([6, 7])
    for seq in (a, b):
        prefill_and_record(engine, seq)
    step_and_record(engine, [a, b])
    assert engine.compiled_decode.steps == 0
    step_and_record(engine, [b])
    assert engine.compiled_decode.steps == 1


def test_rows_in_separate_slots_take_the_ordinary_forward(tiny_random_model):
    engine = Engine(tiny_random_model, max_sequences=6, compile_decode=True)
    engine.compiled_decode.max_rows = 6
    a, gap, b = (engine.add_sequence([3, 4, 5]) for _ in range(3))
    engine.release(gap)
    for seq in (a, b):
        prefill_and_record(engine, seq)
    step_and_record(engine, [a, b])  # slots 0 and 2: not adjacent
    assert engine.compiled_decode.steps == 0
    step_and_record(engine, [a])
    assert engine.compiled_decode.steps == 1


def test_decode_across_capacity_growth_matches(tiny_random_model):
    """Steps that cross a growth of the buffers (a new capacity: a new trace) stay equal."""
    length = GROW_CHUNK - 3
    prompts, forced = _random_rows(tiny_random_model.vocab_size, [length, 9], 8, seed=11)
    plain, _ = _run(tiny_random_model, False, prompts, forced, first_slot=1)
    compiled, engine = _run(tiny_random_model, True, prompts, forced, first_slot=1)
    assert engine.storage.capacity == 2 * GROW_CHUNK
    assert 0 < engine.compiled_decode.steps < 8  # the step that grows the buffers runs op by op
    for a, b in zip(plain, compiled):
        assert mx.allclose(a, b, atol=1e-4, rtol=1e-4).item()


def test_unwound_appends_are_masked_out(tiny_random_model):
    """After unwinding pending appends, a compiled step sees the sequence as if they never happened."""
    prompts, forced = _random_rows(tiny_random_model.vocab_size, [12], 3, seed=2)
    expected, _ = _run(tiny_random_model, True, prompts, [[forced[0][0]]])
    engine = Engine(tiny_random_model, max_sequences=2, compile_decode=True)
    seq = engine.add_sequence(prompts[0])
    prefill_and_record(engine, seq)
    engine.verify(seq, [seq.tokens[-1]] + forced[0][1:])  # three speculative appends...
    engine.unwind_appends(seq, 3)  # ...dropped again
    seq.tokens[-1] = forced[0][0]
    handle = engine.submit_step([seq])
    read_and_record(engine, handle)
    assert engine.compiled_decode.steps == 2  # the verify forward and the step
    assert mx.allclose(handle.logits, expected[0], atol=1e-4, rtol=1e-4).item()


@pytest.mark.parametrize("first_slot", [0, 2])
def test_compiled_verify_forward_matches(tiny_random_model, first_slot):
    """A verify forward (the current token and a proposal) gives the ordinary forward's logits at every
    position, and a step after unwinding part of it sees only the kept appends."""
    prompts, forced = _random_rows(tiny_random_model.vocab_size, [30], 6, seed=8)
    results = {}
    for compiled in (False, True):
        engine = Engine(tiny_random_model, max_sequences=4, compile_decode=compiled)
        for _ in range(first_slot):
            engine.add_sequence([1, 2])
        seq = engine.add_sequence(prompts[0])
        prefill_and_record(engine, seq)
        verified = engine.verify(seq, [seq.tokens[-1]] + forced[0][:5])
        engine.commit_appends(seq, 3)
        engine.unwind_appends(seq, 3)
        seq.tokens += forced[0][:3]
        handle = engine.submit_step([seq])
        read_and_record(engine, handle)
        results[compiled] = (verified, handle.logits)
        if compiled:
            assert engine.compiled_decode.steps == 2
    assert results[True][0].shape == results[False][0].shape == (6, tiny_random_model.vocab_size)
    for plain, fast in zip(results[False], results[True]):
        assert mx.allclose(plain, fast, atol=1e-4, rtol=1e-4).item()


class _PythonOffsetModel(nn.Module):
    """A model whose attention turns the cache offset into a Python int, which a trace cannot do."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def __call__(self, inputs, cache=None):
        if cache is not None:
            offset = cache[0].offset
            int(offset.item() if isinstance(offset, mx.array) and offset.size == 1 else offset)
        return self.inner(inputs, cache=cache)


def test_a_model_the_trace_cannot_follow_runs_uncompiled(tiny_random_model, monkeypatch):
    prompts, forced = _random_rows(tiny_random_model.vocab_size, [6], 3)
    expected, _ = _run(tiny_random_model, False, prompts, forced)
    engine = Engine(tiny_random_model, max_sequences=2, compile_decode=True)
    monkeypatch.setattr(engine, "model", _PythonOffsetModel(tiny_random_model.model))
    engine.compiled_decode.__init__(engine.model)
    seq = engine.add_sequence(prompts[0])
    prefill_and_record(engine, seq)
    for i, token in enumerate(forced[0]):
        seq.tokens[-1] = token
        handle = engine.submit_step([seq])
        read_and_record(engine, handle)
        assert mx.allclose(handle.logits, expected[i], atol=1e-4, rtol=1e-4).item()
    assert not engine.compiled_decode.enabled


def test_environment_turns_it_off(tiny_random_model, monkeypatch):
    monkeypatch.setenv("MLXD_COMPILE_DECODE", "0")
    assert Engine(tiny_random_model, max_sequences=1).compiled_decode is None
    monkeypatch.setenv("MLXD_COMPILE_DECODE", "1")
    assert Engine(tiny_random_model, max_sequences=1).compiled_decode is not None
    assert Engine(tiny_random_model, max_sequences=1, storage="paged").compiled_decode is None


def test_one_engine_steps_rows_in_different_slots(tiny_random_model):
    """Each first slot is its own trace: a row in slot 2 stepped after one in slot 0 writes and reads slot 2."""
    logits = {}
    for compiled in (False, True):
        engine = Engine(tiny_random_model, max_sequences=4, compile_decode=compiled)
        a, gap, b = (engine.add_sequence(p) for p in ([3, 4, 5], [6, 7], [8, 9, 10, 11]))
        engine.release(gap)
        for seq in (a, b):
            prefill_and_record(engine, seq)
        logits[compiled] = []
        for rows in ([a], [b], [a], [b]):
            handle = engine.submit_step(rows)
            read_and_record(engine, handle)
            logits[compiled].append(handle.logits)
        assert not compiled or engine.compiled_decode.steps == 4
    for plain, fast in zip(logits[False], logits[True]):
        assert mx.allclose(plain, fast, atol=1e-4, rtol=1e-4).item()


def test_least_recently_used_traces_are_dropped(tiny_random_model):
    prompts, forced = _random_rows(tiny_random_model.vocab_size, [4, 4, 4], 2, seed=4)
    engine = Engine(tiny_random_model, max_sequences=4, compile_decode=True)
    engine.compiled_decode.max_traces = 2
    engine.compiled_decode.max_rows = 4
    seqs = [engine.add_sequence(p) for p in prompts]
    for seq in seqs:
        prefill_and_record(engine, seq)
    for rows in ([seqs[0]], [seqs[1]], [seqs[0]], seqs):  # (0, 1), (1, 1), (0, 1) again, (0, 3)
        step_and_record(engine, rows)
    assert engine.compiled_decode.steps == 4
    capacity = engine.storage.capacity
    assert list(engine.compiled_decode._traces) == [(0, 1, 1, capacity, capacity), (0, 3, 1, capacity, capacity)]


def test_a_short_row_reads_a_span_of_its_context_not_the_grown_capacity(tiny_random_model):
    """Another row's long context grows every slot's capacity; a short row's compiled forward still reads
    only the smallest span that holds its own context, with the ordinary forward's results."""
    prompts, forced = _random_rows(tiny_random_model.vocab_size, [9], 3, seed=7)
    results = {}
    for compiled in (False, True):
        engine = Engine(tiny_random_model, max_sequences=2, compile_decode=compiled)
        long = engine.add_sequence([3 + i % 90 for i in range(3 * GROW_CHUNK)])  # ids inside the vocabulary
        while prefill_and_record(engine, long) is None:
            pass
        assert engine.storage.capacity > 2 * GROW_CHUNK
        seq = engine.add_sequence(prompts[0])
        prefill_and_record(engine, seq)
        logits = []
        for token in forced[0]:
            seq.tokens[-1] = token
            handle = engine.submit_step([seq])
            read_and_record(engine, handle)
            logits.append(handle.logits)
        results[compiled] = logits, engine
    plain, (compiled, engine) = results[False][0], results[True]
    assert engine.compiled_decode.steps == 3
    assert {key[-1] for key in engine.compiled_decode._traces} == {256}  # (first, rows, tokens, capacity, span)
    for a, b in zip(plain, compiled):
        assert mx.allclose(a, b, atol=1e-4, rtol=1e-4).item()


def test_long_contexts_take_the_ordinary_forward(tiny_random_model):
    engine = Engine(tiny_random_model, max_sequences=2, compile_decode=True)
    engine.compiled_decode.max_capacity = GROW_CHUNK
    seq = engine.add_sequence([3 + i % 90 for i in range(GROW_CHUNK - 2)])
    prefill_and_record(engine, seq)
    step_and_record(engine, [seq])
    step_and_record(engine, [seq])  # positions GROW_CHUNK - 2 and - 1: capacity GROW_CHUNK, compiled
    assert engine.compiled_decode.steps == 2
    step_and_record(engine, [seq])  # the storage grows past max_capacity: op by op from here on
    step_and_record(engine, [seq])
    assert engine.storage.capacity == 2 * GROW_CHUNK
    assert engine.compiled_decode.steps == 2
