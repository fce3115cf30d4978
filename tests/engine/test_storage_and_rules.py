"""One home per rule: the storage protocol and its backends, the KV bound, the sampler value rules and defaults."""

from __future__ import annotations

import dataclasses

import pytest

from mlxd_engine import (
    STORAGE_BACKENDS,
    Engine,
    KVStorage,
    SamplingParams,
    at_kv_bound,
    kv_room,
    make_kv_storage,
    prefill_and_record,
    step_and_record,
)
from mlxd_protocol import Sampling
from mlxd_protocol.sampling_rules import GREEDY, sampling_problem


@pytest.mark.parametrize("backend", sorted(STORAGE_BACKENDS))
def test_every_backend_speaks_the_storage_protocol(backend, tiny_random_model):
    storage = make_kv_storage(backend, n_layers=2, max_sequences=2, max_kv_size=64, block_size=4)
    assert isinstance(storage, KVStorage) and storage.kind == backend
    engine = Engine(
        tiny_random_model, max_sequences=2, max_kv_size=64, storage=backend, kv_block_size=4, compile_decode=True
    )
    # what differs between backends is said by an attribute, not by comparing names
    assert storage.compiles_forward == (backend == "contiguous")
    assert (engine.compiled_decode is not None) == storage.compiles_forward


def test_an_unknown_backend_names_the_known_ones():
    with pytest.raises(ValueError, match="known: contiguous, paged"):
        make_kv_storage("ring", n_layers=1, max_sequences=1, max_kv_size=16, block_size=4)


def test_the_kv_bound_ends_a_sequence_when_its_current_token_cannot_be_stored(tiny_random_model):
    engine = Engine(tiny_random_model, max_sequences=1, max_kv_size=8)
    seq = engine.add_sequence([1, 2, 3, 4, 5])
    prefill_and_record(engine, seq)  # committed 5, the first output token is outside storage
    assert kv_room(seq) == 3 and not at_kv_bound(seq)
    step_and_record(engine, [seq])
    step_and_record(engine, [seq])  # committed 7: the current token still fits
    assert kv_room(seq) == 1 and not at_kv_bound(seq)
    step_and_record(engine, [seq])  # committed 8: storage is full
    assert kv_room(seq) == 0 and at_kv_bound(seq)


@pytest.mark.parametrize("backend", sorted(STORAGE_BACKENDS))
def test_a_prompt_token_outside_the_vocabulary_is_refused_and_takes_no_slot(backend, tiny_random_model):
    """The daemon's edge refuses such prompts first; the engine refuses them too rather than let MLX gather out
    of bounds, and nothing it holds changes."""
    engine = Engine(tiny_random_model, max_sequences=1, max_kv_size=64, storage=backend, kv_block_size=4)
    vocab = tiny_random_model.vocab_size
    for bad in (vocab, vocab + 1000, -1):
        with pytest.raises(ValueError, match=f"prompt token {bad} is outside the vocabulary of {vocab}"):
            engine.add_sequence([1, 2, bad, 3])
    seq = engine.add_sequence([1, 2, vocab - 1])  # the one slot is still free
    assert prefill_and_record(engine, seq) is not None


def test_wire_and_engine_sampler_types_share_the_greedy_defaults():
    wire = {f.name: f.default for f in dataclasses.fields(Sampling) if f.name in GREEDY}
    engine = {f.name: f.default for f in dataclasses.fields(SamplingParams) if f.name in GREEDY}
    assert wire == engine == GREEDY


@pytest.mark.parametrize(
    "settings, vocab, problem",
    [
        (Sampling(top_p=0.0), None, "sampling.top_p: must be in (0, 1]"),
        (SamplingParams(top_p=0.0), 97, "sampling.top_p: must be in (0, 1]"),
        (Sampling(top_k=500), None, None),  # the vocabulary bound needs the model
        (SamplingParams(top_k=500), 97, "sampling.top_k: must be in [0, 97) (0 = off)"),
        (Sampling(logit_bias={3: float("nan")}), None, "sampling.logit_bias: values must not be NaN"),
        (SamplingParams(logit_bias=((100, 1.0),)), 97, "sampling.logit_bias: token ids must be in [0, 97)"),
        (SamplingParams(logprobs=21), 97, "sampling.logprobs: must be in [0, 20]"),
    ],
)
def test_one_set_of_sampler_rules_for_the_wire_and_the_engine(settings, vocab, problem):
    assert sampling_problem(settings, vocab) == problem
    if isinstance(settings, SamplingParams) and problem:
        with pytest.raises(ValueError, match=problem.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
            settings.validate(vocab)
