"""Embeddings in the engine: batches packed by length, every pooling equal to the model body's own hidden state
however the inputs are batched and cut into pieces, and models whose hidden state cannot be had refused."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from mlxd_engine import EmbeddingRun, EmbeddingUnavailable, LoadedModel, hidden_state_source
from mlxd_engine.embeddings import pack_by_length

INPUTS = [list(range(3, 40)), [5, 6, 7], list(range(10, 90)), [42]]


def test_pack_by_length_follows_its_example():
    assert pack_by_length([3, 100, 4, 2], 16) == [[3, 0, 2], [1]]
    assert pack_by_length([5], 1) == [[0]]


def run_to_end(run: EmbeddingRun) -> tuple[list[mx.array], int]:
    forwards = 0
    while not run.done:
        run.advance()
        forwards += 1
    return run.results(), forwards


@pytest.mark.parametrize("pooling", ["mean", "last", "cls", "none"])
@pytest.mark.parametrize("tokens_per_forward", [16, 4096])
def test_every_pooling_equals_the_unbatched_hidden_state(tiny_random_model, pooling, tokens_per_forward):
    source = hidden_state_source(tiny_random_model)
    results, forwards = run_to_end(EmbeddingRun(source, INPUTS, pooling, True, tokens_per_forward))
    if tokens_per_forward == 16 and pooling != "cls":
        assert forwards > len(INPUTS)  # the long inputs went in pieces
    for tokens, vector in zip(INPUTS, results):
        states = np.array(tiny_random_model.model.model(mx.array([tokens]))[0])  # [T, H]
        expected = {"mean": states.mean(0), "last": states[-1], "cls": states[0], "none": states}[pooling]
        if pooling != "none":
            expected = expected / np.linalg.norm(expected)
        np.testing.assert_allclose(np.array(vector), expected, atol=2e-5)


def test_unnormalized_vectors_keep_their_length(tiny_random_model):
    source = hidden_state_source(tiny_random_model)
    (vector,), _ = run_to_end(EmbeddingRun(source, [INPUTS[0]], "mean", False, 64))
    states = np.array(tiny_random_model.model.model(mx.array([INPUTS[0]]))[0])
    np.testing.assert_allclose(np.array(vector), states.mean(0), atol=2e-5)
    assert abs(float(np.linalg.norm(np.array(vector))) - 1) > 1e-3


class _HeadInside(nn.Module):
    """A model whose ``model`` already applies the output head (as olmo's does)."""

    def __init__(self, inner):
        super().__init__()
        self.model = inner  # inner(inputs, cache=...) -> logits
        self.layers = inner.layers

    def __call__(self, inputs, cache=None):
        return self.model(inputs, cache=cache)


class _NoBody(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.net = inner
        self.layers = inner.layers


def _like(loaded: LoadedModel, model) -> LoadedModel:
    return LoadedModel(
        model=model,
        tokenizer=None,
        path="<test>",
        model_type="test",
        n_layers=loaded.n_layers,
        vocab_size=loaded.vocab_size,
        eos_token_ids=loaded.eos_token_ids,
        context_length=loaded.context_length,
    )


def test_a_body_returning_logits_is_refused(tiny_random_model):
    with pytest.raises(EmbeddingUnavailable, match="output head"):
        hidden_state_source(_like(tiny_random_model, _HeadInside(tiny_random_model.model)))


def test_a_model_without_a_body_is_refused(tiny_random_model):
    with pytest.raises(EmbeddingUnavailable, match="no module"):
        hidden_state_source(_like(tiny_random_model, _NoBody(tiny_random_model.model)))
