"""Layers on the int8-activation kernel put in column-block order, once at load.

Why: in MLX's order each output column's weights are one run, so the int8 kernel's 32-bit lanes are a column's x
blocks and every block's integer sum is scaled for every column apart. In column-block order
(``mlxd_qmatmul.interleave_columns``) a block of 16 columns lies side by side: one vpdpbusd sums an x block
for all 16, and a group's sums are scaled once. 4-bit products of 1-9 rows ran 1.1-2x faster than in MLX's order
(docs/benchmark_results/code_notes.md#int8-columns), a verify's most.

Contract: ``order_int8_columns(model)`` rearranges, in place, the weights of every kernel layer that runs with
int8 activations (``kernel_int8 == INT8_ROWS``: 4 or 8 bits, groups of 32 or more): plain layers, quantized
embedding tables (a tied output head; their lookups read that order too: ``dequantized_rows``) and each
projection group (``projection_groups.py``: the packed q/k/v or gate/up, each part in its own blocks, its
layers' views cut again). Those layers then run ``INT8_COLUMNS`` at every row count (no dequantize-then-BLAS
path reads that order); their results keep the same integer sums, within float32 rounding of MLX's order, and
each row's bits no longer depend on how many rows a product has. Returns how many layers it rearranged. Call it
after ``use_kernel`` and ``group_projections``, and not on a model that is sharded later (a shard of column-block
order is not a column-block order).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

import mlxd_qmatmul

from .kernel_layers import UNBOUNDED, KernelQuantizedEmbedding, KernelQuantizedLinear
from .projection_groups import GroupedQuantizedLinear, ProjectionGroup


def _takes(layer) -> bool:
    return layer.kernel_int8 == mlxd_qmatmul.INT8_ROWS


def _order_group(group: ProjectionGroup) -> int:
    group.weight, group.scales, group.biases = mlxd_qmatmul.interleave_columns(
        group.weight, group.scales, group.biases, group.sizes
    )
    group.int8 = mlxd_qmatmul.INT8_COLUMNS
    for layer, (start, end) in zip(group.layers, group.ranges):
        layer["weight"], layer["scales"], layer["biases"] = (
            group.weight[start:end],
            group.scales[start:end],
            group.biases[start:end],
        )  # views: the packed arrays hold the bytes
        layer.kernel_int8 = mlxd_qmatmul.INT8_COLUMNS
        layer.kernel_max_rows = UNBOUNDED
    mx.eval([layer.parameters() for layer in group.layers])
    return len(group.layers)


def order_int8_columns(model: nn.Module) -> int:
    """Rearrange the model's int8 kernel layers into column-block order (module docstring)."""
    count = 0
    groups: dict[int, ProjectionGroup] = {}
    for _, layer in model.named_modules():
        if not isinstance(layer, (KernelQuantizedLinear, KernelQuantizedEmbedding)) or not _takes(layer):
            continue
        if isinstance(layer, GroupedQuantizedLinear):
            groups[id(layer.projection_group)] = layer.projection_group
            continue
        layer["weight"], layer["scales"], layer["biases"] = mlxd_qmatmul.interleave_columns(
            layer["weight"], layer["scales"], layer["biases"]
        )
        layer.kernel_int8 = mlxd_qmatmul.INT8_COLUMNS
        layer.kernel_max_rows = UNBOUNDED
        count += 1
    for group in groups.values():
        count += _order_group(group)
    return count
