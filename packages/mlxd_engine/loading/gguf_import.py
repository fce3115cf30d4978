"""GGUF files turned into mlx-lm checkpoint directories, once per file content.

Contract:
- ``convert_gguf(gguf_path, out_dir)`` reads the file (see ``read_gguf``) and writes a complete
  mlx-lm checkpoint into ``out_dir`` (``config.json``, ``model.safetensors``, ``tokenizer.json``,
  ``tokenizer_config.json``, ``generation_config.json``). It writes into a temporary sibling directory
  and renames it at the end, so a crash never leaves a half directory. ``out_dir`` must not exist or
  be empty.
- ``cached_conversion(gguf_path)`` returns ``<cache>/gguf/<sha256 of the file>/``, converting first
  when it is absent (``cache_dir.mlxd_cache_dir``), or again when an older converter wrote it
  (``CONVERTER_VERSION``, kept in the directory's ``mlxd_conversion.json``).
- Supported: architectures llama, qwen2, qwen3 (qwen2's layout with a norm on each head's queries and
  keys, and a head size of its own) and phi3 (q/k/v in one matrix, gate/up in one; rotary embeddings on part
  of each head allowed; the 128k models' longrope scaling is refused). Tensors are read with llama.cpp's
  ``gguf`` package (``gguf_blocks``): Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / Q4_K / Q5_K stay quantized as MLX's
  affine format (group size 32, 4, 5 or 8 bits) with the file's own codes, scales and offsets, so no weight
  value changes; every other quantized type is dequantized and stored float16, and Q6_K / Q3_K / Q2_K (groups of 16)
  also exactly, as 8-bit codes in groups of 16 in ``GROUP16_FILE`` beside the checkpoint, which mlxd reads on
  the CPU (``group16``; mlx-lm reads the directory without it); float tensors are stored as they are, except
  that a float32 tensor is stored float16 when the checkpoint's scales are all float16 and the cast is exact.
- llama.cpp permutes the rows of llama's attn_q / attn_k so that RoPE rotates consecutive pairs; those
  rows are permuted back (Hugging Face layout, mlx-lm ``rope_traditional`` false). qwen2 / qwen3 / phi3 are not
  permuted.
- Anything a user can cause (not a GGUF, truncated, unsupported architecture or tensor, unknown
  tokenizer) raises ``GGUFError`` (a ``ModelLoadError``) whose message names the file or the thing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import gguf
import mlx.core as mx

from ..errors import GGUFError
from .cache_dir import mlxd_cache_dir
from .gguf_blocks import GROUP, GGUFBlockError, float16_if_exact, read_tensor
from .gguf_tokenizer import build_tokenizer, tokenizer_config
from .group16 import CODE_PARTS, GROUP16_FILE, split_codes

log = logging.getLogger("mlxd.gguf")

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "phi3")
HASH_CHUNK_BYTES = 1 << 20
# Bumped whenever a conversion of the same file comes out different, so that the cache converts it again:
# 2 reads the blocks with llama.cpp's gguf package (Q4_K / Q5_* kept as their codes, not float16 values);
# 3 writes Q6_K / Q3_K / Q2_K's codes in groups of 16 (GROUP16_FILE).
CONVERTER_VERSION = 3
VERSION_FILE = "mlxd_conversion.json"

# llama.cpp's tensor stems -> mlx-lm's module names (scripts/write_stories_gguf.py writes by their inverse)
GLOBAL_TENSORS = {"token_embd": "model.embed_tokens", "output": "lm_head", "output_norm": "model.norm"}
BLOCK_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_SUFFIXES = ("weight", "scales", "biases", "bias", *CODE_PARTS)
_BLOCK_NAME = re.compile(r"blk\.(\d+)\.([a-z_]+)\.([a-z_]+)")
_HF_CLASSES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
}
# phi3's fused projections (its ffn_up holds gate and up, as mlx-lm's gate_up_proj)
PHI3_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_up": "mlp.gate_up_proj",
    "ffn_down": "mlp.down_proj",
}
QK_NORM_TENSORS = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}  # qwen3's
# each architecture's block tensors: what its names map to, and what every layer must have
ARCH_BLOCK_TENSORS = {
    "llama": BLOCK_TENSORS,
    "qwen2": BLOCK_TENSORS,
    "qwen3": {**BLOCK_TENSORS, **QK_NORM_TENSORS},
    "phi3": PHI3_TENSORS,
}


def read_gguf(gguf_path: str | Path) -> tuple[dict[str, mx.array], dict[str, Any]]:
    """Tensors and metadata of a GGUF file; metadata values become plain Python values.

    Read with llama.cpp's own reader (the ``gguf`` package); quantized tensors become MLX arrays as
    ``gguf_blocks`` describes (``<stem>.weight``, ``<stem>.scales``, ``<stem>.biases`` for the affine types).

    Raises:
        GGUFError: the file is missing, unreadable, truncated or not a GGUF file, or holds a tensor type
            that cannot be read.
    """
    path = Path(gguf_path).expanduser()
    if not path.is_file():
        raise GGUFError(f"GGUF file {str(gguf_path)!r} does not exist")
    try:
        reader = gguf.GGUFReader(path)
    except Exception as error:  # the reader raises ValueError / IndexError / OSError with terse text for bad files
        raise GGUFError(
            f"cannot read {path.name} as a GGUF file (unreadable, truncated or not GGUF): {error}"
        ) from error
    metadata = {key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")}
    tensors: dict[str, mx.array] = {}
    for tensor in reader.tensors:
        try:
            parts = read_tensor(tensor)
        except GGUFBlockError as error:
            raise GGUFError(f"{error} (in {path.name})") from error
        stem = tensor.name.removesuffix(".weight")
        for part, value in parts.items():
            tensors[tensor.name if part == "weight" else f"{stem}.{part}"] = value
    return tensors, metadata


def _float32_text(value: float) -> float:
    """A float32 metadata value written the shortest way that reads back the same (1e-05, not 9.99e-06)."""
    import numpy as np

    return float(str(np.float32(value)))


def hf_tensor_name(gguf_name: str, arch: str = "llama") -> str:
    """The mlx-lm name of a llama.cpp tensor name in a file of architecture ``arch``.

    ``blk.3.attn_q.scales`` -> ``model.layers.3.self_attn.q_proj.scales``.

    Raises:
        GGUFError: a name outside the llama / qwen2 / qwen3 / phi3 layout.
    """
    stem, _, suffix = gguf_name.rpartition(".")
    if suffix in _SUFFIXES and stem in GLOBAL_TENSORS:
        return f"{GLOBAL_TENSORS[stem]}.{suffix}"
    match = _BLOCK_NAME.fullmatch(gguf_name)
    modules = ARCH_BLOCK_TENSORS[arch]
    if match and match.group(2) in modules and match.group(3) in _SUFFIXES:
        return f"model.layers.{match.group(1)}.{modules[match.group(2)]}.{match.group(3)}"
    raise GGUFError(
        f"GGUF tensor {gguf_name!r} has no counterpart in the supported architectures {SUPPORTED_ARCHITECTURES}"
    )


def unpermute_rows(w: mx.array, n_head: int) -> mx.array:
    """Undo llama.cpp's q/k row permutation (``reshape(n_head, 2, rows // n_head // 2, ...).swapaxes(1, 2)``).

    Works on weights, scales, biases and bias vectors alike: quantization groups run along the input
    axis, so whole rows move.
    """
    rows, rest = w.shape[0], w.shape[1:]
    return w.reshape(n_head, rows // n_head // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)


def _quantized_bits(tensors: dict[str, mx.array]) -> dict[str, int]:
    """Bits per quantized module (name without suffix): weight is uint32-packed, one scale per 32 inputs."""
    bits = {}
    for name, scales in tensors.items():
        if not name.endswith(".scales"):
            continue
        module = name[: -len(".scales")]
        weight = tensors.get(f"{module}.weight")
        if weight is None or weight.dtype != mx.uint32:
            raise GGUFError(f"GGUF tensor {module!r} has quantization scales but no packed weight")
        per_group_words, remainder = divmod(weight.shape[-1], scales.shape[-1])
        if remainder or per_group_words not in (2, 3, 4, 5, 6, 8):
            raise GGUFError(f"GGUF tensor {module!r} has a quantized layout this converter does not know")
        bits[module] = per_group_words  # words of 32 bits per group of 32 values = bits per value
    return bits


def _quantization_config(bits: dict[str, int]) -> dict | None:
    """``{"group_size": 32, "bits": B}`` with per-module overrides where a module's bits differ from the most common."""
    if not bits:
        return None
    common = Counter(bits.values()).most_common(1)[0][0]
    config: dict[str, Any] = {"group_size": GROUP, "bits": common}
    for module, module_bits in sorted(bits.items()):
        if module_bits != common:
            config[module] = {"group_size": GROUP, "bits": module_bits}
    return config


