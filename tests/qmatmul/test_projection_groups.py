"""Sibling projections packed into one kernel product (mlxd_engine/loading/projection_groups.py) and the
kernel's split product under it: bit-identical to each layer's own product, on several architectures."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import mlxd_qmatmul

from ..engine import architectures

pytestmark = pytest.mark.skipif(not mlxd_qmatmul.available(), reason=mlxd_qmatmul.unavailable_reason())


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("scale_dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_a_split_product_equals_each_layers_own_product(bits, group_size, scale_dtype):
    rng = np.random.default_rng(bits + group_size)
    K = group_size * 3
    sizes = [int(rng.integers(1, 200)) for _ in range(3)]
    parts = [mx.quantize(mx.array(rng.normal(size=(n, K)).astype(np.float32)), group_size, bits) for n in sizes]
    parts = [(w, s.astype(scale_dtype), b.astype(scale_dtype)) for w, s, b in parts]
    packed = [mx.concatenate([part[i] for part in parts], axis=0) for i in range(3)]
    for rows in (1, 3, 8, 9, 33):
        x = mx.array(rng.normal(size=(2, rows, K)).astype(np.float32))
        got = mlxd_qmatmul.quantized_matmul_split(x, *packed, group_size, bits, sizes)
        assert [g.shape for g in got] == [(2, rows, n) for n in sizes]
        for g, (w, s, b) in zip(got, parts):
            assert np.array_equal(np.array(g), np.array(mlxd_qmatmul.quantized_matmul(x, w, s, b, group_size, bits)))


@pytest.mark.skipif(not mlxd_qmatmul.int8_available(4), reason="no int8-activation kernel (AVX-512 VNNI) here")
@pytest.mark.parametrize("bits", [4, 8])
def test_a_split_product_with_int8_activations_equals_each_layers_own(bits):
    rng = np.random.default_rng(bits)
    sizes = [96, 32, 32]
    parts = [mx.quantize(mx.array(rng.normal(size=(n, 128)).astype(np.float32)), 32, bits) for n in sizes]
    packed = [mx.concatenate([part[i] for part in parts], axis=0) for i in range(3)]
    for rows in (1, 5, 9):
        x = mx.array(rng.normal(size=(rows, 128)).astype(np.float32))
        got = mlxd_qmatmul.quantized_matmul_split(x, *packed, 32, bits, sizes, int8_activations=True)
        for g, (w, s, b) in zip(got, parts):
            own = mlxd_qmatmul.quantized_matmul(x, w, s, b, 32, bits, int8_activations=True)
            assert np.array_equal(np.array(g), np.array(own))


def test_a_split_product_refuses_sizes_that_do_not_add_up():
    w, s, b = mx.quantize(mx.ones((64, 64)), group_size=32, bits=4)
    with pytest.raises(ValueError, match="sum to 60"):
        mlxd_qmatmul.quantized_matmul_split(mx.ones((1, 64)), w, s, b, 32, 4, [30, 30])
    with pytest.raises(ValueError, match="positive"):
        mlxd_qmatmul.quantized_matmul_split(mx.ones((1, 64)), w, s, b, 32, 4, [64, 0])


def _build(name: str):
    if name != "llama_biases":
        return architectures.build(name, seed=3)
    import importlib

    llama = importlib.import_module("mlx_lm.models.llama")
    config = {**architectures.ARCHITECTURES["llama"][1], "attention_bias": True, "mlp_bias": True}
    mx.random.seed(3)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    mx.eval(model.parameters())
    return model


def _kernel_model(name: str, grouped: bool, monkeypatch):
    from mlxd_engine.loading.cpu_weights import apply_cpu_weight_rule

    monkeypatch.setenv("MLXD_GROUP_PROJECTIONS", "1" if grouped else "0")
    model = _build(name)

    def whole_groups(_, module):  # every layer whose input divides into groups (gemma4 has one of 8 features)
        return hasattr(module, "to_quantized") and module.weight.shape[-1] % 32 == 0

    nn.quantize(model, group_size=32, bits=4, class_predicate=whole_groups)
    mx.eval(model.parameters())
    assert apply_cpu_weight_rule(model, choice="kernel").form == "kernel quantized"
    return model


# llama: q/k/v and gate/up, also with biases on every projection; gemma4 with layers whose keys and values
# come from an earlier layer (their q_proj alone reads the input); phi3: already packed (no group)
@pytest.mark.parametrize("name", ["llama", "llama_biases", "qwen3", "olmo3", "gemma4_text_kv_shared", "phi3"])
def test_grouped_models_give_the_same_logits(name, monkeypatch):
    if name != "llama_biases" and not architectures.available(name):
        pytest.skip(f"mlx-lm has no {name}")
    from mlx_lm.models.cache import make_prompt_cache

    from mlxd_engine.loading.kernel_layers import UNBOUNDED, KernelQuantizedLinear
    from mlxd_engine.loading.projection_groups import GroupedQuantizedLinear

    single, grouped = _kernel_model(name, False, monkeypatch), _kernel_model(name, True, monkeypatch)
    groups = [m for _, m in grouped.named_modules() if isinstance(m, GroupedQuantizedLinear)]
    assert bool(groups) == (name != "phi3")
    assert [(k, v.shape, v.dtype) for k, v in _flat(grouped)] == [(k, v.shape, v.dtype) for k, v in _flat(single)]
    tokens = mx.array([architectures.prompt(40, 1)])
    for max_rows in (1, UNBOUNDED):  # the prompt's 40 rows through BLAS, then on the kernel
        for model in (single, grouped):  # the rule sets it from timings at load: the same for both here
            for _, layer in model.named_modules():
                if isinstance(layer, KernelQuantizedLinear):
                    layer.kernel_max_rows = max_rows
        caches = make_prompt_cache(single), make_prompt_cache(grouped)
        want, got = single(tokens, cache=caches[0]), grouped(tokens, cache=caches[1])
        if max_rows == 1:  # one BLAS product of the packed weight against three: within rounding
            np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-4, atol=1e-4)
            continue
        assert np.array_equal(np.array(got), np.array(want))
        for token in (5, 9, 77):  # decode rows after a prompt computed the same way: bit for bit
            step = mx.array([[token]])
            want, got = single(step, cache=caches[0]), grouped(step, cache=caches[1])
            assert np.array_equal(np.array(got), np.array(want))


def _flat(model):
    from mlx.utils import tree_flatten

    return tree_flatten(model.parameters())


def test_a_layer_called_with_another_input_computes_its_own_product(monkeypatch):
    model = _kernel_model("llama", True, monkeypatch)
    attention = model.model.layers[0].self_attn
    x, other = mx.random.normal((1, 2, 64), key=mx.random.key(1)), mx.random.normal((1, 2, 64), key=mx.random.key(2))
    q = attention.q_proj(x)
    k_other = attention.k_proj(other)  # not the array q_proj read: its own product from its view
    v = attention.v_proj(x)
    want = [
        mlxd_qmatmul.quantized_matmul(a, layer["weight"], layer["scales"], layer["biases"], 32, 4)
        for a, layer in ((x, attention.q_proj), (other, attention.k_proj), (x, attention.v_proj))
    ]
    for got, expected in zip((q, k_other, v), want):
        assert np.array_equal(np.array(got), np.array(expected))
