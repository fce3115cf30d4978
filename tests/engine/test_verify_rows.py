"""Batched verify: several rows' proposals, each its own length, in one forward, equal each row decoded alone.

Rows sit at different positions (prompts of different lengths); every round gives each row a proposal
made from its own plain-decode reference: all correct (accepts all, up to 8), all wrong (accepts none),
half right, or empty (a plain token), rotating so every row sees every kind; max_tokens ends rows inside
an accepted block. Storage kinds: contiguous and paged attention, sliding-window rings (gemma3_text),
recurrent state (qwen3_next, falcon_h1's composite).
"""

from __future__ import annotations

import pytest

from mlxd_engine import Engine, verify_rows
from mlxd_scheduler.single_sequence import generate_plain

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
        engine.prefill(row)
    active = list(range(len(rows)))
    round_number = 0
    while active:
        proposals = [_proposal(i + round_number, references[i], len(rows[i].output) - 1, vocab) for i in active]
        remaining = [NEW_TOKENS - len(rows[i].output) for i in active]
        outcomes = verify_rows(engine, [rows[i] for i in active], proposals, remaining)
        for i, outcome in zip(active, outcomes):
            assert rows[i].output == references[i][: len(rows[i].output)], (i, round_number)
            assert outcome.accepted <= outcome.drafted
        active = [i for i in active if len(rows[i].output) < NEW_TOKENS]
        round_number += 1
    for row, reference in zip(rows, references):
        assert row.output == reference
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
    texts = ["Once upon a time", "Lily went to the park with her mom and saw a big red ball",
             "The cat sat", "Tom and Sue were friends. They liked to play in the garden every day after school"]
    _check(engine, [stories_model.tokenizer.encode(t) for t in texts], stories_model.vocab_size)


@pytest.mark.parametrize("name", ["llama", "gemma3_text", "qwen3_next", "falcon_h1"])
def test_architecture_rows_equal_each_alone(name):
    model = loaded(name, model=build(name, seed=3))
    engine = Engine(model, max_sequences=4)
    _check(engine, [prompt(n, seed) for seed, n in enumerate(LENGTHS)], model.vocab_size)
