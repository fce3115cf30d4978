"""The engine's forwards settle KV appends and return tokens; only an update step records them
(``Sequence.record``; ``mlxd_engine.standalone`` for loops that are their own update step)."""

from __future__ import annotations

from mlxd_engine import Engine, prefill_and_record, read_and_record, step_and_record, verify_round


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
