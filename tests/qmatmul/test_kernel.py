"""The CPU quantized-matmul kernel against MLX's own quantized matmul, and the engine's use of it.

Skipped as a whole where the extension is not built (the engine then keeps its float32 rule, which the
other tests cover).
"""

from __future__ import annotations

import os

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import mlxd_qmatmul

from .every_isa import results_on_every_isa
from .tiny_llama import tiny_llama

pytestmark = pytest.mark.skipif(not mlxd_qmatmul.available(), reason=mlxd_qmatmul.unavailable_reason())


def _reference(x, w, s, b, gs, bits):
    return mx.quantized_matmul(x, w, s, b, transpose=True, group_size=gs, bits=bits)


def _close(got, want, K):
    got, want = np.array(got), np.array(want)
    # float32 rounding of a K-term dot product in another summation order
    bound = 4 * K * np.finfo(np.float32).eps * (np.abs(want).max() + 1)
    assert np.abs(got - want).max() <= bound, (np.abs(got - want).max(), bound)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_matches_mlx_over_random_shapes_and_rows(bits, group_size):
    rng = np.random.default_rng(bits * 1000 + group_size)
    for _ in range(4):
        N = int(rng.integers(1, 300))
        K = group_size * int(rng.integers(1, 12))
        w = mx.array(rng.normal(size=(N, K)).astype(np.float32))
        wq, s, b = mx.quantize(w, group_size=group_size, bits=bits)
        # float32 scales, and float16 ones (the kernels widen each kind in their own code)
        for scales, biases in ((s, b), (s.astype(mx.float16), b.astype(mx.float16))):
            for rows in (1, 2, 3, 5, 8, 9, 16, 17, 72):
                x = mx.array(rng.normal(size=(rows, K)).astype(np.float32))
                _close(
                    mlxd_qmatmul.quantized_matmul(x, wq, scales, biases, group_size, bits),
                    _reference(x, wq, scales.astype(mx.float32), biases.astype(mx.float32), group_size, bits),
                    K,
                )


def test_batched_inputs_float16_scales_and_a_strided_x():
    w = mx.random.normal((96, 256), key=mx.random.key(1))
    wq, s, b = mx.quantize(w, group_size=64, bits=4)
    x = mx.random.normal((3, 5, 512), key=mx.random.key(2))[..., ::2]  # not contiguous
    got = mlxd_qmatmul.quantized_matmul(x, wq, s.astype(mx.float16), b.astype(mx.float16), 64, 4)
    assert got.shape == (3, 5, 96) and got.dtype == mx.float32
    _close(
        got,
        _reference(x, wq, s.astype(mx.float16).astype(mx.float32), b.astype(mx.float16).astype(mx.float32), 64, 4),
        256,
    )
    half = mlxd_qmatmul.quantized_matmul(x.astype(mx.float16), wq, s, b, 64, 4)
    assert half.dtype == mx.float16


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
@pytest.mark.parametrize("bits", [4, 8])
def test_half_precision_scales_are_read_as_stored(dtype, bits):
    """Scales and biases in float16 or bfloat16 are widened in the kernel (no float32 copy): the result is
    the product with the same values in float32, over normal, subnormal, zero and negative scales."""
    rng = np.random.default_rng(bits)
    # 88 columns: on AMX a pair of column tiles, one alone, then 8 columns past them
    w = mx.array(rng.normal(size=(88, 256)).astype(np.float32))
    wq, s, b = mx.quantize(w, group_size=32, bits=bits)
    magnitudes = np.array([1.0, 1e-3, 3e-6, 6e-8, 0.0, -2.5, -1e-5, 7.0], dtype=np.float32)
    s = s * mx.array(np.resize(magnitudes, s.shape).astype(np.float32))
    s, b = s.astype(dtype), b.astype(dtype)
    for rows in (5, 9, 40):  # the vector kernels; one and three row tiles where AMX runs
        x = mx.array(rng.normal(size=(rows, 256)).astype(np.float32))
        _close(
            mlxd_qmatmul.quantized_matmul(x, wq, s, b, 32, bits),
            _reference(x, wq, s.astype(mx.float32), b.astype(mx.float32), 32, bits),
            256,
        )