def _stored(x: mx.array, scales_dtype) -> mx.array:
    """float32 as float16 when the checkpoint's scales are float16 and the cast loses nothing."""
    if scales_dtype is not None and x.dtype == mx.float32 and scales_dtype == mx.float16:
        return float16_if_exact(x)
    return x


def _required(arch: str, n_layers: int) -> list[str]:
    """Tensors (mlx-lm names, without the output layer) a llama / qwen2 / qwen3 / phi3 checkpoint must have."""
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    for i in range(n_layers):
        names += [f"model.layers.{i}.{module}.weight" for module in ARCH_BLOCK_TENSORS[arch].values()]
        if arch == "qwen2":
            names += [f"model.layers.{i}.self_attn.{p}_proj.bias" for p in "qkv"]
    return names


def convert_tensors(tensors: dict[str, mx.array], arch: str, n_head: int, n_head_kv: int) -> dict[str, mx.array]:
    """GGUF tensors under mlx-lm names, llama's q/k rows un-permuted, dtypes as stored (see the module docstring)."""
    scales_dtypes = {t.dtype for name, t in tensors.items() if name.endswith(".scales")}
    scales_dtype = scales_dtypes.pop() if len(scales_dtypes) == 1 else None
    converted = {}
    for gguf_name, x in tensors.items():
        name = hf_tensor_name(gguf_name, arch)
        if arch == "llama" and ".self_attn.q_proj." in name:
            x = unpermute_rows(x, n_head)
        elif arch == "llama" and ".self_attn.k_proj." in name:
            x = unpermute_rows(x, n_head_kv)
        converted[name] = _stored(x, scales_dtype)
    return converted


