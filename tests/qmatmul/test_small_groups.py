"""8-bit weights in groups of 16 (a GGUF file's Q6_K / Q3_K / Q2_K tensors, mlxd_engine.loading.group16) on the
kernel: not an MLX format, so the reference is the float64 product of the dequantized weights."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mlxd_qmatmul
from mlxd_engine.loading.kernel_layers import dequantized

from .every_isa import results_on_every_isa

pytestmark = pytest.mark.skipif(not mlxd_qmatmul.available(), reason=mlxd_qmatmul.unavailable_reason())


def random_small_groups(rng, n: int, k: int, scale_dtype=np.float32):
    codes = rng.integers(0, 64, (n, k), dtype=np.uint8)  # the K-quants' codes have at most 6 bits
    # as a K-quant's: a float16 factor times a small integer (so scale * code is exact in float32)
    factor = (rng.random((n, 1)) * 0.002).astype(np.float16).astype(np.float32)
    scales = (factor * rng.integers(-32, 32, (n, k // 16))).astype(scale_dtype)
    biases = (-32 * scales.astype(np.float32)).astype(scale_dtype)
    packed = mx.array(codes.view(np.uint32).reshape(n, k // 4))
    dense = codes.reshape(n, k // 16, 16).astype(np.float64) * scales.astype(np.float64)[..., None]
    dense += biases.astype(np.float64)[..., None]
    return packed, mx.array(scales), mx.array(biases), dense.reshape(n, k)


def _close_to(got, x, dense):
    want = x.astype(np.float64) @ dense.T
    # float32 rounding of a K-term dot product
    bound = 4 * x.shape[1] * np.finfo(np.float32).eps * (np.abs(x) @ np.abs(dense).T).max()
    assert np.abs(np.array(got) - want).max() <= bound


@pytest.mark.parametrize("scale_dtype", [np.float32, np.float16])
def test_products_of_every_row_count_match_the_dequantized_weights(scale_dtype):
    rng = np.random.default_rng(16)
    for n, k in ((1, 32), (37, 256), (70, 544), (300, 1536)):
        w, s, b, dense = random_small_groups(rng, n, k, scale_dtype)
        for rows in (1, 2, 3, 5, 6, 8, 9, 11, 16, 17, 72):  # 8 and more on AMX where the CPU has it
            x = rng.standard_normal((rows, k)).astype(np.float32)
            _close_to(mlxd_qmatmul.quantized_matmul(mx.array(x), w, s, b, 16, 8), x, dense)


def test_dequantized_is_the_same_float32_arithmetic():
    rng = np.random.default_rng(3)
    w, s, b, dense = random_small_groups(rng, 9, 64)
    got = np.array(dequantized(w, s, b, 16, 8))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, dense.astype(np.float32))  # exact: scale * code needs under 24 bits
    rows = np.array(dequantized(w[mx.array([4, 0])], s[mx.array([4, 0])], b[mx.array([4, 0])], 16, 8))
    np.testing.assert_array_equal(rows, got[[4, 0]])


@pytest.mark.integration  # starts processes
def test_every_instruction_set_agrees(tmp_path):
    script = (
        "import mlx.core as mx, numpy as np, mlxd_qmatmul as q\n"
        "rng = np.random.default_rng(5)\n"
        "codes = rng.integers(0, 64, (70, 384), dtype=np.uint8)\n"
        "w = mx.array(codes.view(np.uint32).reshape(70, 96))\n"
        "s = mx.array((rng.integers(-32, 32, (70, 24)) / 1024).astype(np.float32)); b = -32 * s\n"
        "x = mx.array(rng.standard_normal((11, 384)).astype(np.float32))\n"
        "print(q.kernel_isa() + ('+amx' if q.amx_available() else ''))\n"
        "np.save(sys.argv[1], np.array(q.quantized_matmul(x, w, s, b, 16, 8)))\n"
    )
    results = results_on_every_isa(script, tmp_path)
    first = next(iter(results.values()))
    for isa, got in results.items():
        np.testing.assert_allclose(got, first, rtol=1e-5, atol=1e-5 * np.abs(first).max(), err_msg=isa)


def test_groups_of_16_are_taken_for_8_bits_only_and_with_whole_blocks():
    assert mlxd_qmatmul.supports(8, 16) and not mlxd_qmatmul.supports(4, 16)
    rng = np.random.default_rng(7)
    w, s, b, _ = random_small_groups(rng, 8, 64)
    with pytest.raises(ValueError, match="group size must be 32, 64 or 128"):
        mlxd_qmatmul.quantized_matmul(mx.zeros((1, 128)), mx.zeros((8, 16), mx.uint32), s, b, 16, 4)
    w48, s48, b48, _ = random_small_groups(rng, 8, 48)
    with pytest.raises(ValueError, match="multiple of 32"):
        mlxd_qmatmul.quantized_matmul(mx.zeros((1, 48)), w48, s48, b48, 16, 8)
    experts = mx.zeros((1,), mx.uint32)
    with pytest.raises(ValueError, match="experts layer's group size"):
        mlxd_qmatmul.gather_quantized_matmul(mx.zeros((1, 64)), w[None], s[None], b[None], experts, 16, 8)
    # the opt-in int8 activations keep the float kernel here (they need groups of 32 or more)
    x = mx.array(rng.standard_normal((2, 64)).astype(np.float32))
    plain = mlxd_qmatmul.quantized_matmul(x, w, s, b, 16, 8)
    assert mx.array_equal(mlxd_qmatmul.quantized_matmul(x, w, s, b, 16, 8, int8_activations=True), plain).item()
