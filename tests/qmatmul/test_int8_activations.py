"""The opt-in int8-activation kernel (4- and 8-bit weights, AVX-512 VNNI) against an exact model of its arithmetic.

The kernel rounds x to int8 in blocks of ``int8_block()`` (scale = block max / 127), multiplies with the weights'
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


BLOCK = mlxd_qmatmul.int8_block()


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
        # int8 layers run in the int8 kernel's column-block order
        want = [mlxd_qmatmul.INT8_COLUMNS] * 2 if choice == "kernel-int8" else [mlxd_qmatmul.INT8_OFF] * 2
        assert [layer.kernel_int8 for layer in layers] == want
        assert ("int8 activations" in form.detail) == (choice == "kernel-int8")
        assert ("2 layers in the int8 kernel's column-block order" in form.detail) == (choice == "kernel-int8")
        outputs[choice] = m(x)
    assert not mx.array_equal(outputs["kernel"], outputs["kernel-int8"]).item()
    relative = (mx.abs(outputs["kernel"] - outputs["kernel-int8"]).max() / mx.abs(outputs["kernel"]).max()).item()
    assert relative < 0.05, relative


@needs_int8
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("scale_dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_column_blocks_are_the_same_arithmetic_and_each_row_the_same_bits_at_any_row_count(
    bits, group_size, scale_dtype
):
    """Weights in column-block order (interleave_columns): parts of any width (a last block of fewer than 16
    columns), K not always a multiple of 128; the exact model of the int8 arithmetic within float32 rounding, and
    every row of a many-row product the bits of that row alone."""
    rng = np.random.default_rng(group_size + 7 * bits)
    for sizes in ([int(rng.integers(1, 40))], [48, 5, 21], [16, 16]):
        N = sum(sizes)
        K = group_size * int(rng.integers(1, 10))
        w = mx.array(rng.normal(size=(N, K)).astype(np.float32))
        wq, s, b = mx.quantize(w, group_size=group_size, bits=bits)
        s, b = s.astype(scale_dtype), b.astype(scale_dtype)
        cw, cs, cb = mlxd_qmatmul.interleave_columns(wq, s, b, sizes)
        assert (cw.shape, cw.dtype, cs.shape, cs.dtype) == (wq.shape, wq.dtype, s.shape, s.dtype)
        for rows in (1, 3, 9, 10, 17, 72):
            x = mx.array((rng.normal(size=(rows, K)) * rng.choice([0.01, 1.0, 30.0])).astype(np.float32))
            got = mlxd_qmatmul.quantized_matmul_split(
                x, cw, cs, cb, group_size, bits, sizes, int8_activations=True, column_blocks=True
            )
            want = _int8_reference(x, wq, s, b, group_size, bits)
            _close(mx.concatenate(got, axis=-1), want, K, np.abs(want).max())
            whole = mx.concatenate(got, axis=-1)
            alone = mx.concatenate(
                [
                    mx.concatenate(
                        mlxd_qmatmul.quantized_matmul_split(
                            x[r : r + 1], cw, cs, cb, group_size, bits, sizes, int8_activations=True, column_blocks=True
                        ),
                        axis=-1,
                    )
                    for r in range(rows)
                ]
            )
            assert mx.array_equal(whole, alone).item(), (sizes, K, rows)


def test_interleave_columns_moves_words_and_scales_within_blocks_only():
    """A part's blocks of 16 rows (and its last, shorter one) each hold their words as [K / 8][count] and their
    scales as [groups][count]; nothing crosses a part or a block."""
    w = mx.arange(21 * 4, dtype=mx.uint32).reshape(21, 4)  # 21 rows of K = 32: 4 words, one group of 32
    s = mx.arange(21, dtype=mx.float32).reshape(21, 1)
    cw, cs, cb = mlxd_qmatmul.interleave_columns(w, s, s, [18, 3])
    w_np = np.array(w)
    want = np.concatenate([w_np[:16].T.reshape(16, 4), w_np[16:18].T.reshape(2, 4), w_np[18:].T.reshape(3, 4)])
    assert np.array_equal(np.array(cw), want)
    assert np.array_equal(np.array(cs).ravel(), np.arange(21))  # one group: [1][count] is the rows' own order
    with pytest.raises(ValueError):
        mlxd_qmatmul.interleave_columns(w, s, s, [20])


@pytest.mark.parametrize("bits", [4, 8])
def test_a_table_in_column_block_order_looks_up_the_rows_it_had(bits):
    """An embedding table in column-block order (a tied head under kernel-int8): its lookup gives each id the
    row MLX's order gives it, to the bit, in a last block of fewer than 16 rows too; an id out of range zeros."""
    rng = np.random.default_rng(bits)
    w = mx.array(rng.normal(size=(37, 128)).astype(np.float32))
    wq, s, b = mx.quantize(w, group_size=32, bits=bits)
    s, b = s.astype(mx.float16), b.astype(mx.float16)
    cw, cs, cb = mlxd_qmatmul.interleave_columns(wq, s, b)
    ids = mx.array([[0, 15, 16, 31], [32, 36, 5, 40]])
    want = mlxd_qmatmul.dequantized_rows(wq, s, b, ids, 32, bits)
    got = mlxd_qmatmul.dequantized_rows(cw, cs, cb, ids, 32, bits, column_blocks=True)
    assert mx.array_equal(got, want).item()
    assert not mx.any(got[1, 3]).item()


