"""Batched verify: several rows' proposals, each its own length, in one forward, equal each row decoded alone.

Rows sit at different positions (prompts of different lengths); every round gives each row a proposal
made from its own plain-decode reference: all correct (accepts all, up to 8), all wrong (accepts none),
half right, or empty (a plain token), rotating so every row sees every kind; max_tokens ends rows inside
an accepted block, and an EOS or a stop check ends a row inside one. Models: the embedded model,
stories260K, SmolLM2 (slow); storage kinds: contiguous and paged attention, sliding-window rings
(gemma3_text), recurrent state (qwen3_next, falcon_h1's composite).
"""

from __future__ import annotations

import pytest

from mlxd_engine import Engine, prefill_and_record, verify_rows
from mlxd_scheduler.single_sequence import generate_plain

from ..model_paths import SMOLLM2
from .architectures import build, loaded, prompt

NEW_TOKENS = 30
LENGTHS = (70, 41, 23, 9)


def _proposal(kind: int, reference: list[int], done: int, vocab: int) -> list[int]:
    ahead = reference[done + 1 : done + 9]  # what plain decode emits after the current token
    wrong = [(t + 1) % vocab for t in ahead]
    return [ahead, wrong, ahead[:2] + wrong[2:4], [], ahead[:1]][kind % 5]


def _check(engine, prompts, vocab):
    references = [generate_plain(engine, p, NEW_TOKENS).tokens for p in prompts]
    rows = [engine.add_sequence(p) for p in prompts]
    for row in rows:
        prefill_and_record(engine, row)
    active = list(range(len(rows)))
    round_number = 0
    while active:
        proposals = [_proposal(i + round_number, references[i], len(rows[i].output) - 1, vocab) for i in active]
        remaining = [NEW_TOKENS - len(rows[i].output) for i in active]
        outcomes = verify_rows(engine, [rows[i] for i in active], proposals, remaining)
        for i, outcome in zip(active, outcomes):
            rows[i].record(outcome.emitted)  # the caller's update step
        ended = set()
        for i, outcome in zip(active, outcomes):
            output = rows[i].output
            if outcome.finish_reason == "stop":  # an EOS inside the block: plain decode stops before it
                assert output[-1] in engine.loaded.eos_token_ids
                output = output[:-1]
                ended.add(i)
            assert output == references[i][: len(output)], (i, round_number)
            assert outcome.accepted <= outcome.drafted
        active = [i for i in active if i not in ended and len(rows[i].output) < NEW_TOKENS]
        round_number += 1
    for row, reference in zip(rows, references):
        output = row.output[:-1] if row.output[-1] in engine.loaded.eos_token_ids else row.output
        assert output == reference
        assert row.kv.pending == 0 and row.kv.written == len(row.tokens) - 1
        engine.release(row)
    return round_number


@pytest.mark.parametrize("storage", ["contiguous", "paged"])
def test_embedded_model_rows_equal_each_alone(embedded_model, storage):
    engine = Engine(embedded_model, max_sequences=8, storage=storage)
    prompts = [[(7 * i + 3 * n) % 500 + 3 for i in range(n)] for n in LENGTHS]
    rounds = _check(engine, prompts, embedded_model.vocab_size)
    assert rounds < NEW_TOKENS  # accepted drafts made rounds emit several tokens


def test_stories260k_rows_equal_each_alone(stories_model):
    engine = Engine(stories_model, max_sequences=4)
    texts = [
        "Once upon a time",
        "Lily went to the park with her mom and saw a big red ball",
        "The cat sat",
        "Tom and Sue were friends. They liked to play in the garden every day after school",
    ]
    _check(engine, [stories_model.tokenizer.encode(t) for t in texts], stories_model.vocab_size)


@pytest.mark.parametrize("name", ["llama", "gemma3_text", "qwen3_next", "falcon_h1"])
def test_architecture_rows_equal_each_alone(name):
    model = loaded(name, model=build(name, seed=3))
    engine = Engine(model, max_sequences=4)
    _check(engine, [prompt(n, seed) for seed, n in enumerate(LENGTHS)], model.vocab_size)


def test_a_stop_or_eos_inside_an_accepted_block_ends_only_its_row(stories_model):
    """Row 0 stops at a token its caller's check flags (a stop string's last token), row 1 at an EOS id,
    both inside a block of correct drafts; row 2 verifies on. Each ends at that token, as alone."""
    from dataclasses import replace

    prompts = [
        stories_model.tokenizer.encode(t)
        for t in ("Once upon a time", "Lily and Ben went to the park.", "The little dog was")
    ]
    probe = Engine(stories_model, max_sequences=1)
    references = [generate_plain(probe, p, 12).tokens for p in prompts]

    def first_new(reference: list[int], start: int) -> int:  # a position whose token did not come before
        return next(k for k in range(start, 9) if reference[k] not in reference[:k])

    stop_at, eos_at = first_new(references[0], 2), first_new(references[1], 2)
    stop_token, eos_token = references[0][stop_at], references[1][eos_at]
    model = replace(stories_model, eos_token_ids=frozenset(stories_model.eos_token_ids | {eos_token}))
    engine = Engine(model, max_sequences=4)
    rows = [engine.add_sequence(p) for p in prompts]
    for row in rows:
        prefill_and_record(engine, row)
    drafts = [reference[1:9] for reference in references]  # all correct: the whole block would be accepted
    stops = [lambda t: t == stop_token, None, None]
    outcomes = verify_rows(engine, rows, drafts, [12, 12, 12], stops)
    for row, outcome in zip(rows, outcomes):
        row.record(outcome.emitted)  # the caller's update step
    assert outcomes[0].finish_reason == "stop" and rows[0].output == references[0][: stop_at + 1]
    assert outcomes[1].finish_reason == "stop" and rows[1].output == references[1][: eos_at + 1]
    assert outcomes[2].finish_reason is None and rows[2].output == references[2][:10]  # 1 + 8 accepted + its own
    for row in rows:
        assert row.kv.pending == 0


@pytest.mark.slow
@pytest.mark.skipif(not SMOLLM2.is_dir(), reason=f"{SMOLLM2} is not present")
def test_smollm2_rows_equal_each_alone():
    from mlxd_engine import load

    model = load(str(SMOLLM2))
    engine = Engine(model, max_sequences=4)
    texts = [
        "The capital of France is",
        "def add(a, b):\n    return",
        "Once upon a time, in a small village,",
        "List three colours: red,",
    ]
    _check(engine, [model.tokenizer.encode(t) for t in texts], model.vocab_size)
