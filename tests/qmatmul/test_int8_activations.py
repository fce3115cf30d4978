"""The opt-in int8-activation kernel (4- and 8-bit weights, AVX-512 VNNI) against an exact model of its arithmetic.

The kernel rounds x to int8 in blocks of ``INT8_BLOCK`` (scale = block max / 127), multiplies with the weights'
codes as integers, scales each partial sum by its weight group's scale times its x block's scale, and adds
each group's bias times the exact float sum of x over the group. The reference below does the same in
float64 from the same int8 values, so the only difference allowed is float32 rounding.

Skipped where the CPU has no AVX-512 VNNI (the flag is then ignored: checked by the last test).
"""

from __future__ import annotations

import os
import subprocess
import sys

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import mlxd_qmatmul

pytestmark = pytest.mark.skipif(not mlxd_qmatmul.available(), reason=mlxd_qmatmul.unavailable_reason())
needs_int8 = pytest.mark.skipif(
    not mlxd_qmatmul.int8_available(4), reason="no int8-activation kernel on this CPU (AVX-512 VNNI)"
)


BLOCK = mlxd_qmatmul.INT8_BLOCK


def _unpack(wq: np.ndarray, K: int, bits: int) -> np.ndarray:
    """MLX's packing: element j of a row is code j % (32 / bits) of its uint32, lowest bits first."""
    per_word = 32 // bits
    shifts = np.arange(per_word, dtype=np.uint32) * bits
    return ((wq[:, :, None] >> shifts) & ((1 << bits) - 1)).reshape(wq.shape[0], K).astype(np.float64)


