"""Llama-style layers as two kernel ops (mlxd_engine/fused_blocks.py, native/block.cpp): bit-identical to the
same layer op by op on the kernel, through every engine path (alone and compiled, batched rows at different
positions, contiguous and paged storage, verify forwards), and left op by op where they do not apply."""

from __future__ import annotations

import importlib

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import mlxd_qmatmul
from mlxd_engine import prefill_and_record

from . import architectures

pytestmark = pytest.mark.skipif(not mlxd_qmatmul.available(), reason=mlxd_qmatmul.unavailable_reason())

llama = importlib.import_module("mlx_lm.models.llama")


def _kernel_model(name: str = "llama", seed: int = 3, int8: bool = False, **config):
    """A tiny random model of ``name`` quantized to 4 bits, on the CPU kernel with packed projections and the
    CPU's fused norms and RoPE (as the engine sets it up), before any layer is fused."""
    from mlxd_engine.cpu_fusion import fuse_cpu_layers
    from mlxd_engine.loading.cpu_weights import apply_cpu_weight_rule

    module_name, base = _case(name)
    module = importlib.import_module(f"mlx_lm.models.{module_name}")
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict({**base, **config}))
    mx.eval(model.parameters())
    nn.quantize(model, group_size=32, bits=4, class_predicate=lambda _, m: hasattr(m, "to_quantized"))
    mx.eval(model.parameters())
    apply_cpu_weight_rule(model, choice="kernel-int8" if int8 else "kernel")
    fuse_cpu_layers(model)
    return model


def _case(name: str) -> tuple[str, dict]:
    """The architecture case; qwen2 (not in the matrix: llama's layers plus q/k/v biases) on llama's config."""
    if name == "qwen2":
        return "qwen2", {**architectures.ARCHITECTURES["llama"][1], "model_type": "qwen2"}
    return architectures.ARCHITECTURES[name]


def _layers(model):
    return model.model.layers


FAMILIES = ["llama", "qwen2", "qwen3"]  # qwen2: q/k/v biases; qwen3: per-head q/k norms


def _family(name: str) -> str:
    if importlib.util.find_spec(f"mlx_lm.models.{name}") is None:
        pytest.skip(f"mlx-lm has no {name}")
    return name


@pytest.mark.parametrize("name", FAMILIES)
def test_a_fused_layer_equals_its_ops_for_prompts_steps_and_verifies(name):
    from mlx_lm.models.cache import make_prompt_cache

    from mlxd_engine.fused_blocks import FUSED, fuse_blocks

    model = _kernel_model(_family(name))
    stock = type(_layers(model)[0])
    stock_caches = make_prompt_cache(model)
    assert fuse_blocks(model) == len(_layers(model))
    assert all(type(layer) is FUSED[stock] for layer in _layers(model))
    fused_caches = make_prompt_cache(model)
    for tokens in (architectures.prompt(12, 1), [7], [3, 4, 5, 6, 7, 8, 9, 10, 11], [42]):
        x = model.model.embed_tokens(mx.array([tokens]))
        mask = "causal" if len(tokens) > 1 else None
        for layer, stock_cache, fused_cache in zip(_layers(model), stock_caches, fused_caches):
            want = stock.__call__(layer, x, mask, stock_cache)
            got = layer(x, mask, fused_cache)
            assert np.array_equal(np.array(got), np.array(want))
            x = want


def _first_fused_layer(name: str):
    """The first layer of a fused tiny model of ``name``, and its attention's head size."""
    from mlxd_engine.fused_blocks import fuse_blocks

    model = _kernel_model(_family(name))
    fuse_blocks(model)
    layer = _layers(model)[0]
    return layer, layer.self_attn.q_proj.projection_group.sizes[0] // layer.self_attn.n_heads


def _attention_input(layer, x, offset, lengths=None):
    """``mlxd_qmatmul.attention_input`` with the layer's own weights and settings."""
    attn = layer.self_attn
    group = attn.q_proj.projection_group
    qk_norm = getattr(attn, "q_norm", None)
    return mlxd_qmatmul.attention_input(
        x,
        layer.input_layernorm.weight,
        layer.input_layernorm.eps,
        (group.weight, group.scales, group.biases, group.group_size, group.bits, group.sizes),
        attn.n_heads,
        attn.n_kv_heads,
        group.sizes[0] // attn.n_heads,
        offset,
        (attn.rope.dims, attn.rope.traditional, attn.rope.base, attn.rope.scale),
        group.bias,
        (qk_norm.weight, attn.k_norm.weight, qk_norm.eps) if type(layer).fused_qk_norm else None,
        lengths=lengths,
    )


