"""Sibling projections that read the same input, run as one product on the CPU quantized-matmul kernel.

Contract: ``group_projections(model)`` finds in each module of ``model`` the kernel layers a model file
applies to one input after another (``GROUPS``: q/k/v of attention, gate/up of an MLP, by attribute name)
that share a format (bits, group size, input size, scale dtype, a bias on all or none), packs each group's
weights, scales, biases (and bias) into one array, and gives every layer a row view of it as its own
parameters: ``parameters()``, shapes and bytes stay as they were. It returns how many groups it made.
A grouped layer called with an array computes the product of its whole group once; its siblings called
with that same array (``is``) take their columns of it; a layer called with another input computes its
own product from its view. Each output column is computed exactly as the layer alone would on the kernel
(bit-identical); past the kernel's row limit (prompt chunks) the dequantized group goes through BLAS in one
product (within float32 rounding of three). Used only after ``use_kernel`` (the CPU backend);
``MLXD_GROUP_PROJECTIONS=0`` turns it off. Example: SmolLM2's 30 layers make 60 groups, its 210 products
a step become 120.
"""

from __future__ import annotations

import os

import mlx.core as mx
import mlx.nn as nn

import mlxd_qmatmul

from .kernel_layers import KernelQuantizedLinear, packed_product

DISABLE_ENV = "MLXD_GROUP_PROJECTIONS"
GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"), ("wq", "wk", "wv"), ("w1", "w3"))


class ProjectionGroup:
    """The packed arrays of sibling layers and the last input's product, split by layer."""

    def __init__(self, layers: list[KernelQuantizedLinear]):
        first = layers[0]
        self.layers = layers
        self.group_size, self.bits, self.int8 = first.group_size, first.bits, first.kernel_int8
        names = ("weight", "scales", "biases") + (("bias",) if "bias" in first else ())
        packed = {name: mx.concatenate([layer[name] for layer in layers], axis=0) for name in names}
        mx.eval(list(packed.values()))
        self.weight, self.scales, self.biases = packed["weight"], packed["scales"], packed["biases"]
        self.bias = packed.get("bias")
        self.sizes = [layer["weight"].shape[0] for layer in layers]
        self.ranges: list[tuple[int, int]] = []
        start = 0
        for layer in layers:
            end = start + layer["weight"].shape[0]
            self.ranges.append((start, end))
            for name in names:
                layer[name] = packed[name][start:end]  # a view: the packed array holds the bytes
            start = end
        mx.eval([layer.parameters() for layer in layers])
        self._memo: tuple[mx.array, list[mx.array]] | None = None  # the last input and its outputs
        self._served = 0

    def output(self, x: mx.array, index: int) -> mx.array:
        """Layer ``index``'s output for ``x``: its part of the group's product when its siblings read the
        same array."""
        memo = self._memo  # one read: (input, outputs) stay a pair whoever else calls in between
        if memo is None or memo[0] is not x:
            memo = self._memo = (x, self._product(x))
            self._served = 0
        self._served += 1
        if self._served >= len(self.sizes):  # every sibling has its part: hold nothing past this forward
            self._memo = None
        return memo[1][index]

    def _product(self, x: mx.array) -> list[mx.array]:
        rows = x.size // x.shape[-1] if x.ndim else 1
        if rows <= min(layer.kernel_max_rows for layer in self.layers):
            parts = mlxd_qmatmul.quantized_matmul_split(
                x,
                self.weight,
                self.scales,
                self.biases,
                self.group_size,
                self.bits,
                self.sizes,
                *mlxd_qmatmul.int8_flags(self.int8),
            )
        else:  # a prompt chunk: the packed weight dequantized once, one BLAS product
            y = packed_product(x, self.weight, self.scales, self.biases, self.group_size, self.bits, 0, self.int8)
            parts = [y[..., a:b] for a, b in self.ranges]
        if self.bias is not None:
            parts = [part + self.bias[a:b] for part, (a, b) in zip(parts, self.ranges)]
        return parts


class GroupedQuantizedLinear(KernelQuantizedLinear):
    projection_group: ProjectionGroup
    group_index: int

    def __call__(self, x):
        return self.projection_group.output(x, self.group_index)


def _format(layer) -> tuple:
    return (
        layer.group_size,
        layer.bits,
        layer["weight"].shape[1],
        layer["scales"].dtype,
        layer.kernel_max_rows,
        layer.kernel_int8,
        "bias" in layer and layer["bias"].dtype,
    )


def _siblings(module: nn.Module, names: tuple[str, ...]) -> list | None:
    layers = [module.get(name) for name in names] if isinstance(module, dict) else []
    if len(layers) != len(names) or any(type(layer) is not KernelQuantizedLinear for layer in layers):
        return None
    return layers if len({_format(layer) for layer in layers}) == 1 else None


def grouping_wanted() -> bool:
    return os.environ.get(DISABLE_ENV, "1").strip() != "0"


def group_projections(model: nn.Module) -> int:
    """Pack the model's sibling kernel layers (see the module's contract); returns how many groups it made."""
    made = 0
    for _, module in model.named_modules():
        for names in GROUPS:
            layers = _siblings(module, names)
            if layers is None:
                continue
            group = ProjectionGroup(layers)
            for index, layer in enumerate(layers):
                layer.__class__ = GroupedQuantizedLinear
                layer.projection_group = group
                layer.group_index = index
            made += 1
    return made