def _int8_reference(x, wq, s, b, group_size, bits=4):
    x = np.asarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
    K = x.shape[1]
    q_w = _unpack(np.asarray(wq), K, bits)
    scale_w = np.repeat(np.asarray(s.astype(mx.float32), dtype=np.float64), group_size, axis=1)
    bias_w = np.asarray(b.astype(mx.float32), dtype=np.float64)
    blocks = x.reshape(x.shape[0], K // BLOCK, BLOCK)
    amax = np.abs(blocks).max(axis=2, keepdims=True)
    inverse = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), np.float32(0)).astype(np.float32)
    q_x = np.rint(blocks * inverse).reshape(x.shape)  # float32 product, rounded half to even (lrintf)
    scale_x = np.repeat(
        (amax / np.float32(127)).astype(np.float32).astype(np.float64).reshape(x.shape[0], -1), BLOCK, axis=1
    )
    weighted = (q_x * scale_x) @ (q_w * scale_w).T
    group_sums = x.astype(np.float64).reshape(x.shape[0], K // group_size, group_size).sum(axis=2)
    return weighted + group_sums @ bias_w.T


def _close(got, want, K, scale):
    got = np.asarray(got, dtype=np.float64).reshape(want.shape)
    bound = 8 * K * np.finfo(np.float32).eps * (scale + 1)
    assert np.abs(got - want).max() <= bound, (np.abs(got - want).max(), bound)


@needs_int8
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("scale_dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_int8_kernel_is_its_exact_arithmetic_over_shapes_and_rows(bits, group_size, scale_dtype):
    rng = np.random.default_rng(group_size + bits)
    for _ in range(3):
        N = int(rng.integers(1, 200))
        K = group_size * int(rng.integers(1, 10))  # not always a multiple of 128: padded chunks
        w = mx.array(rng.normal(size=(N, K)).astype(np.float32))
        wq, s, b = mx.quantize(w, group_size=group_size, bits=bits)
        s, b = s.astype(scale_dtype), b.astype(scale_dtype)
        for rows in (1, 2, 3, 4, 5, 8, 9, 16, 17, 72):
            x = mx.array((rng.normal(size=(rows, K)) * rng.choice([0.01, 1.0, 30.0])).astype(np.float32))
            if rows == 3:
                x[1] = 0  # a row of zeros: scale 0, no division by zero
            want = _int8_reference(x, wq, s, b, group_size, bits)
            got = mlxd_qmatmul.quantized_matmul(x, wq, s, b, group_size, bits, int8_activations=True)
            assert got.shape == (rows, N) and got.dtype == mx.float32
            _close(got, want, K, np.abs(want).max())


@needs_int8
def test_int8_kernel_takes_batched_and_strided_x_and_is_near_the_float_product():
    w = mx.random.normal((96, 256), key=mx.random.key(1))
    wq, s, b = mx.quantize(w, group_size=64, bits=4)
    x = mx.random.normal((3, 5, 512), key=mx.random.key(2))[..., ::2]  # not contiguous
    got = mlxd_qmatmul.quantized_matmul(x, wq, s, b, 64, 4, int8_activations=True)
    assert got.shape == (3, 5, 96)
    _close(got, _int8_reference(x, wq, s, b, 64), 256, 20.0)
    exact = mx.quantized_matmul(x, wq, s, b, transpose=True, group_size=64, bits=4)
    relative = (mx.abs(got - exact).max() / mx.abs(exact).max()).item()
    assert relative < 0.03, relative  # int8 rounding of x: about 1% of the product's largest value


@pytest.mark.integration  # starts a process
def test_the_flag_is_ignored_where_there_is_no_int8_kernel():
    """Without AVX-512 VNNI (here: the kernels forced down to AVX2 or SSE2) every product runs the float kernel:
    float32 rounding, the same values with the flag or without."""
    script = (
        "import mlx.core as mx, mlxd_qmatmul as q\n"
        "assert not q.int8_available(4) and not q.int8_available(8)\n"
        "w = mx.random.normal((40, 128), key=mx.random.key(5)); x = mx.random.normal((4, 128), key=mx.random.key(6))\n"
        "for bits in (4, 8):\n"
        "    wq, s, b = mx.quantize(w, group_size=32, bits=bits)\n"
        "    flagged = q.quantized_matmul(x, wq, s, b, 32, bits, int8_activations=True)\n"
        "    assert mx.array_equal(flagged, q.quantized_matmul(x, wq, s, b, 32, bits)).item()\n"
        "print(q.kernel_isa())\n"
    )
    for isa in ("avx2", "sse2", "neon"):
        env = {**os.environ, "MLXD_QMM_ISA": isa}
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        if done.stdout.strip() == isa:
            return
    pytest.skip("no narrower instruction set to force here")


@needs_int8
def test_the_engine_runs_int8_activations_only_when_asked(monkeypatch):
    from mlxd_engine.loading.cpu_weights import apply_cpu_weight_rule
    from mlxd_engine.loading.kernel_layers import KernelQuantizedLinear

    def model():
        mx.random.seed(3)
        m = nn.Sequential(nn.Linear(256, 128), nn.Linear(128, 64))
        nn.quantize(m, group_size=32, bits=4, class_predicate=lambda path, _: path == "layers.0")
        nn.quantize(m, group_size=64, bits=8)
        return m

    x = mx.random.normal((2, 256), key=mx.random.key(9))
    outputs = {}
    for choice in ("kernel", "kernel-int8"):
        m = model()
        form = apply_cpu_weight_rule(m, choice=choice)
        layers = [layer for layer in m.layers if isinstance(layer, KernelQuantizedLinear)]
        assert len(layers) == 2 and form.form == "kernel quantized"
        assert all(layer.kernel_int8 == (choice == "kernel-int8") for layer in layers)
        assert ("int8 activations" in form.detail) == (choice == "kernel-int8")
        outputs[choice] = m(x)
    assert not mx.array_equal(outputs["kernel"], outputs["kernel-int8"]).item()
    relative = (mx.abs(outputs["kernel"] - outputs["kernel-int8"]).max() / mx.abs(outputs["kernel"]).max()).item()
    assert relative < 0.05, relative