@needs_int8
def test_column_blocks_are_refused_where_nothing_reads_them():
    w = mx.random.normal((32, 64), key=mx.random.key(1))
    x = mx.ones((2, 64))
    wq, s, b = mx.quantize(w, group_size=32, bits=4)
    with pytest.raises(ValueError):  # the float kernel reads MLX's order only
        mlxd_qmatmul.quantized_matmul(x, wq, s, b, 32, 4, column_blocks=True)
    codes = mx.zeros((32, 16), dtype=mx.uint32)  # 8-bit codes in groups of 16 (a GGUF K-quant's): no column tiles
    with pytest.raises(ValueError):
        mlxd_qmatmul.quantized_matmul(
            x, codes, mx.ones((32, 4)), mx.zeros((32, 4)), 16, 8, int8_activations=True, column_blocks=True
        )


@needs_int8
def test_prompt_lookup_keeps_plain_decode_tokens_on_column_blocks():
    """Under kernel-int8, a verify forward's rows come out with the bits a decode step gives them (column blocks:
    no row-count-dependent order), so greedy output is the same with prompt lookup on and off."""
    from mlxd_engine import Engine
    from mlxd_engine.loading.cpu_weights import apply_cpu_weight_rule
    from mlxd_scheduler.single_sequence import generate_plain, generate_with_prompt_lookup

    from .tiny_llama import tiny_llama, tiny_llama_loaded

    model = tiny_llama(seed=11)
    mx.eval(model.parameters())
    nn.quantize(model, group_size=32, bits=4)
    form = apply_cpu_weight_rule(model, choice="kernel-int8")
    assert "column-block order" in form.detail
    assert model.model.embed_tokens.kernel_int8 == mlxd_qmatmul.INT8_COLUMNS  # the tied head, and the lookups
    engine = Engine(tiny_llama_loaded(model), max_sequences=2)
    prompt = [int(t) for t in np.random.default_rng(3).integers(1, 300, size=24)] * 4  # repeats: drafts to verify
    plain = generate_plain(engine, prompt, 48).tokens
    looked_up = generate_with_prompt_lookup(engine, prompt, 48)
    assert looked_up.tokens == plain
    assert looked_up.verify_rounds > 0


