"""The kernel's mixture-of-experts product (``gather_quantized_matmul``) against MLX's ``mx.gather_qmm``.

Skipped as a whole where the extension is not built (mixture-of-experts layers then keep MLX's own path).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mlxd_qmatmul

pytestmark = pytest.mark.skipif(not mlxd_qmatmul.available(), reason=mlxd_qmatmul.unavailable_reason())


def _experts(rng, E, N, K, group_size, bits, scale_dtype=mx.float32):
    w = mx.array(rng.normal(size=(E, N, K)).astype(np.float32) * 0.05)
    wq, s, b = mx.quantize(w, group_size=group_size, bits=bits)
    return wq, s.astype(scale_dtype), b.astype(scale_dtype)


def _reference(x, wq, s, b, experts, group_size, bits):
    """mx.gather_qmm as mlx-lm's QuantizedSwitchLinear calls it, one row a product."""
    wide = [a.astype(mx.float32) for a in (s, b)]
    out = mx.gather_qmm(x[:, None, :], wq, *wide, rhs_indices=experts, transpose=True, group_size=group_size, bits=bits)
    return out[:, 0, :]


def _close(got, want, K):
    got, want = np.array(got), np.array(want)
    bound = 4 * K * np.finfo(np.float32).eps * (np.abs(want).max() + 1)  # float32 rounding, another order
    assert np.abs(got - want).max() <= bound, (np.abs(got - want).max(), bound)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_matches_gather_qmm_over_random_experts_and_rows(bits, group_size):
    rng = np.random.default_rng(bits * 1000 + group_size)
    for scale_dtype in (mx.float32, mx.float16, mx.bfloat16):
        E = int(rng.integers(1, 9))
        N = int(rng.integers(1, 120))
        K = group_size * int(rng.integers(1, 6))
        wq, s, b = _experts(rng, E, N, K, group_size, bits, scale_dtype)
        # 1-3 rows (decode: experts of one or two rows each), 40 and 97 (a prompt chunk: experts of many rows,
        # the AMX kernel's row counts where the CPU has it)
        for rows in (1, 3, 40, 97):
            x = mx.array(rng.normal(size=(rows, K)).astype(np.float32))
            experts = mx.array(rng.integers(0, E, rows).astype(np.uint32))
            got = mlxd_qmatmul.gather_quantized_matmul(x, wq, s, b, experts, group_size, bits)
            assert got.shape == (rows, N) and got.dtype == mx.float32
            _close(got, _reference(x, wq, s, b, experts, group_size, bits), K)


def test_each_row_takes_its_own_expert_whatever_the_order():
    rng = np.random.default_rng(7)
    wq, s, b = _experts(rng, 5, 64, 256, 64, 4)
    x = mx.array(rng.normal(size=(12, 256)).astype(np.float32))
    experts = mx.array([4, 0, 4, 2, 2, 2, 1, 0, 4, 3, 3, 4], dtype=mx.int32)
    together = mlxd_qmatmul.gather_quantized_matmul(x, wq, s, b, experts, 64, 4)
    for r in range(12):
        e = int(experts[r])
        alone = mlxd_qmatmul.quantized_matmul(x[r : r + 1], wq[e], s[e], b[e], 64, 4)
        np.testing.assert_array_equal(np.array(together[r : r + 1]), np.array(alone))


def test_leading_shape_and_dtype_follow_x():
    rng = np.random.default_rng(3)
    wq, s, b = _experts(rng, 3, 32, 128, 32, 8)
    x = mx.array(rng.normal(size=(2, 4, 128)).astype(np.float32))
    experts = mx.array(rng.integers(0, 3, (2, 4)).astype(np.uint32))
    got = mlxd_qmatmul.gather_quantized_matmul(x, wq, s, b, experts, 32, 8)
    assert got.shape == (2, 4, 32)
    want = _reference(x.reshape(8, 128), wq, s, b, experts.reshape(8), 32, 8)
    _close(got.reshape(8, 32), want, 128)
    half = mlxd_qmatmul.gather_quantized_matmul(x.astype(mx.float16), wq, s, b, experts, 32, 8)
    assert half.dtype == mx.float16


def test_a_row_naming_no_expert_comes_out_as_zeros_and_the_others_are_unchanged():
    rng = np.random.default_rng(5)
    wq, s, b = _experts(rng, 4, 48, 128, 32, 4)
    x = mx.array(rng.normal(size=(3, 128)).astype(np.float32))
    got = np.array(mlxd_qmatmul.gather_quantized_matmul(x, wq, s, b, mx.array([1, 9, 3]), 32, 4))
    assert not got[1].any()
    _close(got[[0, 2]], _reference(x[mx.array([0, 2])], wq, s, b, mx.array([1, 3]), 32, 4), 128)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(bits=3), "bits must be 4 or 8"),
        (dict(group_size=16), "group size must be 32, 64 or 128"),
        (dict(experts=mx.array([0, 1])), "one expert a row"),
        (dict(experts=mx.array([0.0, 1.0, 2.0])), "integer"),
        (dict(x=mx.zeros((3, 64))), "features"),
    ],
)
def test_a_layout_the_kernel_does_not_take_is_refused_with_its_reason(change, message):
    rng = np.random.default_rng(1)
    wq, s, b = _experts(rng, 3, 32, 128, 32, 4)
    args = dict(x=mx.zeros((3, 128)), w=wq, scales=s, biases=b, experts=mx.array([0, 1, 2]), group_size=32, bits=4)
    args.update(change)
    with pytest.raises(ValueError, match=message):
        mlxd_qmatmul.gather_quantized_matmul(**args)
