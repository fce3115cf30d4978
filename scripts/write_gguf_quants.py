"""Write a GGUF file's weights again in llama.cpp's quantized types, for tests and benchmarks of the GGUF import.

    .venv/bin/python scripts/write_gguf_quants.py SOURCE.gguf OUT.gguf --recipe q4_k_m

Contract: ``requantize(source, out, recipe)`` reads every tensor of ``source`` with llama.cpp's ``gguf``
package (dequantized to float32 where it is quantized), writes each matrix in the type ``recipe`` picks for it
and each vector (norms, biases) as F32, and copies the metadata (``general.file_type`` set to the recipe's).
Recipes: one type for every matrix (``q4_0``, ``q4_1``, ``q5_0``, ``q5_1``, ``q8_0``, ``q4_k``, ``q5_k``,
``q6_k``), or llama.cpp's mixes ``q4_k_m`` and ``q5_k_m`` as ``llama-quantize`` picks them (the output matrix,
or a tied embedding, in Q6_K; attn_v and ffn_down in Q6_K in the layers ``use_more_bits`` names; K types
on a matrix whose rows are not a multiple of 256 replaced as llama.cpp replaces them: Q4_K by Q5_0, Q5_K by
Q5_1, Q6_K by Q8_0).

The legacy types are quantized by the ``gguf`` package; it has no quantizer for the K types, so
``quantize_q4_k``, ``quantize_q5_k`` and ``quantize_q6_k`` here write them with a plain min / max choice of
each group's scale (llama.cpp searches for better ones: the layout is the same, the rounding error larger).
They exist to make files in those layouts, not to make good ones.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType, quants

T = GGMLQuantizationType
QK_K = 256


def _half(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16)


def _bytes(values: np.ndarray) -> np.ndarray:
    """float16 [n] as 2 bytes each [n, 2]."""
    return _half(values).reshape(-1, 1).view(np.uint8)


def _steps(values: np.ndarray, step: np.ndarray, low: int, high: int) -> np.ndarray:
    """round(values / step) clipped to [low, high]; 0 where the step is 0."""
    safe = np.where(step == 0, 1, step)
    return np.where(step == 0, 0, np.clip(np.rint(values / safe), low, high)).astype(np.int32)


def _k_scales_bytes(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """8 six-bit scales and minimums a block -> the 12 bytes Q4_K / Q5_K store."""
    out = np.empty((len(sc), 12), np.uint8)
    out[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)
    return out


def _k_affine(w: np.ndarray, bits: int) -> tuple[np.ndarray, ...]:
    """Blocks of 256 in 8 groups of 32: each group's min / max as 6-bit multiples of the block's two factors."""
    x = w.reshape(-1, 8, 32).astype(np.float32)
    top = (1 << bits) - 1
    low = np.minimum(x.min(-1), 0)
    scale, minimum = (x.max(-1) - low) / top, -low
    d, dmin = _half(scale.max(-1) / 63), _half(minimum.max(-1) / 63)
    d32, dmin32 = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    sc, mn = _steps(scale, d32, 0, 63), _steps(minimum, dmin32, 0, 63)
    q = _steps(x + (dmin32 * mn)[..., None], (d32 * sc)[..., None], 0, top)
    head = np.concatenate([_bytes(d), _bytes(dmin), _k_scales_bytes(sc.astype(np.uint8), mn.astype(np.uint8))], 1)
    return head, q.astype(np.uint8).reshape(-1, 4, 2, 32)  # chunk c of 64: groups 2c (low) and 2c + 1 (high)


def quantize_q4_k(w: np.ndarray) -> np.ndarray:
    """float [rows, K] (K a multiple of 256) -> Q4_K blocks, uint8 [rows, K / 256 * 144]."""
    head, q = _k_affine(w, 4)
    qs = q[:, :, 0] | (q[:, :, 1] << 4)
    return np.concatenate([head, qs.reshape(len(q), 128)], 1).reshape(w.shape[0], -1)


def quantize_q5_k(w: np.ndarray) -> np.ndarray:
    """float [rows, K] (K a multiple of 256) -> Q5_K blocks, uint8 [rows, K / 256 * 176]."""
    head, q = _k_affine(w, 5)
    qs = (q[:, :, 0] & 0x0F) | ((q[:, :, 1] & 0x0F) << 4)
    bit = np.arange(8, dtype=np.uint8).reshape(1, 4, 2, 1)  # chunk c, half h -> bit 2c + h of qh
    qh = (((q >> 4) & 1) << bit).sum(axis=(1, 2), dtype=np.uint8)
    return np.concatenate([head, qh, qs.reshape(len(q), 128)], 1).reshape(w.shape[0], -1)


def quantize_q6_k(w: np.ndarray) -> np.ndarray:
    """float [rows, K] (K a multiple of 256) -> Q6_K blocks, uint8 [rows, K / 256 * 210]: 16 groups of 16,
    w = d * sc * (q - 32) with an int8 sc."""
    x = w.reshape(-1, 16, 16).astype(np.float32)
    scale = np.abs(x).max(-1) / 31
    d = _half(scale.max(-1) / 127)
    d32 = d.astype(np.float32)[:, None]
    sc = _steps(scale, d32, -128, 127)
    q = (_steps(x, (d32 * sc)[..., None], -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 4, 32)  # half, quarter
    low = q & 0x0F
    ql = np.concatenate([low[:, :, 0] | (low[:, :, 2] << 4), low[:, :, 1] | (low[:, :, 3] << 4)], axis=2)  # [n, 2, 64]
    qh = (q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4) | ((q[:, :, 3] >> 4) << 6)
    blocks = [ql.reshape(-1, 128), qh.reshape(-1, 64), sc.astype(np.int8).view(np.uint8), _bytes(d)]
    return np.concatenate(blocks, 1).reshape(w.shape[0], -1)


K_QUANTIZERS = {T.Q4_K: quantize_q4_k, T.Q5_K: quantize_q5_k, T.Q6_K: quantize_q6_k}
FALLBACK = {T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0}  # llama.cpp's for rows not a multiple of 256
SINGLE = {name.lower(): T[name] for name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")}
MIXES = {"q4_k_m": T.Q4_K, "q5_k_m": T.Q5_K}
FILE_TYPES = {
    "q4_0": LlamaFileType.MOSTLY_Q4_0,
    "q4_1": LlamaFileType.MOSTLY_Q4_1,
    "q5_0": LlamaFileType.MOSTLY_Q5_0,
    "q5_1": LlamaFileType.MOSTLY_Q5_1,
    "q8_0": LlamaFileType.MOSTLY_Q8_0,
    "q4_k": LlamaFileType.MOSTLY_Q4_K_S,
    "q5_k": LlamaFileType.MOSTLY_Q5_K_S,
    "q6_k": LlamaFileType.MOSTLY_Q6_K,
    "q4_k_m": LlamaFileType.MOSTLY_Q4_K_M,
    "q5_k_m": LlamaFileType.MOSTLY_Q5_K_M,
}


def use_more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp's choice of the layers whose attn_v and ffn_down get more bits in its _M mixes."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def pick_type(recipe: str, name: str, shape: tuple[int, ...], n_layers: int, tied: bool) -> T:
    """The type ``recipe`` gives the matrix ``name`` of numpy shape ``shape`` (rows, K)."""
    if recipe in SINGLE:
        kind = SINGLE[recipe]
    elif recipe in MIXES:
        kind = MIXES[recipe]
        parts = name.split(".")
        if name == "output.weight" or (tied and name == "token_embd.weight"):
            kind = T.Q6_K
        elif parts[0] == "blk" and parts[2] in ("attn_v", "ffn_down") and use_more_bits(int(parts[1]), n_layers):
            kind = T.Q6_K
    else:
        raise ValueError(f"unknown recipe {recipe!r} (known: {', '.join([*SINGLE, *MIXES])})")
    if kind in K_QUANTIZERS and shape[-1] % QK_K:
        kind = FALLBACK[kind]
    return kind


def quantize(w: np.ndarray, kind: T) -> np.ndarray:
    """float [rows, K] in ``kind``'s blocks."""
    if kind in K_QUANTIZERS:
        return K_QUANTIZERS[kind](w)
    return quants.quantize(w.astype(np.float32), kind)


