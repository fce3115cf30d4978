"""Quantized layers of widths the CPU kernel does not read (2, 3, 5 and 6 bits), repacked exactly into widths it
does (4 and 8 bits).

MLX's affine format stores w = scale * q + bias, q an unsigned integer of ``bits`` bits packed into uint32
words (element j of a word at bits ``bits * j``). A 2- or 3-bit code is a 4-bit code of the same value and a 5- or
6-bit code an 8-bit one, so a layer repacked at the wider width keeps every code, scale and bias: its weights
are the same numbers, and the kernel reads them at 4 or 8 bits a weight where the float32 rule would read 32.
mlx-lm's mixed recipes (``--quant-predicate mixed_4_6``: 6-bit v_proj and down_proj beside 4-bit layers) and
mlx-community's 3-, 5- and 6-bit checkpoints then run on the kernel like 4- and 8-bit ones.
Reading 5 bits as stored (5/8 of the bytes) was measured no faster: the product is then bound by the
decode (docs/benchmark_results/code_notes.md#mixed-precision).

Contract: ``repack_for_kernel(layers)`` changes each quantized layer (``QuantizedLinear``,
``QuantizedEmbedding``, mlx-lm's ``QuantizedSwitchLinear``) in place whose width is in ``WIDER``, its mode
affine, its group size one the kernel takes and its biases present, and returns how many it changed of each
stored width; the others are left as they are. ``codes`` and ``pack`` read and write MLX's packing of any width
(the GGUF import packs its blocks' codes with ``pack`` too).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from .kernel_layers import takes

WIDER = {2: 4, 3: 4, 5: 8, 6: 8}  # stored width -> the width the kernel reads it at
ROWS_AT_ONCE = 1024  # rows packed a bit at a time together: bounds the temporary at 8 bytes a bit of a row


def codes(weight: mx.array, bits: int, group_size: int) -> mx.array:
    """The unsigned codes of a packed affine weight [..., K * bits / 32], as uint8 [..., K]."""
    k = weight.shape[-1] * 32 // bits
    unit = mx.ones((*weight.shape[:-1], k // group_size), dtype=mx.float32)
    zero = mx.zeros_like(unit)
    # scale 1 and bias 0 give each code itself, exactly (codes are below 2^8)
    return mx.dequantize(weight, unit, zero, group_size=group_size, bits=bits).astype(mx.uint8)


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """uint8 codes [..., K] of at most ``bits`` bits packed as MLX packs them, a little-endian bit stream (code j
    at bits ``bits * j``): uint32 [..., K * bits / 32]. Any width; 4 and 8 bits without the bit-at-a-time pass."""
    if bits == 8:
        return np.ascontiguousarray(codes).view("<u4")
    if bits == 4:
        return np.ascontiguousarray(codes[..., 0::2] | (codes[..., 1::2] << 4)).view("<u4")
    rows = codes.reshape(-1, codes.shape[-1])
    out = np.empty((len(rows), codes.shape[-1] * bits // 32), "<u4")
    for start in range(0, len(rows), ROWS_AT_ONCE):  # a bit a byte: bounded by rows at a time
        fields = (rows[start : start + ROWS_AT_ONCE, :, None] >> np.arange(bits, dtype=np.uint8)) & 1
        stream = np.packbits(fields.reshape(len(fields), -1), axis=-1, bitorder="little")
        out[start : start + ROWS_AT_ONCE] = stream.view("<u4")
    return out.reshape(*codes.shape[:-1], -1)


def repack_for_kernel(layers: list) -> dict[int, int]:
    """Repack each of ``layers`` that ``WIDER`` widens (see the module docstring); returns stored width ->
    layers repacked."""
    repacked: dict[int, int] = {}
    for layer in layers:
        if layer.bits not in WIDER or not takes(layer, bits=WIDER[layer.bits]):
            continue
        stored = layer.bits
        layer["weight"] = mx.array(pack(np.array(codes(layer["weight"], stored, layer.group_size)), WIDER[stored]))
        layer.bits = WIDER[stored]
        mx.eval(layer["weight"])  # one layer's float codes at a time
        repacked[stored] = repacked.get(stored, 0) + 1
    return repacked