@pytest.mark.parametrize("bits", [4, 8])
def test_rows_of_more_than_sixteen_weight_groups(bits):
    """K of 40 groups: where AMX runs, one row tile widens the scales 16 groups at a time and several row
    tiles widen them all once; both agree with MLX, as do the vector kernels at 5 rows."""
    rng = np.random.default_rng(40 + bits)
    w = mx.array(rng.normal(size=(48, 32 * 40)).astype(np.float32))
    wq, s, b = mx.quantize(w, group_size=32, bits=bits)
    for scales, biases in ((s, b), (s.astype(mx.float16), b.astype(mx.float16))):
        for rows in (5, 9, 40):
            x = mx.array(rng.normal(size=(rows, 32 * 40)).astype(np.float32))
            _close(
                mlxd_qmatmul.quantized_matmul(x, wq, scales, biases, 32, bits),
                _reference(x, wq, scales.astype(mx.float32), biases.astype(mx.float32), 32, bits),
                32 * 40,
            )


@pytest.mark.integration  # starts a process
def test_every_instruction_set_agrees(tmp_path):
    """The narrower paths (forced with MLXD_QMM_ISA, the AMX kernel turned off with MLXD_QMM_AMX=0) give
    the same results as the chosen one; 11 rows take the AMX kernel where the CPU has it, 70 columns its
    16-column tiles and a tail on AVX-512."""
    script = (
        "import mlx.core as mx, numpy as np, mlxd_qmatmul as q\n"
        "w = mx.random.normal((70, 384), key=mx.random.key(3)); x = mx.random.normal((11, 384), key=mx.random.key(4))\n"
        "out = []\n"
        "for bits in (4, 8):\n"
        "    wq, s, b = mx.quantize(w, group_size=128, bits=bits)\n"
        "    out.append(np.array(q.quantized_matmul(x, wq, s, b, 128, bits)))\n"
        "print(q.kernel_isa() + ('+amx' if q.amx_available() else '')); np.save(sys.argv[1], np.stack(out))\n"
    )
    results = results_on_every_isa(script, tmp_path)
    first = next(iter(results.values()))
    for isa, got in results.items():
        np.testing.assert_allclose(got, first, rtol=1e-5, atol=1e-4, err_msg=isa)


