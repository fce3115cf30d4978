"""Per-row sampler chains: batching rows, seeds, filters, biases, logprobs, validation."""

from __future__ import annotations

import mlx.core as mx
import pytest

from mlxd_engine import SamplerChain, SamplingParams
from mlxd_engine.sampling.chain import post_sampling_logprobs, sample_rows, token_logprobs

V = 50


def _logits(rows: int, seed: int = 0) -> mx.array:
    return mx.random.normal((rows, V), key=mx.random.key(seed)) * 3


def _no_history():
    return mx.array([], dtype=mx.int32)


def test_greedy_rows_take_argmax_in_one_batch():
    logits = _logits(4)
    chains = [SamplerChain(SamplingParams()) for _ in range(4)]
    tokens = sample_rows(chains, logits, [_no_history] * 4)
    assert tokens.tolist() == mx.argmax(logits, axis=-1).tolist()


def test_mixed_rows_keep_row_order():
    logits = _logits(4, seed=1)
    chains = [
        SamplerChain(SamplingParams()),
        SamplerChain(SamplingParams(temperature=1.0, seed=5)),
        SamplerChain(SamplingParams(logit_bias=((7, 100.0),))),  # bias forces token 7
        SamplerChain(SamplingParams(top_k=1, temperature=1.0)),  # top-1 equals argmax
    ]
    tokens = sample_rows(chains, logits, [_no_history] * 4).tolist()
    argmax = mx.argmax(logits, axis=-1).tolist()
    assert tokens[0] == argmax[0]
    assert tokens[2] == 7
    assert tokens[3] == argmax[3]
    alone = SamplerChain(SamplingParams(temperature=1.0, seed=5)).draw(logits[1:2]).item()
    assert tokens[1] == alone


def test_seeded_chain_is_reproducible_and_advances():
    logits = mx.zeros((1, V))
    first = SamplerChain(SamplingParams(temperature=1.0, seed=42))
    second = SamplerChain(SamplingParams(temperature=1.0, seed=42))
    draws_a = [first.draw(logits).item() for _ in range(20)]
    draws_b = [second.draw(logits).item() for _ in range(20)]
    assert draws_a == draws_b
    assert len(set(draws_a)) > 1  # the key advances between draws


def test_top_p_and_min_p_keep_only_likely_tokens():
    logits = mx.array([[10.0, 9.5, 0.0, -1.0] + [-20.0] * (V - 4)])
    for params in (
        SamplingParams(temperature=1.0, top_p=0.5, seed=1),
        SamplingParams(temperature=1.0, min_p=0.5, seed=1),
    ):
        chain = SamplerChain(params)
        drawn = {chain.draw(logits).item() for _ in range(40)}
        assert drawn <= {0, 1}


def test_repetition_penalty_uses_history():
    logits = mx.array([[5.0, 4.9] + [0.0] * (V - 2)])
    chain = SamplerChain(SamplingParams(repetition_penalty=2.0))
    # mlx-lm's penalty processors update the logits they are given: pass each call its own copy
    assert chain.draw(chain.process(mx.array(logits), mx.array([0]))).item() == 1
    assert chain.draw(chain.process(mx.array(logits), mx.array([2]))).item() == 0


def test_token_logprobs_are_normalised_and_sorted():
    logits = _logits(2, seed=3)
    tokens = mx.argmax(logits, axis=-1)
    chosen, top_ids, top_values = token_logprobs(logits, tokens, 3)
    assert top_ids[:, 0].tolist() == tokens.tolist()
    assert mx.allclose(chosen, top_values[:, 0]).item()
    assert (top_values[:, 0] >= top_values[:, 1]).all().item()
    assert (mx.exp(top_values).sum(axis=-1) <= 1.0 + 1e-5).all().item()
    assert (top_values <= 0).all().item()


@pytest.mark.parametrize(
    "params, message",
    [
        (SamplingParams(temperature=-1), "temperature"),
        (SamplingParams(top_p=0), "top_p"),
        (SamplingParams(min_p=2), "min_p"),
        (SamplingParams(top_k=V), "top_k"),
        (SamplingParams(logprobs=50), "logprobs"),
        (SamplingParams(logit_bias=((V + 1, 1.0),)), "logit_bias"),
    ],
)
def test_validation_messages(params, message):
    with pytest.raises(ValueError, match=message):
        params.validate(V)


def test_post_sampling_logprobs_describe_the_filtered_tempered_distribution():
    logits = mx.array([[4.0, 3.0, 1.0, -2.0]])
    chain = SamplerChain(SamplingParams(temperature=0.5, top_k=2, logprobs=4, post_sampling=True))
    chosen, ids, values = post_sampling_logprobs(chain, logits, mx.array([1]), 4)
    probs = mx.exp(values)[0].tolist()
    # top_k 2 keeps tokens 0 and 1; temperature 0.5 doubles their logit gap: p0 / p1 = e^2
    assert ids[0].tolist()[:2] == [0, 1] and probs[2:] == [0.0, 0.0]
    assert abs(sum(probs) - 1.0) < 1e-6 and abs(probs[0] / probs[1] - 2.718281828**2) < 1e-3
    assert abs(float(mx.exp(chosen)[0]) - probs[1]) < 1e-6
    greedy = SamplerChain(SamplingParams(temperature=0.0, logprobs=2, post_sampling=True))
    chosen, ids, values = post_sampling_logprobs(greedy, logits, mx.array([0]), 2)
    assert float(chosen[0]) == 0.0 and ids[0].tolist()[0] == 0 and values[0].tolist()[1] == -float("inf")