@pytest.mark.parametrize("name", FAMILIES)
def test_attention_input_takes_one_offset_per_row(name):
    layer, head_dim = _first_fused_layer(name)
    attn = layer.self_attn
    x = mx.random.normal((3, 2, 64), key=mx.random.key(0))
    offset = mx.array([0, 17, 5], dtype=mx.int32)
    got = _attention_input(layer, x, offset)
    xn = layer.input_layernorm(x)
    q, k, v = (attn.q_proj(xn), attn.k_proj(xn), attn.v_proj(xn))
    if name == "qwen3":
        q, k = (attn.q_norm(q.reshape(3, 2, -1, head_dim)), attn.k_norm(k.reshape(3, 2, -1, head_dim)))
    q, k, v = (p.reshape(3, 2, -1, head_dim).transpose(0, 2, 1, 3) for p in (q, k, v))
    want = (attn.rope(q, offset=offset), attn.rope(k, offset=offset), v)
    for g, w in zip(got, want):
        assert np.array_equal(np.array(g), np.array(w))


@pytest.mark.parametrize("name", FAMILIES)
def test_with_lengths_the_fused_ops_compute_the_real_tokens_only(name):
    layer, _ = _first_fused_layer(name)
    attn = layer.self_attn
    x = mx.random.normal((3, 4, 64), key=mx.random.key(1))
    lengths = [4, 1, 2]  # row 0 whole, rows 1 and 2 padded after their real tokens
    offset = mx.array([3, 9, 0], dtype=mx.int32)
    padded, ragged = _attention_input(layer, x, offset), _attention_input(layer, x, offset, mx.array(lengths))
    for want, got in zip(padded, ragged):
        want, got = np.array(want), np.array(got)
        for row, n in enumerate(lengths):
            np.testing.assert_allclose(got[row, :, :n], want[row, :, :n], rtol=1e-5, atol=1e-6)
            assert not got[row, :, n:].any()  # padding: zeros
    queries, keys, values = padded
    mask = mx.array(np.tril(np.ones((4, 4), dtype=bool)))
    fields = ("weight", "scales", "biases", "group_size", "bits")
    o, gate_up, down = (
        tuple(getattr(m, f) for f in fields)
        for m in (attn.o_proj, layer.mlp.gate_proj.projection_group, layer.mlp.down_proj)
    )

    def block(real):
        return mlxd_qmatmul.block_output(
            x,
            queries,
            keys,
            values,
            mask,
            False,
            attn.scale,
            o,
            layer.post_attention_layernorm.weight,
            layer.post_attention_layernorm.eps,
            gate_up,
            down,
            lengths=real,
        )

    want, got = np.array(block(None)), np.array(block(mx.array(lengths)))
    for row, n in enumerate(lengths):
        np.testing.assert_allclose(got[row, :n], want[row, :n], rtol=1e-5, atol=1e-6)
        assert np.array_equal(got[row, n:], np.array(x)[row, n:])  # padding: x as it came


@pytest.mark.parametrize("name", ["llama", "qwen3", "phi3", "gemma2", "lfm2"])
def test_a_verify_forward_of_rows_of_different_widths_keeps_the_padded_forwards_logits(name, monkeypatch):
    """Rows of different widths cost their real tokens only (ragged.py), fused layers or not (phi3's, gemma2's
    and lfm2's stay op by op on the kernel; lfm2's recurrent state unwinds by replay); the real positions'
    logits are the padded forward's."""
    from mlxd_engine import Engine

    if not architectures.available(name):
        pytest.skip(f"mlx-lm has no {name}")
    prompts = [architectures.prompt(n, seed) for n, seed in ((9, 1), (23, 2), (4, 3))]
    results = []
    for ragged in ("0", "1"):
        monkeypatch.setenv("MLXD_RAGGED_VERIFY", ragged)
        engine = Engine(architectures.loaded(name, model=_kernel_model(name)), max_sequences=4)
        assert engine.ragged_verify == (ragged == "1")
        seqs = [engine.add_sequence(prompt) for prompt in prompts]
        for seq in seqs:
            prefill_and_record(engine, seq)
        tokens = [[seqs[0].tokens[-1], 5, 6, 7, 8], [seqs[1].tokens[-1]], [seqs[2].tokens[-1], 9, 10]]
        results.append(np.array(engine.verify_rows(seqs, tokens)))
    padded, ragged_logits = results
    for row, n in enumerate(len(t) for t in tokens):
        np.testing.assert_allclose(ragged_logits[row, :n], padded[row, :n], rtol=1e-4, atol=1e-5)
        assert (ragged_logits[row, :n].argmax(-1) == padded[row, :n].argmax(-1)).all()


