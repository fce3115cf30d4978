"""GGUF tensors read block by block (``loading/gguf_blocks.py``): the affine types keep their codes, the rest are
dequantized, and files of llama.cpp's usual types (Q4_K_M, Q5_K_M, Q5_0, ...) convert, load and decode.

MLX's own GGUF reader refused any file with a Q5_0, Q5_1, Q5_K, Q3_K or IQ tensor, dropped MXFP4 tensors, and
handed Q4_K over as float16 values. llama.cpp's ``gguf`` package is the reference here: every weight of a
converted checkpoint must equal what it dequantizes from the file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFWriter, quants

from mlxd_engine.loading import gguf_blocks
from mlxd_engine.loading.gguf_import import GGUFError, convert_gguf, hf_tensor_name, unpermute_rows
from mlxd_engine.loading.group16 import GROUP16_FILE
from mlxd_engine.loading.kernel_layers import dequantized
from mlxd_engine.loading.repack import pack

from .test_gguf_import import EMBEDDED_TOKENIZER, gpt2_tokenizer_metadata, write_tiny_gguf

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import write_gguf_quants  # noqa: E402

T = GGMLQuantizationType
AFFINE_BITS = {T.Q4_0: 4, T.Q4_1: 4, T.Q5_0: 5, T.Q5_1: 5, T.Q8_0: 8, T.Q4_K: 4, T.Q5_K: 5}
FACTOR_AT = {
    T.Q4_1: (0, 2),
    T.Q5_1: (0, 2),
    T.Q4_K: (0, 2),
    T.Q5_K: (0, 2),
    T.Q6_K: (-2,),
    T.Q3_K: (-2,),
    T.Q2_K: (-4, -2),
    T.TQ2_0: (-2,),
}
SMALL_GROUPS = (T.Q6_K, T.Q3_K, T.Q2_K)


class Tensor:
    """The fields of ``gguf.ReaderTensor`` that ``read_tensor`` reads."""

    def __init__(self, kind: GGMLQuantizationType, data: np.ndarray, name: str = "blk.0.ffn_up.weight"):
        self.name, self.tensor_type, self.data = name, kind, data


def random_blocks(kind: GGMLQuantizationType, rows: int, k: int, seed: int) -> np.ndarray:
    """Random codes and scale bytes, with small positive float16 factors where the block keeps them."""
    rng = np.random.default_rng(seed)
    size, nbytes = GGML_QUANT_SIZES[kind]
    raw = rng.integers(0, 256, size=(rows, k // size, nbytes), dtype=np.uint8)
    for at in FACTOR_AT.get(kind, (0,)):
        factor = np.abs(rng.standard_normal((rows, k // size, 1)) * 0.01).astype(np.float16)
        raw[..., at : at + 2 or None] = factor.view(np.uint8)
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("kind", list(AFFINE_BITS), ids=lambda kind: kind.name)
@pytest.mark.parametrize("rows, k", [(3, 256), (5, 768), (2, 1536), (1030, 256)])  # 1030: past ROWS_AT_ONCE
def test_affine_types_keep_every_weight(kind, rows, k):
    data = random_blocks(kind, rows, k, seed=rows * k)
    parts = gguf_blocks.read_tensor(Tensor(kind, data))
    bits = AFFINE_BITS[kind]
    assert parts["weight"].dtype == mx.uint32 and parts["weight"].shape == (rows, k * bits // 32)
    assert parts["scales"].shape == parts["biases"].shape == (rows, k // 32)
    # the legacy types' float16 factors stay float16; the K types' products with 6-bit integers need float32
    assert parts["scales"].dtype == (mx.float32 if kind in (T.Q4_K, T.Q5_K) else mx.float16)
    ours = mx.dequantize(
        parts["weight"],
        parts["scales"].astype(mx.float32),
        parts["biases"].astype(mx.float32),
        group_size=32,
        bits=bits,
    )
    np.testing.assert_array_equal(np.array(ours), quants.dequantize(data, kind))


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
def test_packing_is_mlx_packing(bits):
    mx.random.seed(bits)
    weight, scales, biases = mx.quantize(mx.random.normal((6, 256)), group_size=32, bits=bits)
    ones, zeros = mx.ones_like(scales), mx.zeros_like(biases)
    codes = np.array(mx.dequantize(weight, ones, zeros, group_size=32, bits=bits)).astype(np.uint8)
    np.testing.assert_array_equal(pack(codes, bits), np.array(weight))


@pytest.mark.parametrize("kind", SMALL_GROUPS, ids=lambda kind: kind.name)
@pytest.mark.parametrize("rows, k", [(3, 256), (5, 768), (1030, 256)])
def test_groups_of_16_keep_float16_values_and_their_exact_codes(kind, rows, k):
    data = random_blocks(kind, rows, k, seed=rows + k)
    parts = gguf_blocks.read_tensor(Tensor(kind, data))
    want = quants.dequantize(data, kind)
    assert set(parts) == {"weight", "codes", "code_scales", "code_biases"}
    assert parts["weight"].shape == (rows, k) and parts["codes"].shape == (rows, k // 4)
    assert parts["code_scales"].shape == parts["code_biases"].shape == (rows, k // 16)
    assert parts["weight"].dtype == mx.float16
    np.testing.assert_array_equal(np.array(parts["weight"]), want.astype(np.float16))
    codes = np.array(parts["codes"]).view(np.uint8)
    assert codes.max() < {T.Q6_K: 64, T.Q3_K: 8, T.Q2_K: 4}[kind]
    ours = dequantized(parts["codes"], parts["code_scales"], parts["code_biases"], 16, 8)
    np.testing.assert_array_equal(np.array(ours), want)


@pytest.mark.parametrize("kind", [T.IQ4_NL, T.TQ2_0], ids=lambda kind: kind.name)
@pytest.mark.parametrize("rows", [4, 1030])
def test_other_types_are_dequantized_to_float16(kind, rows):
    data = random_blocks(kind, rows, 512, seed=5)
    parts = gguf_blocks.read_tensor(Tensor(kind, data))
    assert list(parts) == ["weight"] and parts["weight"].dtype == mx.float16 and parts["weight"].shape == (rows, 512)
    expected = quants.dequantize(data, kind).astype(np.float16)
    np.testing.assert_array_equal(np.array(parts["weight"]), expected)


def test_float_tensors_keep_their_type():
    values = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    assert gguf_blocks.read_tensor(Tensor(T.F32, values))["weight"].dtype == mx.float32
    half = gguf_blocks.read_tensor(Tensor(T.F16, values.astype(np.float16)))["weight"]
    assert half.dtype == mx.float16 and np.array_equal(np.array(half), values.astype(np.float16))
    bf16_bits = (values.view(np.uint32) >> 16).astype(np.uint16)  # bfloat16 is the top half of float32
    bf16 = gguf_blocks.read_tensor(Tensor(T.BF16, bf16_bits.view(np.uint8).reshape(3, 8)))["weight"]
    assert bf16.dtype == mx.bfloat16 and bf16.shape == (3, 4)
    np.testing.assert_array_equal(
        np.array(bf16.astype(mx.float32)), (bf16_bits.astype(np.uint32) << 16).view(np.float32)
    )


# ---- whole files ----


def tiny_llama_256(tied: bool = False, arch: str = "llama"):
    """A random 2-layer llama or qwen3 (untied unless ``tied``) whose matrices are multiples of 256 wide, so K
    types apply."""
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm.models import llama, qwen3

    family = {"llama": llama, "qwen3": qwen3}[arch]
    args = family.ModelArgs(
        **({"head_dim": 128} if arch == "qwen3" else {}),
        model_type=arch,
        hidden_size=256,
        num_hidden_layers=2,
        intermediate_size=512,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=2048,
        max_position_embeddings=1024,
        rope_theta=10000.0,
        tie_word_embeddings=tied,
    )
    model = family.Model(args)
    mx.random.seed(17)
    params = [
        (name, mx.random.normal(p.shape) * (0.05 if p.ndim > 1 else 0.1) + (1.0 if "norm" in name else 0.0))
        for name, p in tree_flatten(model.parameters())
    ]
    model.update(tree_unflatten(params))
    mx.eval(model.parameters())
    return model, args


@pytest.fixture(scope="module")
def float_gguf(tmp_path_factory) -> Path:
    model, args = tiny_llama_256()
    path = tmp_path_factory.mktemp("gguf-blocks") / "tiny-f32.gguf"
    return write_tiny_gguf(path, model, args, gpt2_tokenizer_metadata(EMBEDDED_TOKENIZER, "gpt2"))


RECIPES = {  # the types each recipe must have written for this model
    "q4_k_m": {"Q4_K", "Q6_K"},
    "q5_k_m": {"Q5_K", "Q6_K"},
    "q5_0": {"Q5_0"},
    "q5_1": {"Q5_1"},
    "q4_1": {"Q4_1"},
    "q8_0": {"Q8_0"},
    "q6_k": {"Q6_K"},
}


@pytest.fixture(scope="module")
def quantized_ggufs(float_gguf, tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("gguf-recipes")
    paths = {}
    for recipe, kinds in RECIPES.items():
        written = write_gguf_quants.requantize(float_gguf, out / f"{recipe}.gguf", recipe)
        assert set(written.values()) - {"F32"} == kinds, recipe
        paths[recipe] = out / f"{recipe}.gguf"
    return paths


def expected_weights(path: Path) -> dict[str, tuple[GGMLQuantizationType, np.ndarray]]:
    """mlx-lm name -> (type, what llama.cpp's package dequantizes, q/k rows back in Hugging Face order)."""
    reader = GGUFReader(path)
    heads = {"q_proj": 4, "k_proj": 2}
    expected = {}
    for tensor in reader.tensors:
        values = quants.dequantize(np.asarray(tensor.data), tensor.tensor_type).astype(np.float32)
        name = hf_tensor_name(tensor.name)
        projection = name.split(".")[-2]
        if projection in heads:
            values = np.array(unpermute_rows(mx.array(values), heads[projection]))
        expected[name] = (T(tensor.tensor_type), values)
    return expected


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_converted_weights_equal_llama_cpp_s_own(recipe, quantized_ggufs, tmp_path):
    path = quantized_ggufs[recipe]
    out = convert_gguf(path, tmp_path / recipe)
    weights = mx.load(str(out / "model.safetensors"))
    config = json.loads((out / "config.json").read_text())
    quantization = config.get("quantization", {"group_size": 32})
    assert quantization["group_size"] == 32
    codes = mx.load(str(out / GROUP16_FILE)) if (out / GROUP16_FILE).exists() else {}
    checked = small = 0
    for name, (kind, values) in expected_weights(path).items():
        module = name.removesuffix(".weight")
        if kind in AFFINE_BITS:
            bits = quantization.get(module, quantization)["bits"]
            assert bits == AFFINE_BITS[kind], name
            scales, biases = (weights[f"{module}.{part}"].astype(mx.float32) for part in ("scales", "biases"))
            ours = np.array(mx.dequantize(weights[name], scales, biases, group_size=32, bits=bits))
            np.testing.assert_array_equal(ours, values, err_msg=name)
        elif kind == T.F32:
            np.testing.assert_array_equal(np.array(weights[name].astype(mx.float32)), values, err_msg=name)
        else:  # Q6_K: float16 values, and their codes in groups of 16 beside the checkpoint
            assert kind == T.Q6_K and f"{module}.scales" not in weights and weights[name].dtype == mx.float16
            np.testing.assert_array_equal(np.array(weights[name]), values.astype(np.float16), err_msg=name)
            parts = [codes[f"{module}.{part}"] for part in ("weight", "scales", "biases")]
            np.testing.assert_array_equal(np.array(dequantized(*parts, 16, 8)), values, err_msg=name)
            small += 1
        checked += 1
    assert checked == 2 * (7 + 2) + 3  # 7 matrices and 2 norms a layer; embedding, output, final norm
    assert len(codes) == 3 * small and (small > 0) == ("Q6_K" in RECIPES[recipe])


@pytest.mark.skipif(sys.platform == "darwin", reason="the CPU weight rule is the CPU backend's")
@pytest.mark.parametrize("recipe", ["q4_k_m", "q5_0", "q6_k"])
def test_k_quant_and_5_bit_files_run_on_the_kernel_as_their_dequantized_form(
    recipe, quantized_ggufs, tmp_path, monkeypatch
):
    """Greedy through the engine (steps, batched rows, prompt lookup's verify) with the kernel on the affine
    layers equals the same file with every layer dequantized to float32."""
    import mlxd_qmatmul
    from mlxd_engine import Engine, load
    from mlxd_engine.loading.kernel_layers import KernelQuantizedLinear
    from mlxd_scheduler.single_sequence import generate_plain, generate_with_prompt_lookup

    if not mlxd_qmatmul.available():
        pytest.skip(mlxd_qmatmul.unavailable_reason())
    monkeypatch.setenv("MLXD_CACHE_DIR", str(tmp_path / "cache"))

    def engine(choice: str) -> Engine:
        monkeypatch.setenv("MLXD_CPU_WEIGHTS", choice)
        loaded = load(str(quantized_ggufs[recipe]))
        if choice == "kernel":
            assert "on the CPU quantized-matmul kernel" in loaded.weights, loaded.weights
            down = [layer.mlp.down_proj for layer in loaded.model.model.layers]
            assert all(isinstance(layer, KernelQuantizedLinear) for layer in down)
            # q4_k_m: layer 1's down_proj (and v_proj) are Q6_K, 8-bit codes in groups of 16; the rest Q4_K
            want = {"q4_k_m": [32, 16], "q5_0": [32, 32], "q6_k": [16, 16]}[recipe]
            assert [layer.group_size for layer in down] == want
            if recipe != "q5_0":
                assert "in groups of 16" in loaded.weights
        return Engine(loaded, max_sequences=2)

    kernel, dense = engine("kernel"), engine("dequantized")
    prompt = [(11 * i + 5) % 2000 for i in range(48)] * 2  # repeats: prompt lookup finds drafts
    want = generate_plain(dense, prompt, 24).tokens
    assert generate_plain(kernel, prompt, 24).tokens == want
    looked_up = generate_with_prompt_lookup(kernel, prompt, 24)
    assert looked_up.tokens == want and looked_up.verify_rounds > 0


@pytest.mark.skipif(sys.platform == "darwin", reason="the CPU weight rule is the CPU backend's")
@pytest.mark.parametrize("choice", ["auto", "dequantized", "quantized"])
def test_without_the_kernel_groups_of_16_are_float32_values(choice, quantized_ggufs, tmp_path, monkeypatch):
    """Where the kernel does not run, a Q6_K matrix is a float32 Linear: llama.cpp's exact values from the codes
    file, or with ``quantized`` (MLX's kernels, which take no groups of 16) the checkpoint's float16 values."""
    import mlx.nn as nn

    import mlxd_qmatmul
    from mlxd_engine import load

    monkeypatch.setenv("MLXD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MLXD_CPU_WEIGHTS", choice)
    monkeypatch.setattr(mlxd_qmatmul, "available", lambda: False)  # as a machine where it was not built
    path = quantized_ggufs["q4_k_m"]
    loaded = load(str(path))
    down = loaded.model.model.layers[1].mlp.down_proj  # Q6_K in this mix
    assert type(down) is nn.Linear and down.weight.dtype == mx.float32
    _, values = expected_weights(path)["model.layers.1.mlp.down_proj.weight"]
    want = values.astype(np.float16).astype(np.float32) if choice == "quantized" else values
    np.testing.assert_array_equal(np.array(down.weight), want)
    if choice != "quantized":
        assert "groups of 16" in loaded.weights


def test_a_damaged_codes_file_leaves_the_float_layers(quantized_ggufs, tmp_path, caplog):
    from mlx_lm.utils import load as mlx_lm_load

    from mlxd_engine.loading.group16 import swap_in

    out = convert_gguf(quantized_ggufs["q4_k_m"], tmp_path / "converted")
    model, _ = mlx_lm_load(str(out))
    damaged = tmp_path / GROUP16_FILE
    damaged.write_bytes((out / GROUP16_FILE).read_bytes()[:100])
    assert swap_in(model, damaged) == 0 and "cannot read" in caplog.text
    assert swap_in(model, out / GROUP16_FILE) == 3  # the output head, layer 1's down_proj and v_proj


@pytest.mark.skipif(sys.platform == "darwin", reason="the CPU weight rule is the CPU backend's")
def test_a_qwen3_q4_k_m_file_runs_on_the_kernel_as_its_dequantized_form(tmp_path, monkeypatch):
    import mlxd_qmatmul
    from mlxd_engine import Engine, load
    from mlxd_scheduler.single_sequence import generate_plain, generate_with_prompt_lookup

    if not mlxd_qmatmul.available():
        pytest.skip(mlxd_qmatmul.unavailable_reason())
    monkeypatch.setenv("MLXD_CACHE_DIR", str(tmp_path / "cache"))
    model, args = tiny_llama_256(tied=True, arch="qwen3")
    source = write_tiny_gguf(tmp_path / "qwen3.gguf", model, args, gpt2_tokenizer_metadata(EMBEDDED_TOKENIZER, "qwen2"))
    path = tmp_path / "qwen3-q4_k_m.gguf"
    assert {"Q4_K", "Q6_K"} <= set(write_gguf_quants.requantize(source, path, "q4_k_m").values())

    def engine(choice: str) -> Engine:
        monkeypatch.setenv("MLXD_CPU_WEIGHTS", choice)
        loaded = load(str(path))
        assert loaded.model_type == "qwen3"
        if choice == "kernel":
            assert "on the CPU quantized-matmul kernel" in loaded.weights and "groups of 16" in loaded.weights
        return Engine(loaded, max_sequences=2)

    kernel, dense = engine("kernel"), engine("dequantized")
    prompt = [(11 * i + 5) % 2000 for i in range(40)] * 2
    want = generate_plain(dense, prompt, 20).tokens
    assert generate_plain(kernel, prompt, 20).tokens == want
    assert generate_with_prompt_lookup(kernel, prompt, 20).tokens == want


@pytest.mark.skipif(sys.platform == "darwin", reason="the CPU weight rule is the CPU backend's")
def test_a_tied_q6_k_embedding_is_the_output_head_on_the_kernel(tmp_path, monkeypatch):
    """A tied model's Q6_K embedding: rows looked up from the codes, the output head a kernel product; greedy
    equals the float32 form of the same file."""
    import mlxd_qmatmul
    from mlxd_engine import Engine, load
    from mlxd_engine.loading.kernel_layers import KernelQuantizedEmbedding
    from mlxd_scheduler.single_sequence import generate_plain

    if not mlxd_qmatmul.available():
        pytest.skip(mlxd_qmatmul.unavailable_reason())
    monkeypatch.setenv("MLXD_CACHE_DIR", str(tmp_path / "cache"))
    model, args = tiny_llama_256(tied=True)
    source = write_tiny_gguf(tmp_path / "tied.gguf", model, args, gpt2_tokenizer_metadata(EMBEDDED_TOKENIZER, "gpt2"))
    path = tmp_path / "tied-q6_k.gguf"
    assert set(write_gguf_quants.requantize(source, path, "q6_k").values()) - {"F32"} == {"Q6_K"}

    def engine(choice: str) -> Engine:
        monkeypatch.setenv("MLXD_CPU_WEIGHTS", choice)
        loaded = load(str(path))
        embedding = loaded.model.model.embed_tokens
        if choice == "kernel":
            assert isinstance(embedding, KernelQuantizedEmbedding) and embedding.group_size == 16
            assert "lm_head" not in dict(loaded.model.named_modules())
        return Engine(loaded, max_sequences=2)

    kernel, dense = engine("kernel"), engine("dequantized")
    prompt = [(7 * i + 3) % 2000 for i in range(40)]
    assert generate_plain(kernel, prompt, 16).tokens == generate_plain(dense, prompt, 16).tokens


def test_a_type_that_cannot_be_read_is_named(tmp_path):
    path = tmp_path / "q8_1.gguf"
    writer = GGUFWriter(str(path), "llama")
    size, nbytes = GGML_QUANT_SIZES[T.Q8_1]
    writer.add_tensor("token_embd.weight", np.zeros((4, 256 // size * nbytes), np.uint8), raw_dtype=T.Q8_1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(GGUFError, match=r"'token_embd.weight' has type Q8_1.*q8_1.gguf"):
        convert_gguf(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()
