"""GGUF tensors read block by block: the quantized types that are affine in groups of 32 become MLX's affine
format with the file's own codes, the rest float values.

llama.cpp stores a quantized row as blocks; in Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K and Q5_K every run of 32
weights is ``w = scale * q + bias`` with ``q`` an unsigned code (Q4_0 / Q5_0 / Q8_0 are symmetric: the bias is
-8, -16 or -128 times the scale; Q4_K / Q5_K take a 6-bit scale and minimum per 32 weights times the block's
two float16 factors). That is MLX's affine quantization with group size 32, so those tensors keep every code
and their weights are the same numbers: 4 bits for Q4_*, 5 for Q5_* and 8 for Q8_0. Scales and biases are
float16 where that holds them exactly (the legacy types always), else float32 (the K types' products of a
float16 factor and a 6-bit integer).

Q2_K, Q3_K and Q6_K are affine in groups of 16 weights, which MLX's format does not have (its groups are 32
or more): they become float16 values, as MLX's reader made them (what mlx-lm and GPU backends read), and, for
mlxd on the CPU, the same weights exactly as 8-bit codes in groups of 16 (``group16``). The other types (IQ,
ternary, MXFP4) are dequantized with llama.cpp's own Python package (``gguf``) and stored as float16, as MLX's
reader did for the types it knew.

Contract: ``read_tensor(tensor)`` takes a ``gguf.ReaderTensor`` and returns ``{"weight": w}`` (float values,
the tensor's numpy-order shape), ``{"weight": packed uint32, "scales": s, "biases": b}``, or for the groups
of 16 ``{"weight": w, "codes": packed uint32, "code_scales": s, "code_biases": b}``, as MLX arrays
(bfloat16 tensors stay bfloat16); a type ``gguf`` cannot decode raises ``GGUFBlockError`` naming it.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, ReaderTensor, quants

from .repack import pack

GROUP = 32  # every affine type here has one scale and bias per 32 weights
ROWS_AT_ONCE = 1024  # rows dequantized at a time, so a vocabulary-sized tensor needs no float32 copy of itself


class GGUFBlockError(ValueError):
    """A tensor whose type cannot be read."""


def _halves(blocks: np.ndarray, start: int) -> np.ndarray:
    """The float16 at byte ``start`` of each block, as float32 [n, 1]."""
    return blocks[:, start : start + 2].copy().view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """16 bytes a block -> 32 codes: the low nibbles are weights 0-15, the high ones 16-31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """Q5_0 / Q5_1's 4 bytes a block -> bit j of their little-endian word, shifted to 16, for weight j."""
    word = qh.copy().view("<u4")
    return (((word >> np.arange(32, dtype=np.uint32)) & 1) << 4).astype(np.uint8)


