"""A GGUF file's K-quants with sub-blocks of 16 weights (Q6_K, Q3_K, Q2_K) on mlxd's CPU kernel as 8-bit codes.

MLX's affine format has groups of 32 weights or more, so those tensors have no MLX quantized form: a converted
checkpoint stores them as float16 values (what mlx-lm and GPU backends read), and mlxd's CPU rule would run them
as float32, 4 bytes a weight where the file spends 0.8 (Q6_K). Their every run of 16 weights is
``scale * q + bias`` with a code of at most 6 bits, so the conversion also writes each such tensor as 8-bit
codes in groups of 16 with float32 scales and biases (1.5 bytes a weight) into ``GROUP16_FILE`` beside the
checkpoint. On the CPU, mlxd's loader puts layers of those codes in place of the float layers: they run on the
kernel, or, where the kernel does not run, are dequantized to float32 (no MLX kernel takes groups of 16). Either
way the weights are llama.cpp's own numbers (``gguf_blocks``: bit-equal to its dequantization), not float16
roundings of them.

Contract:
- ``split_codes(tensors)``: the converted tensors without their ``CODE_PARTS``, and those parts as the
  ``GROUP16_FILE`` tensors (``<module>.weight / .scales / .biases``).
- ``swap_in(model, path)``: replaces each float ``Linear`` / ``Embedding`` that the file names by a
  ``KernelQuantizedLinear`` / ``KernelQuantizedEmbedding`` of group size 16 and 8 bits holding the file's
  arrays (a bias kept); a module missing from the model, of another kind or of another shape is left as it
  is, and so is every one when the file cannot be read (logged). Returns how many it replaced. The layers
  need the kernel or ``kernel_layers.dequantized``: MLX itself has no group size 16 (``cpu_weights``
  dequantizes them where the kernel does not take them).
"""

from __future__ import annotations

import logging
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

from .kernel_layers import KernelQuantizedEmbedding, KernelQuantizedLinear

log = logging.getLogger("mlxd.engine")

GROUP16_FILE = "mlxd_group16.safetensors"
GROUP_SIZE, BITS = 16, 8
CODE_PARTS = ("codes", "code_scales", "code_biases")
_FILE_PART = {"codes": "weight", "code_scales": "scales", "code_biases": "biases"}


def split_codes(tensors: dict[str, mx.array]) -> tuple[dict[str, mx.array], dict[str, mx.array]]:
    """See the module's contract."""
    rest, codes = {}, {}
    for name, value in tensors.items():
        module, _, part = name.rpartition(".")
        if part in _FILE_PART:
            codes[f"{module}.{_FILE_PART[part]}"] = value
        else:
            rest[name] = value
    return rest, codes


def _layer(old: nn.Module, weight: mx.array, scales: mx.array, biases: mx.array) -> nn.Module | None:
    """The kernel layer of the arrays in place of ``old``, or None where ``old`` is not its float counterpart."""
    rows, features = weight.shape[0], weight.shape[1] * 32 // BITS
    if scales.shape != (rows, features // GROUP_SIZE) or biases.shape != scales.shape:
        return None
    kind: type[nn.Module]
    if type(old) is nn.Linear:
        kind = KernelQuantizedLinear
    elif type(old) is nn.Embedding:
        kind = KernelQuantizedEmbedding
    else:
        return None
    if tuple(old["weight"].shape) != (rows, features):
        return None
    layer = kind.__new__(kind)  # not through __init__: mx.quantize refuses groups of 16
    nn.Module.__init__(layer)
    layer.group_size, layer.bits, layer.mode = GROUP_SIZE, BITS, "affine"
    layer.weight, layer.scales, layer.biases = weight, scales, biases
    if kind is KernelQuantizedEmbedding:
        layer.num_embeddings, layer.dims = rows, features
    elif "bias" in old:
        layer.bias = old["bias"]
    layer.freeze()
    return layer


def swap_in(model: nn.Module, path: str | Path) -> int:
    """See the module's contract."""
    try:
        arrays = mx.load(str(path))
    except (OSError, RuntimeError, ValueError) as error:  # damaged or cut short: the float layers stay
        log.warning("cannot read %s (%s); its layers run from the checkpoint's float values", path, error)
        return 0
    assert isinstance(arrays, dict)  # a safetensors file loads as a dict of arrays
    modules = dict(model.named_modules())
    replaced = []
    for name in sorted({key.rpartition(".")[0] for key in arrays}):
        parts = [arrays.get(f"{name}.{part}") for part in ("weight", "scales", "biases")]
        old = modules.get(name)
        if old is None or any(part is None for part in parts):
            continue
        layer = _layer(old, *parts)  # type: ignore[arg-type]
        if layer is not None:
            replaced.append((name, layer))
    if replaced:
        model.update_modules(tree_unflatten(replaced))
    return len(replaced)