def _engine(model, storage: str = "contiguous", blocks: bool = True, monkeypatch=None):
    from mlxd_engine import Engine

    monkeypatch.setenv("MLXD_FUSE_BLOCKS", "1" if blocks else "0")
    return Engine(architectures.loaded("llama", model=model), max_sequences=4, storage=storage)


@pytest.mark.parametrize(
    ("name", "storage", "int8"),
    [
        ("llama", "contiguous", False),
        ("llama", "paged", False),
        ("qwen2", "paged", False),
        ("qwen3", "contiguous", False),
        ("llama", "contiguous", True),  # int8 activations (opt-in): the same int8 products, fused or not
    ],
)
def test_greedy_decode_is_the_same_with_and_without_fused_layers(name, storage, int8, monkeypatch):
    if int8 and not mlxd_qmatmul.int8_available(4):
        pytest.skip("no int8-activation kernel (AVX-512 VNNI) here")
    prompts = [architectures.prompt(n, seed) for n, seed in ((9, 1), (23, 2), (4, 3))]
    results = []
    for blocks in (False, True):
        engine = _engine(_kernel_model(_family(name), int8=int8), storage, blocks, monkeypatch)
        assert engine.fused_blocks == (len(_layers(engine.model)) if blocks else 0)
        alone = architectures.alone(engine, prompts[1], 12)
        rows = architectures.batched(engine, prompts, 10)
        seq = engine.add_sequence(prompts[0])
        prefill_and_record(engine, seq)
        logits = engine.verify(seq, [seq.tokens[-1], 5, 6, 7, 8])
        results.append((alone, rows, np.array(logits)))
    (alone0, rows0, verify0), (alone1, rows1, verify1) = results
    assert alone1 == alone0
    assert rows1 == rows0
    assert np.array_equal(verify1, verify0)


def test_layers_the_fused_ops_do_not_cover_stay_op_by_op(monkeypatch):
    from mlxd_engine.fused_blocks import fuse_blocks

    assert fuse_blocks(_kernel_model(attention_bias=True)) == 0  # biases: not in the fused ops
    if architectures.available("phi3"):
        assert fuse_blocks(_kernel_model("phi3")) == 0  # another layer class (q/k/v already one layer)
    assert _engine(_kernel_model(), blocks=False, monkeypatch=monkeypatch).fused_blocks == 0  # MLXD_FUSE_BLOCKS=0


def test_a_fused_layer_runs_its_own_ops_where_the_fused_ones_do_not_apply():
    from mlx_lm.models.cache import make_prompt_cache

    from mlxd_engine.fused_blocks import fuse_blocks
    from mlxd_engine.loading.kernel_layers import KernelQuantizedLinear

    model = _kernel_model()
    fuse_blocks(model)
    for _, layer in model.named_modules():
        if isinstance(layer, KernelQuantizedLinear):
            layer.kernel_max_rows = 4  # a 12-token prompt is past the kernel's rows: BLAS, op by op
    layer = _layers(model)[0]
    x = model.model.embed_tokens(mx.array([architectures.prompt(12, 1)]))
    want = llama.TransformerBlock.__call__(layer, x, "causal", make_prompt_cache(model)[0])
    assert np.array_equal(np.array(layer(x, "causal", make_prompt_cache(model)[0])), np.array(want))
    half = x.astype(mx.float16)  # another dtype
    want = llama.TransformerBlock.__call__(layer, half, "causal", None)
    assert np.array_equal(np.array(layer(half, "causal", None)), np.array(want))


