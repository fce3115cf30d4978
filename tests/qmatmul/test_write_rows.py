"""The extension's row write (a KV cache's update for rows at different positions) against numpy, and the
storage's two ways of writing a forward's tokens (the one op, MLX's scatter) against each other.

Skipped as a whole where the extension is not built (the storage then writes with MLX's scatter).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mlxd_qmatmul
from mlxd_engine.storage import kv_storage
from mlxd_engine.storage.kv_storage import scatter_tokens, token_rows

from .every_isa import results_on_every_isa

pytestmark = pytest.mark.skipif(not mlxd_qmatmul.available(), reason=mlxd_qmatmul.unavailable_reason())


def _expected(buffer: np.ndarray, slots, positions, new: np.ndarray) -> np.ndarray:
    want = buffer.copy()
    for b, (slot, row_positions) in enumerate(zip(slots, positions)):
        for i, position in enumerate(row_positions):
            want[slot, :, position, :] = new[b, :, i, :]
    return want


def _case(rng, dtype):
    slots_n, heads, capacity, dim = int(rng.integers(1, 9)), int(rng.choice([1, 3, 8])), int(rng.integers(4, 40)), 8
    batch = int(rng.integers(1, slots_n + 1))
    tokens = int(rng.integers(1, min(4, capacity) + 1))
    slots = [int(s) for s in rng.choice(slots_n, size=batch, replace=False)]
    starts = [int(rng.integers(0, capacity - tokens + 1)) for _ in slots]
    positions = [[start + i for i in range(tokens)] for start in starts]
    buffer = rng.normal(size=(slots_n, heads, capacity, dim)).astype(dtype)
    new = rng.normal(size=(batch, heads, tokens, dim)).astype(dtype)
    return buffer, slots, positions, new


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_write_rows_puts_every_token_at_its_slot_and_position(dtype):
    rng = np.random.default_rng(0)
    for _ in range(60):
        buffer, slots, positions, new = _case(rng, dtype)
        want = _expected(buffer, slots, positions, new)
        held = mx.array(buffer)  # something else holds the buffer: written on a copy, the original untouched
        index = token_rows(mx.array(slots), mx.array(positions), buffer.shape[1], buffer.shape[2])
        got = mlxd_qmatmul.write_rows(held, mx.array(new), index)
        assert np.array_equal(np.array(got), want)
        assert np.array_equal(np.array(held), buffer)


def test_write_rows_reads_strided_rows_and_a_strided_buffer():
    rng = np.random.default_rng(1)
    buffer, slots, positions, new = _case(rng, np.float32)
    index = token_rows(mx.array(slots), mx.array(positions), buffer.shape[1], buffer.shape[2])
    # new tokens as a transposed view ([B, n, heads, dim] seen as [B, heads, n, dim]), a buffer likewise
    strided_new = mx.array(new.transpose(0, 2, 1, 3).copy()).transpose(0, 2, 1, 3)
    strided_buffer = mx.array(buffer.transpose(0, 2, 1, 3).copy()).transpose(0, 2, 1, 3)
    got = mlxd_qmatmul.write_rows(strided_buffer, strided_new, index)
    assert np.array_equal(np.array(got), _expected(buffer, slots, positions, new))


def test_a_buffer_nothing_else_holds_is_written_in_place():
    buffer = mx.zeros((8, 3, 2048, 64))  # 12.6 MB: a copy would show in the peak memory
    mx.eval(buffer)
    index = token_rows(mx.array([1, 5]), mx.array([[7], [9]]), 3, 2048)
    new = mx.ones((2, 3, 1, 64))
    mx.eval(index, new)
    mx.reset_peak_memory()
    before = mx.get_active_memory()
    buffer = mlxd_qmatmul.write_rows(buffer, new, index)
    mx.eval(buffer)
    assert mx.get_peak_memory() - before < buffer.nbytes // 4
    assert float(buffer.sum().item()) == 2 * 3 * 64
    assert float(buffer[1, :, 7].sum().item()) == 3 * 64 and float(buffer[5, :, 9].sum().item()) == 3 * 64


def test_mismatched_inputs_are_refused_with_a_message():
    buffer = mx.zeros((2, 3, 16, 8))
    with pytest.raises(ValueError, match="one row of the buffer's last axis per index entry"):
        mlxd_qmatmul.write_rows(buffer, mx.zeros((1, 3, 2, 8)), mx.arange(5, dtype=mx.int32))
    with pytest.raises(ValueError, match="rows must have the buffer's dtype"):
        mlxd_qmatmul.write_rows(buffer, mx.zeros((2, 8), dtype=mx.float16), mx.arange(2, dtype=mx.int32))
    with pytest.raises(ValueError, match="int32"):
        mlxd_qmatmul.write_rows(buffer, mx.zeros((2, 8)), mx.arange(2, dtype=mx.int64))


@pytest.mark.parametrize("native", [True, False])
def test_the_storage_writes_a_forwards_tokens_the_same_either_way(monkeypatch, native):
    monkeypatch.setattr(kv_storage, "_NATIVE_WRITES", native)
    rng = np.random.default_rng(2)
    for _ in range(30):
        buffer, slots, positions, new = _case(rng, np.float32)
        got = scatter_tokens(mx.array(buffer), mx.array(slots), mx.array(positions), mx.array(new))
        assert np.array_equal(np.array(got), _expected(buffer, slots, positions, new))
        # new values of another dtype take the buffer's, as an assignment does
        half = new.astype(np.float16)
        got = scatter_tokens(mx.array(buffer), mx.array(slots), mx.array(positions), mx.array(half))
        assert got.dtype == mx.float32
        assert np.array_equal(np.array(got), _expected(buffer, slots, positions, half.astype(np.float32)))


def _narrowing_values(rng, n: int) -> np.ndarray:
    """float32 values across float16's range and past it: normal, tiny (half's subnormals), ties, huge, NaN."""
    values = np.concatenate(
        [
            rng.normal(size=n) * rng.choice([1e-6, 1e-3, 1.0, 300.0, 6e4], size=n),
            [65504.0, 65519.0, 65520.0, -65520.0, 1e9, -3e38, 6e-8, -5.9e-8, 1.0 + 2.0**-11, 2049.0],
        ]
    ).astype(np.float32)
    values[3] = np.nan
    return values


def test_float32_rows_narrow_into_a_float16_buffer_as_a_cast_except_past_halfs_range():
    rng = np.random.default_rng(5)
    for dim in (1, 7, 8, 13, 64):  # the vector loop's tail too
        new = _narrowing_values(rng, 3 * dim)[: 3 * dim].reshape(1, 3, 1, dim)
        buffer = mx.zeros((2, 3, 4, dim), dtype=mx.float16)
        index = token_rows(mx.array([1]), mx.array([[2]]), 3, 4)
        for rows in (mx.array(new), mx.array(np.ascontiguousarray(new.transpose(0, 1, 3, 2))).swapaxes(2, 3)):
            got = mlxd_qmatmul.write_rows(buffer, rows, index)  # dense rows, then rows with a strided last axis
            assert got.dtype == mx.float16
            written = np.array(got)[1, :, 2, :].reshape(-1)
            flat = new.reshape(-1)
            inside = np.abs(flat) <= 65504
            cast = np.array(mx.array(flat).astype(mx.float16))
            assert np.array_equal(written[inside].view(np.uint16), cast[inside].view(np.uint16))
            past = ~inside & ~np.isnan(flat)
            assert np.array_equal(written[past], np.sign(flat[past]) * np.float16(65504))
            assert np.array_equal(np.isnan(written), np.isnan(flat))
            assert not np.array(got)[0].any() and not np.array(got)[1, :, [0, 1, 3]].any()


def test_every_instruction_set_narrows_to_the_same_halves(tmp_path):
    script = """
import mlx.core as mx, numpy as np
import mlxd_qmatmul as q
rng = np.random.default_rng(9)
values = np.concatenate([rng.normal(size=200) * rng.choice([1e-6, 1.0, 6e4], size=200), [7e4, -7e4]])
new = mx.array(values.astype(np.float32).reshape(1, 2, 1, 101))
index = mx.array([1, 4], dtype=mx.int32)  # slot 0, position 1 of each of 2 heads in [1, 2, 3, 101]: rows 1 and 4
got = q.write_rows(mx.zeros((1, 2, 3, 101), dtype=mx.float16), new, index)
print(q.kernel_isa() + ("+amx" if q.amx_available() else ""))
np.save(sys.argv[1], np.array(got).view(np.uint16))
"""
    results = results_on_every_isa(script, tmp_path)
    first = next(iter(results.values()))
    for isa, got in results.items():
        assert np.array_equal(got, first), isa
    assert 65504 in np.abs(first.view(np.float16).astype(np.float32))