def model_config(meta: dict[str, Any], tensors: dict[str, mx.array], quantization: dict | None) -> dict:
    """config.json for mlx-lm (and Hugging Face field names) from the GGUF metadata and the converted tensors."""
    arch = meta["general.architecture"]

    def field(key: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise GGUFError(f"GGUF metadata has no {arch}.{key}")
        return value

    hidden, n_head = int(field("embedding_length")), int(field("attention.head_count"))
    n_head_kv = int(field("attention.head_count_kv", n_head))
    head_dim = int(meta.get(f"{arch}.attention.key_length", hidden // n_head))
    if arch == "qwen2" and head_dim != hidden // n_head:
        raise GGUFError(f"qwen2 with head size {head_dim} != hidden / heads is not supported by mlx-lm's qwen2")
    rotary = meta.get(f"{arch}.rope.dimension_count", head_dim)
    if rotary != head_dim and arch != "phi3":
        raise GGUFError(f"partial rotary embeddings ({rotary} of {head_dim} dims) are not supported for {arch}")
    embed = tensors["model.embed_tokens.weight"]
    config: dict[str, Any] = {"architectures": [_HF_CLASSES[arch]], "model_type": arch}
    if arch == "llama":
        config.update(attention_bias="model.layers.0.self_attn.q_proj.bias" in tensors, mlp_bias=False)
    if arch == "phi3":
        config.update(
            partial_rotary_factor=rotary / head_dim, original_max_position_embeddings=int(field("context_length"))
        )
    config.update(
        hidden_size=hidden,
        intermediate_size=int(field("feed_forward_length")),
        num_hidden_layers=int(field("block_count")),
        num_attention_heads=n_head,
        num_key_value_heads=n_head_kv,
        head_dim=head_dim,
        hidden_act="silu",
        max_position_embeddings=int(field("context_length")),
        rms_norm_eps=_float32_text(field("attention.layer_norm_rms_epsilon")),
        rope_theta=_float32_text(field("rope.freq_base", 10000.0 if arch == "llama" else 1000000.0)),
        rope_scaling=_rope_scaling(meta, arch),
        tie_word_embeddings="lm_head.weight" not in tensors,
        vocab_size=int(embed.shape[0]),
    )
    for key, meta_key in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id")):
        if f"tokenizer.ggml.{meta_key}" in meta:
            config[key] = int(meta[f"tokenizer.ggml.{meta_key}"])
    float_dtypes = Counter(
        str(t.dtype).split(".")[-1] for n, t in tensors.items() if mx.issubdtype(t.dtype, mx.floating)
    )
    scales = [t for n, t in tensors.items() if n.endswith(".scales")]
    config["torch_dtype"] = str(scales[0].dtype).split(".")[-1] if scales else float_dtypes.most_common(1)[0][0]
    config["use_cache"] = True
    if "tokenizer.ggml.padding_token_id" in meta:
        config["pad_token_id"] = int(meta["tokenizer.ggml.padding_token_id"])
    if quantization is not None:
        config["quantization"] = quantization
        config["quantization_config"] = dict(quantization)
    return config


def _rope_scaling(meta: dict[str, Any], arch: str) -> dict | None:
    kind = meta.get(f"{arch}.rope.scaling.type")
    factor = meta.get(f"{arch}.rope.scaling.factor", meta.get(f"{arch}.rope.scale_linear"))
    if kind is None and factor is not None:
        kind = "linear"
    if kind in (None, "none") or (kind == "linear" and factor in (None, 1.0)):
        return None
    if kind == "linear":
        assert factor is not None  # None returned above
        return {"type": "linear", "factor": _float32_text(factor)}
    raise GGUFError(f"GGUF rope scaling {kind!r} is not supported (supported: linear)")


def _generation_config(meta: dict[str, Any]) -> dict:
    config: dict[str, Any] = {}
    for key in ("bos_token_id", "eos_token_id"):
        if f"tokenizer.ggml.{key}" in meta:
            config[key] = int(meta[f"tokenizer.ggml.{key}"])
    eot = meta.get("tokenizer.ggml.eot_token_id")
    if eot is not None and "eos_token_id" in config and int(eot) != config["eos_token_id"]:
        config["eos_token_id"] = [config["eos_token_id"], int(eot)]
    if "tokenizer.ggml.padding_token_id" in meta:
        config["pad_token_id"] = int(meta["tokenizer.ggml.padding_token_id"])
    return config


def _check_architecture(meta: dict[str, Any], path: Path) -> str:
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise GGUFError(
            f"GGUF architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
            f" in {path.name}"
        )
    return arch


def convert_gguf(gguf_path: str | Path, out_dir: str | Path) -> Path:
    """Write the mlx-lm checkpoint of a GGUF file into ``out_dir``.

    Args:
        gguf_path: the GGUF file.
        out_dir: the directory to create; it must not exist or be empty.
    Returns:
        ``out_dir`` as a Path.
    Raises:
        GGUFError: see the module docstring; also when ``out_dir`` is a non-empty directory or a file,
            or cannot be written.
    """
    source, out = Path(gguf_path).expanduser(), Path(out_dir).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise GGUFError(f"{out} exists and is not an empty directory")
    tensors, meta = read_gguf(source)
    arch = _check_architecture(meta, source)
    if any(name.startswith("rope_factors") for name in tensors):
        raise GGUFError(f"{source.name}: longrope rotary scaling (its rope_factors tensors) is not supported")
    n_head = int(meta.get(f"{arch}.attention.head_count", 0)) or 1
    n_head_kv = int(meta.get(f"{arch}.attention.head_count_kv", n_head))
    weights, codes = split_codes(convert_tensors(tensors, arch, n_head, n_head_kv))
    missing = [name for name in _required(arch, int(meta.get(f"{arch}.block_count", 0))) if name not in weights]
    if missing:
        raise GGUFError(f"{source.name} lacks {len(missing)} tensors a {arch} model needs, e.g. {missing[:3]}")
    quantization = _quantization_config(_quantized_bits(weights))
    config = model_config(meta, weights, quantization)
    tokenizer = build_tokenizer(meta)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
    except OSError as error:
        raise GGUFError(f"cannot write {out}: {error}") from error
    try:
        mx.save_safetensors(str(scratch / "model.safetensors"), weights, metadata={"format": "mlx"})
        if codes:
            mx.save_safetensors(str(scratch / GROUP16_FILE), codes, metadata={"format": "mlxd-group16"})
        tokenizer.save(str(scratch / "tokenizer.json"))
        _write_json(scratch / "config.json", config)
        _write_json(scratch / "tokenizer_config.json", tokenizer_config(meta, config["max_position_embeddings"]))
        _write_json(scratch / "generation_config.json", _generation_config(meta))
        _write_json(scratch / VERSION_FILE, {"converter_version": CONVERTER_VERSION, "source": source.name})
        if out.exists():
            out.rmdir()  # empty, checked above
        os.rename(scratch, out)
    except OSError as error:
        raise GGUFError(f"cannot write {out}: {error}") from error
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out


def _write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n")


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for chunk in iter(lambda: stream.read(HASH_CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def cached_conversion(gguf_path: str | Path, sha256: str | None = None) -> Path:
    """The converted checkpoint directory of a GGUF file, ``<cache>/gguf/<sha256>/``, converting it first when absent.

    ``sha256``: the file's digest when the caller has just checked it (the default model's download), so
    the file is not read again; None: computed here.

    Raises:
        GGUFError: the file cannot be read or converted (see ``convert_gguf``).
    """
    source = Path(gguf_path).expanduser()
    if not source.is_file():
        raise GGUFError(f"GGUF file {str(gguf_path)!r} does not exist")
    try:
        target = mlxd_cache_dir() / "gguf" / (sha256 or file_sha256(source))
    except OSError as error:
        raise GGUFError(f"cannot read {source}: {error}") from error
    if (target / "config.json").is_file():
        if converter_version(target) >= CONVERTER_VERSION:
            return target
        log.info("converting %s again into %s (the cached conversion is an older converter's)", source.name, target)
        return _replace_conversion(source, target)
    log.info("converting %s into %s (once)", source.name, target)
    try:
        convert_gguf(source, target)
    except GGUFError:
        if (target / "config.json").is_file():  # another process converted the same file meanwhile
            return target
        raise
    return target


def converter_version(directory: Path) -> int:
    """The converter version that wrote a conversion directory (0: one written before versions were kept)."""
    try:
        return int(json.loads((directory / VERSION_FILE).read_text()).get("converter_version", 0))
    except (OSError, ValueError, AttributeError):
        return 0


def _replace_conversion(source: Path, target: Path) -> Path:
    """Convert ``source`` beside ``target`` and swap it in; a process that swapped first wins (same content)."""
    fresh = target.with_name(f".{target.name}.v{CONVERTER_VERSION}-{os.getpid()}")
    stale = target.with_name(f".{target.name}.stale-{os.getpid()}")
    shutil.rmtree(fresh, ignore_errors=True)
    convert_gguf(source, fresh)
    try:
        os.rename(target, stale)
        os.rename(fresh, target)
    except OSError as error:
        if converter_version(target) < CONVERTER_VERSION:  # not another process's fresh conversion either
            raise GGUFError(f"cannot replace {target}: {error}") from error
    finally:
        shutil.rmtree(fresh, ignore_errors=True)
        shutil.rmtree(stale, ignore_errors=True)
    return target