def test_the_fused_ops_refuse_inputs_they_do_not_take():
    w, s, b = mx.quantize(mx.ones((96, 64)), group_size=32, bits=4)
    x = mx.ones((1, 1, 64))
    norm = mx.ones((64,))
    offset = mx.array(0, dtype=mx.int32)
    with pytest.raises(ValueError, match="q/k/v parts"):
        mlxd_qmatmul.attention_input(
            x, norm, 1e-5, (w, s, b, 32, 4, [32, 32, 32]), 4, 2, 16, offset, (16, False, 1e4, 1.0)
        )
    with pytest.raises(ValueError, match="float32"):
        mlxd_qmatmul.attention_input(
            x.astype(mx.float16), norm, 1e-5, (w, s, b, 32, 4, [64, 16, 16]), 4, 1, 16, offset, (16, False, 1e4, 1.0)
        )
    q = mx.ones((1, 4, 1, 16))
    kv = mx.ones((1, 2, 3, 16))
    o = mx.quantize(mx.ones((64, 64)), group_size=32, bits=4)
    gate_up = mx.quantize(mx.ones((256, 64)), group_size=32, bits=4)
    down = mx.quantize(mx.ones((64, 128)), group_size=32, bits=4)
    got = mlxd_qmatmul.block_output(
        x, q, kv, kv, None, False, 0.25, (*o, 32, 4), norm, 1e-5, (*gate_up, 32, 4), (*down, 32, 4)
    )
    assert got.shape == (1, 1, 64)
    with pytest.raises(ValueError, match="features"):  # down takes 128 inputs, gate/up give 96
        bad_gate_up = mx.quantize(mx.ones((192, 64)), group_size=32, bits=4)
        mlxd_qmatmul.block_output(
            x, q, kv, kv, None, False, 0.25, (*o, 32, 4), norm, 1e-5, (*bad_gate_up, 32, 4), (*down, 32, 4)
        )


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
def test_the_layer_over_a_span_of_the_buffers_is_the_layer_over_their_slices(dtype):
    layer, head_dim = _first_fused_layer("llama")
    attn = layer.self_attn
    slots, capacity, kv_heads, n = 4, 24, attn.n_kv_heads, 2
    x = mx.random.normal((2, n, 64), key=mx.random.key(5))
    starts = [7, 3]  # rows in slots 1 and 2, at different positions: the mask says what each reads
    queries, _, _ = _attention_input(layer, x, mx.array(starts, dtype=mx.int32))
    k_buf, v_buf = (
        mx.random.normal((slots, kv_heads, capacity, head_dim), key=mx.random.key(s)).astype(dtype) for s in (6, 7)
    )
    read_length = max(starts) + n
    query_at = mx.array(starts)[:, None, None, None] + mx.arange(n)[None, None, :, None]
    mask = mx.arange(read_length)[None, None, None, :] <= query_at
    fields = ("weight", "scales", "biases", "group_size", "bits")
    o, gate_up, down = (
        tuple(getattr(m, f) for f in fields)
        for m in (attn.o_proj, layer.mlp.gate_proj.projection_group, layer.mlp.down_proj)
    )
    norm = (layer.post_attention_layernorm.weight, layer.post_attention_layernorm.eps)
    for first, rows, m in ((1, 2, mask), (0, 1, None)):
        keys, values = k_buf[first : first + rows, :, :read_length], v_buf[first : first + rows, :, :read_length]
        q = queries[:rows]
        want = mlxd_qmatmul.block_output(x[:rows], q, keys, values, m, False, attn.scale, o, *norm, gate_up, down)
        got = mlxd_qmatmul.block_output_span(
            x[:rows], q, k_buf, v_buf, first, read_length, m, False, attn.scale, o, *norm, gate_up, down
        )
        assert np.array_equal(np.array(got), np.array(want))
    with pytest.raises(ValueError, match="span"):  # slots 3 and 4 of 4
        mlxd_qmatmul.block_output_span(
            x, queries, k_buf, v_buf, 3, read_length, mask, False, attn.scale, o, *norm, gate_up, down
        )
    with pytest.raises(ValueError, match="span"):  # past the capacity
        mlxd_qmatmul.block_output_span(
            x, queries, k_buf, v_buf, 0, capacity + 1, None, False, attn.scale, o, *norm, gate_up, down
        )
