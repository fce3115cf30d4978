"""A prompt's last forward computes the output head at its last position only (mlxd_engine/last_logits.py)."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from mlxd_engine.last_logits import last_position_only, mark_output_heads

from .architectures import ARCHITECTURES, available, build

TOKENS = mx.array([[3, 5, 7, 9, 11, 2, 40, 41]])


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_every_architecture_gives_its_last_logits_alone(name):
    """Tied and untied heads alike: inside the context the forward returns one position, the full forward's
    last; outside it every position, as before."""
    if not available(name):
        pytest.skip(f"the installed mlx-lm has no {ARCHITECTURES[name][0]}")
    model = build(name, seed=1)
    want = model(TOKENS, cache=make_prompt_cache(model))
    assert mark_output_heads(model) >= 1
    with last_position_only():
        got = model(TOKENS, cache=make_prompt_cache(model))
    assert got.shape == (1, 1, want.shape[-1])
    np.testing.assert_allclose(np.array(got[:, -1]), np.array(want[:, -1]), rtol=1e-5, atol=1e-5)
    again = model(TOKENS, cache=make_prompt_cache(model))
    assert again.shape == want.shape
    np.testing.assert_allclose(np.array(again), np.array(want), rtol=1e-5, atol=1e-5)


def test_layers_of_the_vocabularys_width_inside_the_stack_are_not_heads():
    """Sizes alone would pick projections inside the layers where they are as wide as the vocabulary (the
    matrix's llama: its MLP's up and gate projections have the vocabulary's 128 outputs)."""
    model = build("llama", seed=0)
    up = model.model.layers[0].mlp.up_proj
    assert up.weight.shape[0] == model.lm_head.weight.shape[0]
    want = model(TOKENS, cache=make_prompt_cache(model))
    assert mark_output_heads(model) == 2  # the embedding table's as_linear and lm_head
    assert mark_output_heads(model) == 2  # marking again changes nothing
    assert type(up) is nn.Linear
    assert type(model.lm_head).__name__ == "LastPositionLinear"
    with last_position_only():
        got = model(TOKENS, cache=make_prompt_cache(model))
    np.testing.assert_allclose(np.array(got[:, -1]), np.array(want[:, -1]), rtol=1e-5, atol=1e-5)


def test_a_quantized_head_on_the_cpu_kernel():
    """The CPU kernel's tied quantized head, switched at load, keeps its class's behaviour and computes one row."""
    from mlxd_engine.loading.kernel_layers import KernelQuantizedEmbedding, use_kernel

    from ..qmatmul.test_kernel import _tiny_quantized_model

    model = _tiny_quantized_model(8)
    use_kernel(model)
    want = model(TOKENS)
    assert mark_output_heads(model) >= 1
    assert isinstance(model.model.embed_tokens, KernelQuantizedEmbedding)
    with last_position_only():
        got = model(TOKENS)
    assert got.shape == (1, 1, want.shape[-1])
    np.testing.assert_allclose(np.array(got[:, -1]), np.array(want[:, -1]), rtol=1e-4, atol=1e-4)


def test_the_engines_prefill_reads_its_first_token_from_the_last_position(tiny_random_model):
    """The engine marks its model's head; a prompt prefilled whole and in chunks gives the first token of
    mlx-lm's own forward, and decode after it steps every row as before."""
    from mlxd_engine import Engine, prefill_and_record, step_and_record

    engine = Engine(tiny_random_model, max_sequences=2)
    assert engine.output_heads >= 1
    prompt = [(5 * i + 1) % 90 for i in range(70)]
    logits = tiny_random_model.model(mx.array([prompt]), cache=make_prompt_cache(tiny_random_model.model))
    whole = engine.add_sequence(prompt)
    assert prefill_and_record(engine, whole).token == int(mx.argmax(logits[0, -1]))
    chunked = engine.add_sequence(prompt)
    while prefill_and_record(engine, chunked, max_tokens=16) is None:
        pass
    assert chunked.output == whole.output
    for _ in range(5):
        step_and_record(engine, [whole, chunked])
    assert chunked.output == whole.output and len(whole.output) == 6