def _copy_field(writer: GGUFWriter, key: str, field) -> None:
    kind = field.types[0]
    sub_type = field.types[-1] if kind == GGUFValueType.ARRAY else None
    writer.add_key_value(key, field.contents(), kind, sub_type=sub_type)


def requantize(source: str | Path, out: str | Path, recipe: str) -> dict[str, str]:
    """See the module docstring; returns tensor name -> type written. Written to a temporary sibling and
    renamed."""
    reader = GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    n_layers = int(reader.fields[f"{arch}.block_count"].contents())
    names = {t.name for t in reader.tensors}
    out = Path(out)
    descriptor, temporary = tempfile.mkstemp(dir=out.parent, suffix=".gguf")
    os.close(descriptor)
    writer = GGUFWriter(temporary, arch)
    for key, field in reader.fields.items():
        if not key.startswith("GGUF.") and key not in ("general.architecture", "general.file_type"):
            _copy_field(writer, key, field)
    writer.add_file_type(FILE_TYPES[recipe])
    written = {}
    for tensor in reader.tensors:
        values = quants.dequantize(np.asarray(tensor.data), tensor.tensor_type).astype(np.float32)
        if values.ndim < 2:
            writer.add_tensor(tensor.name, values)
            written[tensor.name] = "F32"
            continue
        kind = pick_type(recipe, tensor.name, values.shape, n_layers, tied="output.weight" not in names)
        writer.add_tensor(tensor.name, quantize(values, kind), raw_dtype=kind)
        written[tensor.name] = kind.name
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.chmod(temporary, 0o644)
    os.replace(temporary, out)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source")
    parser.add_argument("out")
    parser.add_argument("--recipe", required=True, choices=[*SINGLE, *MIXES])
    args = parser.parse_args()
    written = requantize(args.source, args.out, args.recipe)
    counts: dict[str, int] = {}
    for kind in written.values():
        counts[kind] = counts.get(kind, 0) + 1
    print(f"wrote {args.out}: " + ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())))


if __name__ == "__main__":
    main()