def _legacy(blocks: np.ndarray, kind: GGMLQuantizationType) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0: one float16 scale (and a float16 minimum for *_1) per block of 32."""
    d = _halves(blocks, 0)
    if kind == GGMLQuantizationType.Q8_0:
        return (blocks[:, 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8), d, -128.0 * d
    offset = 4 if kind in (GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q5_1) else 2
    if kind in (GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1):
        q = _nibbles(blocks[:, offset:])
        centre = 8.0
    else:
        q = _nibbles(blocks[:, offset + 4 :]) | _high_bits(blocks[:, offset : offset + 4])
        centre = 16.0
    if offset == 4:
        return q, d, _halves(blocks, 2)
    return q, d, -centre * d


def _k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12 bytes of Q4_K / Q5_K scales -> 8 six-bit scales and 8 six-bit minimums a block."""
    sc = np.empty((len(packed), 8), np.uint8)
    mn = np.empty((len(packed), 8), np.uint8)
    sc[:, :4] = packed[:, 0:4] & 63
    mn[:, :4] = packed[:, 4:8] & 63
    sc[:, 4:] = (packed[:, 8:12] & 0x0F) | ((packed[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (packed[:, 8:12] >> 4) | ((packed[:, 4:8] >> 6) << 4)
    return sc, mn


def _k_affine(blocks: np.ndarray, kind: GGMLQuantizationType) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_K / Q5_K: blocks of 256 weights in 8 groups of 32; w = d * sc * q - dmin * m."""
    d, dmin = _halves(blocks, 0), _halves(blocks, 2)
    sc, mn = _k_scales(blocks[:, 4:16])
    qs = blocks[:, -128:].reshape(-1, 4, 1, 32)  # 4 chunks of 64 weights: low nibbles 32, then high nibbles 32
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=2)  # [n, 4, 2, 32]
    if kind == GGMLQuantizationType.Q5_K:
        qh = blocks[:, 16:48].reshape(-1, 1, 1, 32)
        bit = np.arange(8, dtype=np.uint8).reshape(1, 4, 2, 1)  # chunk c, half h -> bit 2c + h of qh
        q = q | (((qh >> bit) & 1) << 4)
    return q.reshape(-1, 256), d * sc, -(dmin * mn)


def _shifted(packed: np.ndarray, width: int, shifts: int, bits: int) -> np.ndarray:
    """Each row of ``width``-byte chunks read ``shifts`` times, ``bits`` bits apart: codes in chunk-major order."""
    chunks = packed.reshape(len(packed), -1, 1, width)
    steps = (np.arange(shifts, dtype=np.uint8) * bits).reshape(1, 1, shifts, 1)
    return ((chunks >> steps) & np.uint8((1 << bits) - 1)).reshape(len(packed), -1)


def _q6_k(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q6_K: 256 weights in 16 groups of 16; w = d * sc * (q - 32), q of 6 bits, sc a signed byte."""
    low = _shifted(blocks[:, :128], 64, 2, 4)
    high = _shifted(blocks[:, 128:192], 32, 4, 2)
    scale = _halves(blocks, 208) * blocks[:, 192:208].view(np.int8).astype(np.float32)
    return low | (high << 4), scale, -32.0 * scale


def _q3_k(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q3_K: 256 weights in 16 groups of 16; w = d * (sc - 32) * (q - 4), q of 3 bits (its high bit kept apart,
    set meaning +4), sc of 6 bits packed as 4 + 2."""
    packed = blocks[:, 96:108]
    low = _shifted(packed[:, :8], 8, 2, 4)
    high = _shifted(packed[:, 8:12], 4, 4, 2)
    scale = _halves(blocks, 108) * (((low | (high << 4)).astype(np.float32)) - 32.0)
    q = _shifted(blocks[:, 32:96], 32, 4, 2) | (_shifted(blocks[:, :32], 32, 8, 1) << 2)
    return q, scale, -4.0 * scale


def _q2_k(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q2_K: 256 weights in 16 groups of 16; w = d * sc * q - dmin * m, q of 2 bits, sc and m of 4."""
    packed = blocks[:, :16]
    q = _shifted(blocks[:, 16:80], 32, 4, 2)
    return q, _halves(blocks, 80) * (packed & 0x0F), -(_halves(blocks, 82) * (packed >> 4))


# Types whose every run of 16 weights is affine in a code of at most 6 bits: kept exactly as 8-bit codes in groups
# of 16 besides their float values, for mlxd's CPU kernel (``group16``).
SMALL_GROUP = 16
_SMALL_GROUPS = {
    GGMLQuantizationType.Q6_K: _q6_k,
    GGMLQuantizationType.Q3_K: _q3_k,
    GGMLQuantizationType.Q2_K: _q2_k,
}

_AFFINE = {
    GGMLQuantizationType.Q4_0: (4, _legacy),
    GGMLQuantizationType.Q4_1: (4, _legacy),
    GGMLQuantizationType.Q5_0: (5, _legacy),
    GGMLQuantizationType.Q5_1: (5, _legacy),
    GGMLQuantizationType.Q8_0: (8, _legacy),
    GGMLQuantizationType.Q4_K: (4, _k_affine),
    GGMLQuantizationType.Q5_K: (5, _k_affine),
}


def float16_if_exact(x: mx.array) -> mx.array:
    """``x`` as float16 when float16 holds every value exactly, else as it is (``gguf_import`` uses it too)."""
    half = x.astype(mx.float16)
    return half if mx.array_equal(half.astype(x.dtype), x).item() else x


def _small_groups(data: np.ndarray, kind: GGMLQuantizationType) -> dict[str, mx.array]:
    """A Q6_K / Q3_K / Q2_K tensor: its values as float16 (as for the other types) and the same weights exactly, as
    8-bit codes in groups of 16 with float32 scales and biases (bit-equal to what ``gguf`` dequantizes to)."""
    block_size, block_bytes = GGML_QUANT_SIZES[kind]
    rows, n_groups = data.shape[:-1], data.shape[-1] // block_bytes * block_size // SMALL_GROUP
    q, scales, biases = _SMALL_GROUPS[kind](data.reshape(-1, block_bytes))
    q = q.reshape(-1, n_groups, SMALL_GROUP)
    scales, biases = scales.reshape(-1, n_groups, 1), biases.reshape(-1, n_groups, 1)
    values = np.concatenate(  # ROWS_AT_ONCE rows at a time: no float32 copy of a vocabulary-sized tensor
        [
            (
                q[i : i + ROWS_AT_ONCE].astype(np.float32) * scales[i : i + ROWS_AT_ONCE] + biases[i : i + ROWS_AT_ONCE]
            ).astype(np.float16)
            for i in range(0, len(q), ROWS_AT_ONCE)
        ]
    )
    scales, biases = scales.reshape(*rows, n_groups), biases.reshape(*rows, n_groups)
    return {
        "weight": mx.array(values.reshape(*rows, n_groups * SMALL_GROUP)),
        "codes": mx.array(pack(q.reshape(*rows, n_groups * SMALL_GROUP), 8)),
        "code_scales": mx.array(scales),
        "code_biases": mx.array(biases),
    }


def read_tensor(tensor: ReaderTensor) -> dict[str, mx.array]:
    """See the module docstring."""
    kind = GGMLQuantizationType(tensor.tensor_type)
    data = np.asarray(tensor.data)
    if kind in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        return {"weight": mx.array(data)}
    if kind == GGMLQuantizationType.BF16:
        return {"weight": mx.array(data.view(np.uint16)).view(mx.bfloat16)}
    if kind in _AFFINE:
        bits, decode = _AFFINE[kind]
        block_size, block_bytes = GGML_QUANT_SIZES[kind]
        rows, n_groups = data.shape[:-1], data.shape[-1] // block_bytes * block_size // GROUP
        q, scales, biases = decode(data.reshape(-1, block_bytes), kind)
        pair = float16_if_exact(
            mx.array(np.concatenate([scales.reshape(*rows, n_groups), biases.reshape(*rows, n_groups)], -1), mx.float32)
        )
        return {
            "weight": mx.array(pack(q.reshape(*rows, n_groups * GROUP), bits)),
            "scales": pair[..., :n_groups],
            "biases": pair[..., n_groups:],
        }
    if kind in _SMALL_GROUPS:
        return _small_groups(data, kind)
    flat = data.reshape(-1, data.shape[-1])
    try:
        values = np.concatenate(
            [
                quants.dequantize(flat[i : i + ROWS_AT_ONCE], kind).astype(np.float16)
                for i in range(0, len(flat), ROWS_AT_ONCE)
            ]
        )
    except NotImplementedError as error:
        raise GGUFBlockError(f"GGUF tensor {tensor.name!r} has type {kind.name}, which cannot be read") from error
    return {"weight": mx.array(values.reshape(*data.shape[:-1], -1))}
