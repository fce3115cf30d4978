"""The extension's quantized embedding lookup (`dequantized_rows`: one op) against MLX's gathers and dequantize
with float32 scales and biases, bit for bit, and the kernel embedding layer that calls it.

Skipped as a whole where the extension is not built (the layer then looks rows up with MLX's ops).
"""

from __future__ import annotations

import re

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import mlxd_qmatmul
from mlxd_engine.loading.kernel_layers import KernelQuantizedEmbedding, dequantized

pytestmark = pytest.mark.skipif(not mlxd_qmatmul.available(), reason=mlxd_qmatmul.unavailable_reason())


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("scale_dtype", [mx.float16, mx.bfloat16, mx.float32])
def test_rows_are_mlxs_gathered_dequantized_rows_to_the_bit(bits, group_size, scale_dtype):
    mx.random.seed(bits * 1000 + group_size)
    w, scales, biases = mx.quantize(mx.random.normal((97, 384)) * 4, group_size=group_size, bits=bits)
    scales, biases = scales.astype(scale_dtype), biases.astype(scale_dtype)
    for ids in (mx.array([[0, 5, 96], [3, 3, 40]]), mx.array([11], dtype=mx.uint32), mx.arange(97, dtype=mx.int64)):
        want = dequantized(w[ids], scales[ids], biases[ids], group_size, bits)
        got = mlxd_qmatmul.dequantized_rows(w, scales, biases, ids, group_size, bits)
        assert got.dtype == mx.float32 and got.shape == want.shape
        assert np.array_equal(np.array(got), np.array(want))


def test_an_id_out_of_range_gives_zeros_and_bad_inputs_are_refused():
    w, scales, biases = mx.quantize(mx.random.normal((8, 64)), group_size=32, bits=4)
    got = np.array(mlxd_qmatmul.dequantized_rows(w, scales, biases, mx.array([-1, 8, 2]), 32, 4))
    assert not got[:2].any()
    assert np.array_equal(got[2], np.array(dequantized(w[2:3], scales[2:3], biases[2:3], 32, 4))[0])
    with pytest.raises(ValueError, match="bits"):
        mlxd_qmatmul.dequantized_rows(w, scales, biases, mx.array([0]), 32, 3)
    with pytest.raises(ValueError, match="scales and biases"):
        mlxd_qmatmul.dequantized_rows(w, scales[:4], biases, mx.array([0]), 32, 4)
    with pytest.raises(ValueError, match="integers"):
        mlxd_qmatmul.dequantized_rows(w, scales, biases, mx.array([0.5]), 32, 4)


def test_the_kernel_embedding_looks_rows_up_in_one_op_with_the_same_result(tmp_path):
    mx.random.seed(3)
    table = nn.QuantizedEmbedding.from_embedding(nn.Embedding(50, 128), group_size=64, bits=8)
    table.__class__ = KernelQuantizedEmbedding
    mx.eval(table.parameters())
    tokens = mx.array([[4, 9, 49, 0]])
    got = table(tokens)
    mx.export_to_dot(str(tmp_path / "lookup.dot"), got)
    ops = re.findall(r'label\s*=\s*"([A-Za-z_0-9]+)"', (tmp_path / "lookup.dot").read_text())
    assert ops == ["CpuDequantizedRows"]
    want = dequantized(table["weight"][tokens], table["scales"][tokens], table["biases"][tokens], 64, 8)
    assert np.array_equal(np.array(got), np.array(want))
