"""The attention op over keys and values kept as float16 (``mlxd --kv-dtype float16``): it widens them as it
reads them, exactly, so its result is to the bit what it gives for float32 keys and values holding the same
values, on every path (dense rows a block at a time, strided rows, the fused layer op's token-major output).

Skipped as a whole where the extension is not built.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mlxd_qmatmul
from mlxd_engine import cpu_fusion

from .every_isa import results_on_every_isa

pytestmark = pytest.mark.skipif(not mlxd_qmatmul.available(), reason=mlxd_qmatmul.unavailable_reason())


def _half(rng, shape, strided: bool) -> mx.array:
    """float16 [B, H, S, D]: dense, or a view whose last axis is strided (keys stored transposed)."""
    B, H, S, D = shape
    if not strided:
        return mx.array(rng.normal(size=shape).astype(np.float16))
    return mx.array(rng.normal(size=(B, H, D, S)).astype(np.float16)).swapaxes(2, 3)


def test_half_keys_and_values_give_the_float32_result_of_their_values_to_the_bit():
    rng = np.random.default_rng(11)
    for case in range(40):
        B, kv_heads, repeats = int(rng.choice([1, 3])), int(rng.choice([1, 2])), int(rng.choice([1, 3]))
        L = int(rng.choice([1, 5, 9]))
        S, D = L + int(rng.choice([0, 7, 130])), int(rng.choice([16, 64, 72]))
        q = mx.array(rng.normal(size=(B, kv_heads * repeats, L, D)).astype(np.float32))
        k = _half(rng, (B, kv_heads, S, D), strided=case % 4 == 3)
        v = _half(rng, (B, kv_heads, S, D), strided=case % 5 == 4)
        mask = None if case % 2 else mx.array(rng.random(size=(B, 1, L, S)) < 0.7)
        causal = mask is None and case % 3 == 0
        got = mlxd_qmatmul.attention(q, k, v, D**-0.5, causal, mask)
        wide = mlxd_qmatmul.attention(q, k.astype(mx.float32), v.astype(mx.float32), D**-0.5, causal, mask)
        assert np.array_equal(np.array(got), np.array(wide)), (case, q.shape, k.shape)
        want = mx.fast.scaled_dot_product_attention(
            q, k.astype(mx.float32), v.astype(mx.float32), scale=D**-0.5, mask="causal" if causal else mask
        )
        assert float(mx.abs(got - want).max()) < 1e-5


@pytest.mark.parametrize("strided", [False, True])
def test_every_half_is_widened_exactly(strided):
    """One key, so each output is its value times one: every finite half, subnormals and infinities included."""
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    halves = halves[~np.isnan(halves)]
    n = halves.size
    if strided:
        values = mx.array(np.repeat(halves, 2)).reshape(1, 1, 1, 2 * n)[..., ::2]
    else:
        values = mx.array(halves).reshape(1, 1, 1, n)
    keys = mx.zeros((1, 1, 1, 8), dtype=mx.float16)
    out = mlxd_qmatmul.attention(mx.zeros((1, 1, 1, 8)), keys, values, 1.0, False, None)
    assert np.array_equal(np.array(out).ravel(), halves.astype(np.float32) + 0.0)


def test_mixed_or_half_queries_are_refused_by_the_op_and_kept_off_it_by_mlx_lm_attention():
    q, k = mx.zeros((1, 2, 1, 16)), mx.zeros((1, 1, 4, 16), dtype=mx.float16)
    with pytest.raises(ValueError, match="k and v must both be float32 or both float16"):
        mlxd_qmatmul.attention(q, k, k.astype(mx.float32), 1.0, False, None)
    with pytest.raises(ValueError, match="q must be float32"):
        mlxd_qmatmul.attention(q.astype(mx.float16), k, k, 1.0, False, None)
    rng = np.random.default_rng(2)
    q = mx.array(rng.normal(size=(1, 4, 3, 32)).astype(np.float32))
    k = mx.array(rng.normal(size=(1, 2, 20, 32)).astype(np.float16))
    out = cpu_fusion.cpu_attention(q, k, k, None, 0.2, "causal")  # a float16 cache: the one op
    want = mx.fast.scaled_dot_product_attention(q, k.astype(mx.float32), k.astype(mx.float32), scale=0.2, mask="causal")
    assert float(mx.abs(out - want).max()) < 1e-5
    half_q = cpu_fusion.cpu_attention(q.astype(mx.float16), k, k, None, 0.2, "causal")  # MLX's path
    assert half_q.dtype == mx.float16


@pytest.mark.integration  # starts a process
def test_every_instruction_set_reads_halves_as_their_float32_values(tmp_path):
    """The portable forms (MLXD_QMM_ISA=sse2, what a CPU without AVX2 runs) and the AVX2 ones read float16
    keys and values directly at decode (up to 4 query rows a key head) and widened beyond: each path gives its
    own float32 result to the bit, and every path agrees with MLX's attention."""
    script = (
        "import mlx.core as mx, numpy as np, mlxd_qmatmul as q\n"
        "rng = np.random.default_rng(5); out = []\n"
        "for L in (1, 4, 9):\n"
        "    qs = mx.array(rng.normal(size=(2, 6, L, 64)).astype(np.float32))\n"
        "    k = mx.array(rng.normal(size=(2, 2, L + 70, 64)).astype(np.float16))\n"
        "    v = mx.array(rng.normal(size=(2, 2, L + 70, 64)).astype(np.float16))\n"
        "    got = q.attention(qs, k, v, 0.125, True, None)\n"
        "    wide = q.attention(qs, k.astype(mx.float32), v.astype(mx.float32), 0.125, True, None)\n"
        "    assert np.array_equal(np.array(got), np.array(wide)), L\n"
        "    want = mx.fast.scaled_dot_product_attention(qs, k.astype(mx.float32), v.astype(mx.float32), "
        "scale=0.125, mask='causal')\n"
        "    assert float(mx.abs(got - want).max()) < 1e-5, L\n"
        "    out.append(np.array(got).ravel())\n"
        "print(q.kernel_isa() + ('+amx' if q.amx_available() else '')); np.save(sys.argv[1], np.concatenate(out))\n"
    )
    results = results_on_every_isa(script, tmp_path)
    first = next(iter(results.values()))
    for isa, got in results.items():
        np.testing.assert_allclose(got, first, rtol=1e-5, atol=1e-5, err_msg=isa)