@needs_int8
def test_mlxd_cpu_weights_flag_chooses_int8_over_the_environment(tmp_path, monkeypatch):
    """``mlxd --cpu-weights kernel-int8`` (DaemonOptions.cpu_weights) reaches the loader and wins over
    MLXD_CPU_WEIGHTS; a value it does not know is refused by the command line with a message."""
    import json

    from click.testing import CliRunner
    from mlx_lm.utils import load_tokenizer, save

    from mlxd_daemon.main import cli
    from mlxd_daemon.model_setup import load_for_serving
    from mlxd_daemon.options import DaemonOptions
    from mlxd_engine.loading.loader import embedded_model_path

    from .tiny_llama import TINY_LLAMA, tiny_llama

    source = embedded_model_path()
    vocab = json.loads((source / "config.json").read_text())["vocab_size"]
    config = {**TINY_LLAMA, "vocab_size": vocab}
    model = tiny_llama(seed=4, vocab_size=vocab)
    nn.quantize(model, group_size=32, bits=4)
    save(tmp_path, source, model, load_tokenizer(source), {**config, "quantization": {"group_size": 32, "bits": 4}})

    monkeypatch.setenv("MLXD_CPU_WEIGHTS", "kernel")
    loaded = load_for_serving(DaemonOptions(model=str(tmp_path), cpu_weights="kernel-int8"))
    assert "int8 activations" in loaded.weights and "column-block order" in loaded.weights, loaded.weights
    assert loaded.model.model.layers[0].mlp.down_proj.kernel_int8 == mlxd_qmatmul.INT8_COLUMNS
    assert "int8" not in load_for_serving(DaemonOptions(model=str(tmp_path))).weights  # the environment's kernel

    refused = CliRunner().invoke(cli, ["--cpu-weights", "int4"])
    assert refused.exit_code != 0 and "--cpu-weights" in refused.output

    from mlxd_engine import ModelLoadError

    monkeypatch.setenv(mlxd_qmatmul.INT8_BLOCK_ENV, "12")  # a block the kernel has not: refused at load, by name
    with pytest.raises(ModelLoadError, match="MLXD_INT8_BLOCK='12'"):
        load_for_serving(DaemonOptions(model=str(tmp_path), cpu_weights="kernel-int8"))


@needs_int8
@pytest.mark.integration  # starts a process
@pytest.mark.skipif(os.environ.get(mlxd_qmatmul.INT8_BLOCK_ENV) is not None, reason="already the block asked for")
@pytest.mark.parametrize("block", [16, 32])
def test_coarser_x_blocks_keep_the_arithmetic_and_each_rows_bits(block):
    """MLXD_INT8_BLOCK=16 or 32 (read once by the extension, so in a process of its own): this file's exact model of
    the arithmetic at that block, each row's bits at any row count, and prompt lookup's tokens equal to plain
    decode's, all hold there too."""
    tests = (
        "test_int8_kernel_is_its_exact_arithmetic_over_shapes_and_rows or "
        "test_column_blocks_are_the_same_arithmetic_and_each_row_the_same_bits_at_any_row_count or "
        "test_prompt_lookup_keeps_plain_decode_tokens_on_column_blocks or test_the_block_is_the_one_asked_for"
    )
    env = {**os.environ, mlxd_qmatmul.INT8_BLOCK_ENV: str(block)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", __file__, "-q", "-p", "no:cacheprovider", "-k", tests],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-500:]


@needs_int8
def test_the_block_is_the_one_asked_for(monkeypatch):
    """The extension's block is the environment's (8 unset); a block the kernel has not is refused at load with a
    message that names the variable."""
    from mlxd_engine.loading.cpu_weights import apply_cpu_weight_rule

    from .tiny_llama import tiny_llama

    assert mlxd_qmatmul.int8_block() == int(os.environ.get(mlxd_qmatmul.INT8_BLOCK_ENV, "8"))
    monkeypatch.setenv(mlxd_qmatmul.INT8_BLOCK_ENV, "24")
    model = tiny_llama(seed=2)
    nn.quantize(model, group_size=32, bits=4)
    with pytest.raises(ValueError, match="MLXD_INT8_BLOCK='24'"):
        apply_cpu_weight_rule(model, choice="kernel-int8")
