"""Mixed-precision checkpoints: layers of 2, 3, 5 and 6 bits repacked exactly at 4 or 8 bits for the kernel,
and layers it cannot take (other modes) following the float32 rule on their own.

mlx-lm's mixed recipes (``--quant-predicate mixed_4_6``, llama.cpp's Q4_K_M choices) keep some layers at 6 bits
beside 4-bit ones, and other checkpoints mix widths or modes. Before, one such layer kept the whole model off
the kernel (every quantized layer dequantized to float32).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import mlxd_qmatmul

from .tiny_llama import tiny_llama, tiny_llama_loaded

pytestmark = pytest.mark.skipif(not mlxd_qmatmul.available(), reason=mlxd_qmatmul.unavailable_reason())


def _mixed_model(seed: int = 7):
    """A tiny llama quantized as mlx-lm's mixed recipes do it: v_proj and down_proj of layer 1 at 6 bits,
    the rest 4-bit, o_proj of layer 0 at 3 bits; and up_proj of layer 0 in MXFP4 (a mode the kernel does not
    take)."""
    model = tiny_llama(seed)

    def recipe(path, module):
        if not hasattr(module, "to_quantized"):
            return False
        if path.startswith("model.layers.1.") and path.endswith(("v_proj", "down_proj")):
            return {"group_size": 64, "bits": 6}
        if path == "model.layers.0.self_attn.o_proj":
            return {"group_size": 64, "bits": 3}
        if path == "model.layers.0.mlp.up_proj":
            return {"group_size": 32, "bits": 4, "mode": "mxfp4"}
        return {"group_size": 64, "bits": 4}

    nn.quantize(model, class_predicate=recipe)
    model.set_dtype(mx.bfloat16)  # scales and norms as a checkpoint stores them
    mx.eval(model.parameters())
    return model


@pytest.mark.parametrize("bits, wide", [(2, 4), (3, 4), (5, 8), (6, 8)])
@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_repacking_keeps_every_weight(bits, wide, group_size):
    from mlx_lm.models.switch_layers import QuantizedSwitchLinear

    from mlxd_engine.loading.repack import repack_for_kernel

    mx.random.seed(bits * 1000 + group_size)
    linear = nn.QuantizedLinear.from_linear(nn.Linear(256, 40), group_size=group_size, bits=bits)
    experts = QuantizedSwitchLinear(256, 24, 3, bias=False, group_size=group_size, bits=bits)
    for layer in (linear, experts):
        before = mx.dequantize(layer["weight"], layer["scales"], layer["biases"], group_size=group_size, bits=bits)
        assert repack_for_kernel([layer]) == {bits: 1}
        assert layer.bits == wide and layer["weight"].dtype == mx.uint32
        after = mx.dequantize(layer["weight"], layer["scales"], layer["biases"], group_size=group_size, bits=wide)
        assert mx.array_equal(before, after)
    assert repack_for_kernel([linear, experts]) == {}  # 4 and 8 bits: as they are


def test_the_kernel_takes_its_layers_and_the_others_are_dequantized():
    from mlxd_engine.loading.cpu_weights import apply_cpu_weight_rule
    from mlxd_engine.loading.kernel_layers import KernelQuantizedEmbedding, KernelQuantizedLinear

    model, dense = _mixed_model(), _mixed_model()
    form = apply_cpu_weight_rule(model, choice="kernel")
    assert form.form == "kernel quantized", form.detail
    assert "3 of them repacked exactly from 3/6 bits" in form.detail
    assert "the other 1 (mxfp4 4-bit) dequantized to float32" in form.detail
    assert apply_cpu_weight_rule(dense, choice="dequantized").form == "float32 dequantized"
    layers = model.model.layers
    assert isinstance(layers[1].self_attn.v_proj, KernelQuantizedLinear) and layers[1].self_attn.v_proj.bits == 8
    assert isinstance(layers[0].self_attn.o_proj, KernelQuantizedLinear) and layers[0].self_attn.o_proj.bits == 4
    assert type(layers[0].mlp.up_proj) is nn.Linear and layers[0].mlp.up_proj.weight.dtype == mx.float32
    assert isinstance(layers[1].self_attn.q_proj, KernelQuantizedLinear)
    assert isinstance(model.model.embed_tokens, KernelQuantizedEmbedding)
    assert layers[0].mlp.down_proj["weight"].dtype == mx.uint32  # still quantized in memory
    tokens = mx.array([[1, 5, 9, 20, 33, 7, 2, 250]])
    for inputs in (tokens, tokens[:, :1]):
        np.testing.assert_allclose(np.array(model(inputs)), np.array(dense(inputs)), rtol=1e-4, atol=1e-4)


def test_above_the_budget_the_others_stay_quantized():
    from mlxd_engine.loading.cpu_weights import apply_cpu_weight_rule
    from mlxd_engine.loading.kernel_layers import KernelQuantizedLinear

    model = _mixed_model()
    form = apply_cpu_weight_rule(model, budget_bytes=1, choice="kernel")
    assert "the other 1 (mxfp4 4-bit) kept quantized on MLX's kernels" in form.detail
    up_proj = model.model.layers[0].mlp.up_proj
    assert type(up_proj) is nn.QuantizedLinear and up_proj.mode == "mxfp4"
    assert isinstance(model.model.layers[1].self_attn.q_proj, KernelQuantizedLinear)


def test_a_mixed_precision_model_decodes_as_its_dequantized_form():
    """Greedy through the engine (the decode step, batched rows, prompt lookup's verify forwards) with the
    kernel on the 4-bit layers equals the model with every layer dequantized to float32."""
    from mlxd_engine import Engine
    from mlxd_engine.loading.cpu_weights import apply_cpu_weight_rule
    from mlxd_scheduler.single_sequence import generate_plain, generate_with_prompt_lookup

    def engine(choice):
        model = _mixed_model(seed=11)
        apply_cpu_weight_rule(model, choice=choice)
        return Engine(tiny_llama_loaded(model, "<mixed>"), max_sequences=2)

    prompt = [(7 * i + 3) % 300 for i in range(60)] * 2  # repeats: prompt lookup finds drafts
    kernel, dense = engine("kernel"), engine("dequantized")
    want = generate_plain(dense, prompt, 32).tokens
    assert generate_plain(kernel, prompt, 32).tokens == want
    looked_up = generate_with_prompt_lookup(kernel, prompt, 32)
    assert looked_up.tokens == want and looked_up.verify_rounds > 0
