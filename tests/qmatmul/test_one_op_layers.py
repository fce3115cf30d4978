"""The extension's RoPE and RMSNorm against MLX's own, bit for bit, and the strided-x quantized matmul.

Skipped as a whole where the extension is not built (the engine then keeps its compiled layers).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mlxd_qmatmul
from mlxd_engine.cpu_fusion import FusedRMSNorm, FusedRoPE, fuse_cpu_layers

pytestmark = pytest.mark.skipif(not mlxd_qmatmul.available(), reason=mlxd_qmatmul.unavailable_reason())


def _layout(rng, shape):
    """A float32 array of ``shape``: dense, or a transposed view (as attention's queries and keys are)."""
    B, N, T, D = shape
    if rng.random() < 0.5:
        return mx.array(rng.normal(size=shape).astype(np.float32))
    return mx.array(rng.normal(size=(B, T, N, D)).astype(np.float32)).transpose(0, 2, 1, 3)


def test_rope_is_bit_identical_to_mlx_over_shapes_offsets_and_settings():
    rng = np.random.default_rng(0)
    for _ in range(120):
        B, N, T = int(rng.choice([1, 2, 8])), int(rng.choice([1, 3, 9])), int(rng.choice([1, 2, 9, 17, 40]))
        D = int(rng.choice([32, 64, 80, 128]))
        dims = int(rng.choice([D, D // 2]))
        traditional, base = bool(rng.random() < 0.3), float(rng.choice([100.0, 10000.0, 500000.0]))
        scale = float(rng.choice([1.0, 0.5, 0.125]))
        x = _layout(rng, (B, N, T, D))
        if rng.random() < 0.25:
            x = x[:, 0]  # 3-D input: (B, T, D)
        if rng.random() < 0.5:
            offset = mx.array(rng.integers(0, 5000, size=x.shape[0]), dtype=mx.int32)
        else:
            offset = mx.array(int(rng.integers(0, 200000)), dtype=mx.int32)
        want = mx.fast.rope(x, dims, traditional=traditional, base=base, scale=scale, offset=offset)
        got = mlxd_qmatmul.rope(x, offset, dims, traditional, base, scale)
        assert got.shape == want.shape
        assert mx.array_equal(got, want).item(), (x.shape, dims, traditional, base, scale, offset.shape)


def test_rms_norm_is_bit_identical_to_mlx_over_shapes_and_scales():
    rng = np.random.default_rng(1)
    for _ in range(120):
        D = int(rng.choice([7, 64, 576, 960, 2048]))
        lead = [(1,), (1, 1), (4, 1), (2, 9), (3, 40)][int(rng.integers(0, 5))]
        x = mx.array((rng.normal(size=(*lead, D)) * rng.choice([1e-3, 1.0, 30.0])).astype(np.float32))
        if len(lead) == 2 and rng.random() < 0.3:
            x = mx.array(rng.normal(size=(D, *lead)).astype(np.float32)).transpose(1, 2, 0)
        weight = mx.array(rng.normal(size=(D,)).astype(np.float32))
        eps = float(rng.choice([1e-5, 1e-6]))
        assert mx.array_equal(mlxd_qmatmul.rms_norm(x, weight, eps), mx.fast.rms_norm(x, weight, eps)).item()


def test_bad_inputs_are_refused_with_a_message():
    with pytest.raises(ValueError, match="float32"):
        mlxd_qmatmul.rope(mx.zeros((1, 1, 2, 8), dtype=mx.float16), mx.array(0), 8, False, 10000.0, 1.0)
    with pytest.raises(ValueError, match="offset"):
        mlxd_qmatmul.rope(mx.zeros((2, 1, 2, 8)), mx.array([0, 1, 2]), 8, False, 10000.0, 1.0)
    with pytest.raises(ValueError, match="weight"):
        mlxd_qmatmul.rms_norm(mx.zeros((1, 8)), mx.zeros((4,)), 1e-5)


def test_fused_layers_use_the_one_op_kernels_and_keep_results():
    import mlx.nn as nn

    model = nn.Sequential(nn.RMSNorm(64), nn.RoPE(64, base=10000.0))
    assert fuse_cpu_layers(model) == 2
    norm, rope = model.layers
    assert type(norm) is FusedRMSNorm and type(rope) is FusedRoPE
    x = mx.random.normal((2, 4, 5, 64))
    offset = mx.array([3, 11], dtype=mx.int32)
    assert mx.array_equal(norm(x), mx.fast.rms_norm(x, norm.weight, norm.eps)).item()
    assert mx.array_equal(
        rope(x, offset), mx.fast.rope(x, 64, traditional=False, base=10000.0, scale=1.0, offset=offset)
    ).item()
    out = rope(x, offset)
    assert "CpuRope" in _graph_ops(out)


def _graph_ops(array) -> str:
    import tempfile

    with tempfile.NamedTemporaryFile("r", suffix=".dot") as dot:
        mx.export_to_dot(dot.name, array)
        return open(dot.name).read()


def test_quantized_matmul_takes_a_strided_x_without_a_copy_op():
    rng = np.random.default_rng(2)
    w = mx.array(rng.normal(size=(96, 128)).astype(np.float32))
    wq, s, b = mx.quantize(w, group_size=64, bits=4)
    mx.eval(wq, s, b)
    x = mx.array(rng.normal(size=(128, 3)).astype(np.float32)).T  # a transposed view
    got = mlxd_qmatmul.quantized_matmul(x, wq, s, b, 64, 4)
    want = mx.quantized_matmul(x, wq, s, b, transpose=True, group_size=64, bits=4)
    assert np.abs(np.array(got) - np.array(want)).max() <= 1e-4
    graph = _graph_ops(mlxd_qmatmul.quantized_matmul(x, wq, s, b, 64, 4))
    assert "Contiguous" not in graph  # evaluated weights and x go in as they are


def test_attention_matches_mlx_within_rounding_over_heads_masks_and_layouts():
    rng = np.random.default_rng(3)
    for _ in range(80):
        B, kv_heads, repeats = int(rng.choice([1, 2, 8])), int(rng.choice([1, 3])), int(rng.choice([1, 3]))
        heads, L = kv_heads * repeats, int(rng.choice([1, 2, 9, 16]))
        S, D = L + int(rng.choice([0, 1, 30, 200])), int(rng.choice([32, 64, 80]))
        q = mx.array(rng.normal(size=(B, L, heads, D)).astype(np.float32)).transpose(0, 2, 1, 3)
        buffer = mx.array(rng.normal(size=(B + 2, kv_heads, S + 7, D)).astype(np.float32))
        k = buffer[1 : B + 1, :, :S]  # a view into a larger cache, as the KV storage hands it out
        v = mx.array(rng.normal(size=(B, kv_heads, S, D)).astype(np.float32))
        kind = int(rng.integers(0, 4))
        if kind == 2:
            mask = rng.random(size=(B, 1, L, S)) < 0.8
            mask[..., 0] = True
            mask = mx.array(mask)
        elif kind == 3:
            mask = mx.array((rng.random(size=(L, S)) * -3).astype(np.float32))
        else:
            mask = None
        stock_mask = "causal" if kind == 1 else mask
        want = mx.fast.scaled_dot_product_attention(q, k, v, scale=D**-0.5, mask=stock_mask)
        got = mlxd_qmatmul.attention(q, k, v, D**-0.5, kind == 1, mask)
        assert float(mx.abs(got - want).max()) < 1e-5, (kind, q.shape, k.shape)


def test_each_query_of_a_verify_or_chunk_gets_its_own_decode_result_to_the_bit():
    """Greedy verify equals plain decode only if a query's attention has the same bits whatever rows share
    its op: each of L causal queries (every query head of a key head, several at once) gives what it gets
    alone at its position (one query over its visible keys), for float32 and float16 keys and values, key
    counts off multiples of eight, and L on both sides of the rows read a block at a time."""
    rng = np.random.default_rng(11)
    for dtype in (mx.float32, mx.float16):
        for L, extra, D, kv_heads, repeats in (
            (2, 5, 64, 1, 3),
            (5, 61, 64, 3, 3),
            (9, 200, 64, 3, 3),
            (16, 13, 32, 2, 1),
            (9, 70, 80, 1, 4),
        ):
            S = L + extra
            q = mx.array(rng.normal(size=(1, kv_heads * repeats, L, D)).astype(np.float32))
            k = mx.array(rng.normal(size=(1, kv_heads, S, D)).astype(np.float32)).astype(dtype)
            v = mx.array(rng.normal(size=(1, kv_heads, S, D)).astype(np.float32)).astype(dtype)
            together = np.array(mlxd_qmatmul.attention(q, k, v, D**-0.5, True, None))
            for i in range(L):
                seen = S - L + i + 1
                alone = mlxd_qmatmul.attention(q[:, :, i : i + 1], k[:, :, :seen], v[:, :, :seen], D**-0.5, True, None)
                assert np.array_equal(together[:, :, i : i + 1], np.array(alone)), (dtype, L, S, D, i)


def test_attention_over_a_span_past_the_context_scores_only_up_to_the_last_visible_key():
    """Compiled decode reads a slot's whole span with a mask hiding the positions past each row's context:
    the op scores keys up to the last one the mask shows (rounded up to eight), with the result of reading
    the context alone, to the bit, and MLX's within rounding; a mask that hides every key stays MLX's."""
    rng = np.random.default_rng(5)
    for context, L, S in ((64, 1, 256), (200, 9, 512), (8, 4, 256), (256, 1, 256)):
        q = mx.array(rng.normal(size=(1, 6, L, 32)).astype(np.float32))
        k = mx.array(rng.normal(size=(1, 2, S, 32)).astype(np.float32))
        v = mx.array(rng.normal(size=(1, 2, S, 32)).astype(np.float32))
        positions = np.arange(S)[None, :] <= (context - L + np.arange(L))[:, None]
        mask = mx.array(positions[None, None])
        got = mlxd_qmatmul.attention(q, k, v, 0.25, False, mask)
        exact = mlxd_qmatmul.attention(q, k[:, :, :context], v[:, :, :context], 0.25, False, mask[..., :context])
        assert np.array_equal(np.array(got), np.array(exact)), context
        want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=mask)
        assert float(mx.abs(got - want).max()) < 1e-5
    hidden = mx.zeros((1, 1, 1, 64), dtype=mx.bool_)
    q, k, v = mx.ones((1, 2, 1, 16)), mx.random.normal((1, 2, 64, 16)), mx.random.normal((1, 2, 64, 16))
    got = mlxd_qmatmul.attention(q, k, v, 0.25, False, hidden)  # every weight equal: the mean of the values
    np.testing.assert_allclose(np.array(got)[0, :, 0], np.array(v.mean(axis=2))[0], rtol=1e-5, atol=1e-6)


def test_mlx_lm_attention_takes_the_one_op_path_for_float32_at_any_length():
    from mlxd_engine import cpu_fusion

    q, k, v = mx.random.normal((1, 4, 2, 32)), mx.random.normal((1, 2, 10, 32)), mx.random.normal((1, 2, 10, 32))
    out = cpu_fusion.cpu_attention(q, k, v, None, 32**-0.5, "causal")
    assert "CpuAttention" in _graph_ops(out)
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=32**-0.5, mask="causal")
    assert float(mx.abs(out - want).max()) < 1e-5
    long_q = mx.random.normal((1, 4, 300, 32))  # a prompt chunk, split over the kernel's threads
    long_k = mx.random.normal((1, 2, 340, 32))
    out = cpu_fusion.cpu_attention(long_q, long_k, long_k, None, 0.1, "causal")
    assert "CpuAttention" in _graph_ops(out)
    want = mx.fast.scaled_dot_product_attention(long_q, long_k, long_k, scale=0.1, mask="causal")
    assert float(mx.abs(out - want).max()) < 1e-5
    half = long_q.astype(mx.float16)
    assert "CpuAttention" not in _graph_ops(cpu_fusion.cpu_attention(half, half, half, None, 0.1, "causal"))


def test_swiglu_is_bit_identical_to_mlx_lm_over_shapes_layouts_and_extremes():
    from mlx_lm.models.activations import swiglu

    rng = np.random.default_rng(4)
    for shape in [(1, 1, 1536), (8, 9, 384), (3, 7, 13), (2, 5), (17,), (64, 1536)]:
        gate = rng.normal(size=shape).astype(np.float32) * 6
        gate[rng.random(size=shape) < 0.02] *= 40  # past exp's +-88 clamp
        gate, up = mx.array(gate), mx.array(rng.normal(size=shape).astype(np.float32))
        assert mx.array_equal(mlxd_qmatmul.swiglu(gate, up), swiglu(gate, up)).item(), shape
    # a transposed view is read as laid out
    gate = mx.array(rng.normal(size=(16, 9)).astype(np.float32)).T
    up = mx.array(rng.normal(size=(9, 16)).astype(np.float32))
    assert mx.array_equal(mlxd_qmatmul.swiglu(gate, up), swiglu(gate, up)).item()
    special = mx.array([0.0, -0.0, 88.5, -88.5, 100.0, -100.0, 1e-30, 87.9, -87.9, 20.0, -20.0, np.inf, -np.inf])
    ones = mx.ones_like(special)
    assert mx.array_equal(mlxd_qmatmul.swiglu(special, ones), swiglu(special, ones), equal_nan=True).item()
    nan = mx.array([np.nan, 1.0])
    assert np.isnan(np.array(mlxd_qmatmul.swiglu(nan, mx.ones_like(nan)))[0])
    with pytest.raises(ValueError, match="same shape"):
        mlxd_qmatmul.swiglu(mx.zeros((2, 3)), mx.zeros((3, 2)))
    with pytest.raises(ValueError, match="float32"):
        mlxd_qmatmul.swiglu(mx.zeros((2,), dtype=mx.float16), mx.zeros((2,), dtype=mx.float16))


def test_mlx_lm_model_files_take_the_one_op_swiglu_and_keep_their_logits():
    """An mlx-lm qwen3 whose model file calls ``swiglu``: after fusion its MLP runs the extension's op, and
    the logits are those the fused model gives with mlx-lm's swiglu, bit for bit."""
    from mlx_lm.models import activations, qwen3

    from mlxd_engine import cpu_fusion

    from ..engine.architectures import build

    model = build("qwen3", seed=5)
    tokens = mx.array([[3, 14, 15, 92, 65, 35, 89, 79]])
    stock_namespace = qwen3.swiglu
    try:
        cpu_fusion.fuse_cpu_layers(model)
        assert qwen3.swiglu is cpu_fusion.cpu_swiglu
        got = model(tokens)
        qwen3.swiglu = activations.swiglu
        want = model(tokens)
        assert "CpuSwiglu" in _graph_ops(got)
        assert mx.array_equal(got, want).item()
    finally:
        qwen3.swiglu = stock_namespace