@pytest.mark.integration  # starts a process
def test_vector_tiles_of_every_row_count_give_each_row_its_own_result():
    """The vector kernel (AMX off) takes R rows x C columns a tile, C chosen by R (tile_columns, or split_columns
    for tall tiles, which also take K in chunks; tiles of 3-6 rows split too where set_small_split_tiles asks), and a
    product's rows in even tiles of up to 12 (row_tiles); each output's sum runs in the same order whatever the
    tile, so every row count from 1 to 14, tiles split or whole, gives each row the very bits it gets alone, with
    column counts that leave a remainder after tiles of 4, 3 and 2 columns, and K of one chunk or several; and
    agrees with MLX."""
    import subprocess
    import sys

    script = (
        "import mlx.core as mx, numpy as np, mlxd_qmatmul as q\n"
        "splits = (False, True) if q.small_split_tiles_available() else (False,)\n"
        "for split in splits:\n"
        "  for bits in (4, 8):\n"
        "    q.set_small_split_tiles(bits, split)\n"
        "  assert q.small_split_tiles(4) == q.small_split_tiles(8) == split\n"
        "  for bits, n in ((4, 71), (8, 37)):\n"
        "    w = mx.random.normal((n, 256), key=mx.random.key(bits))\n"
        "    wq, s, b = mx.quantize(w, group_size=64, bits=bits)\n"
        "    for rows in range(1, 15):\n"
        "        x = mx.random.normal((rows, 256), key=mx.random.key(rows))\n"
        "        got = np.array(q.quantized_matmul(x, wq, s, b, 64, bits))\n"
        "        one = [np.array(q.quantized_matmul(x[i : i + 1], wq, s, b, 64, bits)) for i in range(rows)]\n"
        "        alone = np.concatenate(one)\n"
        "        assert np.array_equal(got, alone), (split, bits, rows)\n"
        "        want = np.array(mx.quantized_matmul(x, wq, s, b, transpose=True, group_size=64, bits=bits))\n"
        "        assert np.abs(got - want).max() <= 1e-3 * (np.abs(want).max() + 1), (split, bits, rows)\n"
        # split tiles take K in chunks (split_rows): K spanning several chunks, the last one partial, the
        # scales widened across chunk edges, float16 scales as checkpoints hold them
        "  for bits, n, k, gs in ((4, 37, 2304, 32), (8, 19, 2304, 128), (4, 23, 1600, 64), (8, 21, 1536, 32)):\n"
        "    w = mx.random.normal((n, k), key=mx.random.key(k + gs))\n"
        "    wq, s, b = mx.quantize(w, group_size=gs, bits=bits)\n"
        "    s, b = s.astype(mx.float16), b.astype(mx.float16)\n"
        "    for rows in (3, 4, 5, 6, 7, 9, 11, 12, 13, 20, 25):\n"
        "        x = mx.random.normal((rows, k), key=mx.random.key(rows))\n"
        "        got = np.array(q.quantized_matmul(x, wq, s, b, gs, bits))\n"
        "        one = [np.array(q.quantized_matmul(x[i : i + 1], wq, s, b, gs, bits)) for i in range(rows)]\n"
        "        assert np.array_equal(got, np.concatenate(one)), (split, bits, k, gs, rows)\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env={**os.environ, "MLXD_QMM_AMX": "0"}
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


@pytest.mark.integration  # starts a process
def test_threads_split_the_output_and_agree_with_mlx():
    """Several threads share a large product's output columns (forced with MLXD_QMM_THREADS, with workers
    that sleep at once: MLXD_QMM_SPIN_US=0, so the calling thread often takes the tasks left in the
    sleepers' runs); results match MLX's for 4 and 8 bits, 1 to 40 rows (the vector and AMX kernels)."""
    import os
    import subprocess
    import sys

    script = (
        "import mlx.core as mx, numpy as np, mlxd_qmatmul as q\n"
        "assert q.kernel_threads(1) == q.kernel_threads(64) == 3, q.describe_threads()\n"
        "w = mx.random.normal((1000, 512), key=mx.random.key(6))\n"
        "for bits in (4, 8):\n"
        "    wq, s, b = mx.quantize(w, group_size=64, bits=bits)\n"
        "    for rows in (1, 3, 8, 9, 16, 40):\n"
        "        x = mx.random.normal((rows, 512), key=mx.random.key(rows))\n"
        "        got = np.array(q.quantized_matmul(x, wq, s, b, 64, bits))\n"
        "        want = np.array(mx.quantized_matmul(x, wq, s, b, transpose=True, group_size=64, bits=bits))\n"
        "        assert np.abs(got - want).max() <= 1e-3 * (np.abs(want).max() + 1), (bits, rows)\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, "MLXD_QMM_THREADS": "3", "MLXD_QMM_SPIN_US": "0"},
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_every_row_count_runs_on_every_thread():
    threads = mlxd_qmatmul.kernel_threads(1)
    assert all(mlxd_qmatmul.kernel_threads(rows) == threads for rows in (2, 8, 9, 64))
    if "MLXD_QMM_THREADS" not in os.environ:
        assert threads == len(os.sched_getaffinity(0))


def test_refuses_formats_it_does_not_take():
    w = mx.random.normal((32, 256), key=mx.random.key(5))
    wq, s, b = mx.quantize(w, group_size=64, bits=3)
    with pytest.raises(ValueError, match="bits must be 4 or 8"):
        mlxd_qmatmul.quantized_matmul(mx.zeros((1, 256)), wq, s, b, 64, 3)
    wq, s, b = mx.quantize(w, group_size=64, bits=4)
    with pytest.raises(ValueError, match="features"):
        mlxd_qmatmul.quantized_matmul(mx.zeros((1, 128)), wq, s, b, 64, 4)


def _tiny_quantized_model(bits):
    model = tiny_llama()
    nn.quantize(model, group_size=64, bits=bits)
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    return model


@pytest.mark.parametrize("bits", [4, 8])
def test_engine_layers_give_mlx_results_and_keep_weights_quantized(bits):
    from mlxd_engine.loading.kernel_layers import KernelQuantizedEmbedding, KernelQuantizedLinear, use_kernel

    model = _tiny_quantized_model(bits)
    tokens = mx.array([[1, 5, 9, 20, 33, 7, 2, 250]])
    want = model(tokens)
    switched = use_kernel(model, max_rows=4)  # 8 rows: the dequantize + BLAS path; 1 row: the kernel
    assert switched == 2 * 7 + 1
    assert isinstance(model.model.embed_tokens, KernelQuantizedEmbedding)
    assert isinstance(model.model.layers[0].self_attn.q_proj, KernelQuantizedLinear)
    assert model.model.layers[0].mlp.up_proj["weight"].dtype == mx.uint32
    np.testing.assert_allclose(np.array(model(tokens)), np.array(want), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.array(model(tokens[:, :1])), np.array(want[:, :1]), rtol=1e-4, atol=1e-4)
    for layer in (model.model.embed_tokens, model.model.layers[1].mlp.down_proj):
        layer.kernel_max_rows = 64
    np.testing.assert_allclose(np.array(model(tokens)), np.array(want), rtol=1e-4, atol=1e-4)


def test_weight_rule_uses_the_kernel_and_logs_both_timings(caplog):
    from mlxd_engine.loading.cpu_weights import apply_cpu_weight_rule
    from mlxd_engine.loading.kernel_layers import KernelQuantizedLinear

    model = _tiny_quantized_model(4)
    form = apply_cpu_weight_rule(model, choice="kernel")
    assert form.form == "kernel quantized"
    assert isinstance(model.model.layers[0].mlp.gate_proj, KernelQuantizedLinear)
    assert "kernel 1 rows" in form.detail and "float32 1 rows" in form.detail
    model = _tiny_quantized_model(4)
    assert apply_cpu_weight_rule(model, choice="dequantized").form == "float32 dequantized"


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
def test_half_precision_scales_stay_as_stored_and_give_the_dequantized_float32_logits(dtype):
    """A checkpoint's float16 / bfloat16 scales stay as stored on the kernel (fewer bytes a step), and the
    model's logits are those of the dequantized float32 form of the same checkpoint: prompt rows (the
    dequantize + BLAS path), a decode row (the kernel) and the embedding lookup."""
    from mlxd_engine.loading.cpu_weights import apply_cpu_weight_rule

    def checkpoint():
        model = _tiny_quantized_model(4)
        model.set_dtype(dtype)  # scales, biases, norms in half precision, as mlx-community checkpoints store them
        mx.eval(model.parameters())
        return model

    kernel, dense = checkpoint(), checkpoint()
    assert apply_cpu_weight_rule(kernel, choice="kernel").form == "kernel quantized"
    assert apply_cpu_weight_rule(dense, choice="dequantized").form == "float32 dequantized"
    layer = kernel.model.layers[0].self_attn.q_proj
    assert layer["scales"].dtype == dtype and layer["biases"].dtype == dtype
    assert kernel.model.norm.weight.dtype == mx.float32  # everything else computes in float32
    for layer in (kernel.model.embed_tokens, kernel.model.layers[1].mlp.down_proj):
        layer.kernel_max_rows = 4
    tokens = mx.array([[1, 5, 9, 20, 33, 7, 2, 250]])
    for inputs in (tokens, tokens[:, :1]):
        got = kernel(inputs)
        assert got.dtype == mx.float32
        np.testing.assert_allclose(np.array(got), np.array(dense(inputs)), rtol=1e-4, atol=1e-4)


def test_the_kernel_takes_rows_up_to_where_dequantizing_wins():
    from mlxd_engine.loading.kernel_layers import UNBOUNDED, crossover_rows

    dequant = {1: 100.0, 8: 101.0, 64: 110.0, 128: 120.0}  # a pass over the weights, then a little per row
    assert crossover_rows({1: 1.0, 8: 5.0, 64: 150.0, 128: 300.0}, dequant) == 8  # slower from 64 rows on
    assert crossover_rows({1: 1.0, 8: 5.0, 64: 40.0, 128: 80.0}, dequant) == 128 + int(40 / (40 / 64 - 10 / 64))
    assert crossover_rows({1: 1.0, 8: 5.0, 64: 40.0, 128: 45.0}, dequant) == UNBOUNDED  # grows slower per row
    assert crossover_rows({1: 200.0, 8: 200.0, 64: 200.0, 128: 200.0}, dequant) == 1


def test_load_timing_repeats_only_the_row_counts_where_the_paths_are_close(monkeypatch):
    import mlxd_engine.loading.kernel_layers as kl

    layer = nn.QuantizedLinear(128, 64, bias=False, group_size=64, bits=4)
    # scripted timings by pass and row count: far apart at 1 row, close at 8 (kernel 5 against float32 6)
    scripted = {("kernel_pass", 1): 1.0, ("float32_pass", 1): 10.0, ("kernel_pass", 8): 5.0, ("float32_pass", 8): 6.0}
    calls = []

    def best_ms(fn, repeats):
        if fn.__name__ == "<lambda>":  # the dequantization, timed once
            return 100.0
        rows = fn.__defaults__[0].shape[0]
        calls.append((fn.__name__, rows, repeats))
        # each pass runs over copies of the weights, and measure divides by them: 8 packed, 2 float32 at this size
        return scripted[fn.__name__, rows] * (2 if fn.__name__ == "float32_pass" else 8)

    monkeypatch.setattr(kl, "best_ms", best_ms)
    timing = kl.measure([layer], rows=(1, 8), repeats=3)
    assert [c for c in calls if c[2] > 1] == [("kernel_pass", 8, 3), ("float32_pass", 8, 3)]
    assert timing.kernel_ms == {1: 1.0, 8: 5.0} and timing.float32_ms == {1: 10.0, 8: 6.0}
    assert timing.dequantize_ms == {1: 110.0, 8: 106.0} and timing.faster
