"""The engine's forwards settle KV appends and return tokens; only an update step records them
(``Sequence.record``; ``mlxd_engine.standalone`` for loops that are their own update step)."""

from __future__ import annotations

from mlxd_engine import (
    Engine,
    prefill_and_record,
    read_and_record,
    step_and_record,
    timed_step,
    verify_round,
    verify_rows,
    verify_rows_timed,
)


def test_forwards_never_write_a_rows_tokens(embedded_model):
    engine = Engine(embedded_model, max_sequences=2)
    prompt = embedded_model.tokenizer.encode("Once upon a time")
    seq = engine.add_sequence(prompt)
    first = engine.prefill(seq)
    assert first is not None and seq.tokens == prompt  # the first token is returned, not recorded
    seq.record([first.token])
    handle = engine.submit_step([seq])
    (token,) = engine.read_step(handle)
    assert seq.tokens == prompt + [first.token] and seq.kv.written == len(seq.tokens)  # committed, not recorded
    seq.record([token.token])
    before = list(seq.tokens)
    outcome = verify_round(engine, seq, [token.token, token.token], max_new_tokens=8)
    assert seq.tokens == before and seq.kv.pending == 0
    assert seq.kv.written == len(before) - 1 + len(outcome.emitted)  # storage holds the kept appends
    engine.release(seq)


def test_the_standalone_helpers_record_what_each_forward_gave(embedded_model):
    engine = Engine(embedded_model, max_sequences=2)
    prompt = embedded_model.tokenizer.encode("Once upon a time")
    seq = engine.add_sequence(prompt)
    first = prefill_and_record(engine, seq)
    (second,) = step_and_record(engine, [seq])
    (third,) = read_and_record(engine, engine.submit_step([seq]))
    assert first is not None
    assert seq.output == [first.token, second.token, third.token]
    assert seq.kv.written == len(seq.tokens) - 1  # exactly the last token outside storage
    engine.release(seq)


def test_timed_forwards_return_their_samples_and_write_no_cost_model(embedded_model):
    """An execute step's forwards come back with their times (``timed_step``, ``verify_rows_timed``); the cost
    model changes only where an update step gives it them (here ``step_and_record`` and ``verify_rows``)."""
    engine = Engine(embedded_model, max_sequences=2)
    seq = engine.add_sequence(embedded_model.tokenizer.encode("Once upon a time"))
    prefill_and_record(engine, seq)
    cost = engine.forward_cost
    (token,), sample = timed_step(engine, [seq])
    assert (sample.rows, sample.width, sample.context) == (1, 1, seq.kv.written) and sample.ms > 0
    seq.record([token.token])
    context = seq.kv.written
    (outcome,), samples = verify_rows_timed(engine, [seq], [[token.token, token.token]], [8])
    assert [(s.rows, s.width, s.context) for s in samples] == [(1, 3, context)] and samples[0].ms > 0
    assert cost.spent_ms == 0.0 and cost.observations == 0  # nothing observed
    seq.record(outcome.emitted)
    step_and_record(engine, [seq])
    spent = cost.spent_ms
    assert spent > 0.0  # the helper is its own update step
    (outcome,) = verify_rows(engine, [seq], [[seq.tokens[-1]]], [8])
    assert cost.spent_ms > spent
    engine.release(seq)
