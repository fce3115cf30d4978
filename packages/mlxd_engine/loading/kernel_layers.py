"""Quantized layers that run on mlxd's CPU quantized-matmul kernel (``mlxd_qmatmul``), chosen at load.

Contract: ``use_kernel(model)`` turns every mlx ``QuantizedLinear`` / ``QuantizedEmbedding`` and mlx-lm
``QuantizedSwitchLinear`` (a mixture of experts' weights) whose format the kernel takes (affine, 4 or 8 bits,
group 32/64/128, with biases; ``group16`` makes layers of 8-bit groups of 16, a GGUF file's K-quant
sub-blocks, directly as these classes) into the subclasses here, in place: same parameters, same results within
float32 rounding, the weights staying quantized in memory (their scales and biases too may stay float16 or
bfloat16 as stored: the kernel widens them as it reads, and every other use here widens them first, so the
values are those of a float32 copy). Up to ``max_rows`` input rows go through the kernel; more rows (prompt
chunks) are dequantized for that call and go through BLAS, which wins there; an experts layer takes every
row count on the kernel (dequantizing every expert for a chunk would cost more than the chunk).
``measure(kernel_layers(model))`` times the model's largest weight matrix both ways at load (kernel, float32
weights, the dequantize-then-BLAS path) and returns the figures the rule decides by (``cpu_weights.py``);
nothing here runs on a GPU backend.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.switch_layers import QuantizedSwitchLinear

import mlxd_qmatmul

from ..ragged import real_index

DEFAULT_MAX_ROWS = 32
UNBOUNDED = 1 << 30  # max_rows: the kernel takes every row count


def _kernel_or_blas(x, layer, max_rows: int, int8: int = mlxd_qmatmul.INT8_OFF):
    real_rows = real_index(x)
    if real_rows is not None:  # a verify forward of rows of different widths: the real rows only (ragged.py)
        index, spread = real_rows
        rows, width, features = x.shape
        real = _kernel_or_blas(x.reshape(rows * width, features)[index], layer, max_rows, int8)
        return real[spread].reshape(rows, width, real.shape[-1])
    return packed_product(
        x, layer["weight"], layer["scales"], layer["biases"], layer.group_size, layer.bits, max_rows, int8
    )


def packed_product(x, weight, scales, biases, group_size: int, bits: int, max_rows: int, int8: int):
    """x @ dequantize(weight).T: on the kernel for up to ``max_rows`` rows, else dequantized for the call and
    through BLAS. ``int8``: the product's ``mlxd_qmatmul.INT8_*`` mode (column-block weights take every row
    count on the kernel: ``int8_columns.py`` sets their ``max_rows`` unbounded)."""
    rows = x.size // x.shape[-1] if x.ndim else 1
    if rows <= max_rows or int8 == mlxd_qmatmul.INT8_COLUMNS:  # no dequantization reads column-block order
        return mlxd_qmatmul.quantized_matmul(
            x, weight, scales, biases, group_size, bits, *mlxd_qmatmul.int8_flags(int8)
        )
    return x @ dequantized(weight, scales, biases, group_size, bits).T


def _wide(array):
    return array if array.dtype == mx.float32 else array.astype(mx.float32)


def dequantized(weight, scales, biases, group_size: int, bits: int):
    """The float32 weights of a packed affine matrix (or rows of one) in any format the kernel takes: MLX's own
    dequantize, or for 8-bit groups of 16 (not an MLX format) each byte times its group's scale plus its bias,
    the same float32 operations."""
    if group_size in mlxd_qmatmul.GROUP_SIZES:
        return mx.dequantize(weight, _wide(scales), _wide(biases), group_size=group_size, bits=bits)
    if bits != 8:
        raise ValueError(f"no dequantization for {bits}-bit weights in groups of {group_size}")
    codes = weight.view(mx.uint8).astype(mx.float32)
    grouped = codes.reshape(*scales.shape, group_size)
    return (grouped * _wide(scales)[..., None] + _wide(biases)[..., None]).reshape(codes.shape)


class KernelQuantizedLinear(nn.QuantizedLinear):
    kernel_max_rows = DEFAULT_MAX_ROWS
    # how x meets the weights (mlxd_qmatmul.INT8_*): float32, or rounded to int8 (opt-in: MLXD_CPU_WEIGHTS=kernel-int8)
    # against weights in MLX's order or in column-block order (int8_columns.py)
    kernel_int8 = mlxd_qmatmul.INT8_OFF

    def __call__(self, x):
        y = _kernel_or_blas(x, self, self.kernel_max_rows, self.kernel_int8)
        return y + self["bias"] if "bias" in self else y


class KernelQuantizedEmbedding(nn.QuantizedEmbedding):
    kernel_max_rows = DEFAULT_MAX_ROWS
    kernel_int8 = mlxd_qmatmul.INT8_OFF  # as KernelQuantizedLinear's (the table as a tied output head)

    def __call__(self, x):
        on_cpu = mx.default_device() == mx.cpu
        columns = self.kernel_int8 == mlxd_qmatmul.INT8_COLUMNS
        if columns or (on_cpu and self.bits in mlxd_qmatmul.BITS and self.group_size in mlxd_qmatmul.GROUP_SIZES):
            # one op for the lookup, the same bits as the gathers and MLX's dequantize (about forty ops on the
            # CPU stream: docs/benchmark_results/code_notes.md#eval-handoffs); the only reader of column-block order
            return mlxd_qmatmul.dequantized_rows(
                self["weight"], self["scales"], self["biases"], x, self.group_size, self.bits, columns
            )
        return dequantized(self["weight"][x], self["scales"][x], self["biases"][x], self.group_size, self.bits)

    def as_linear(self, x):
        return _kernel_or_blas(x, self, self.kernel_max_rows, self.kernel_int8)


class KernelQuantizedSwitchLinear(QuantizedSwitchLinear):
    """mlx-lm's experts layer (``mx.gather_qmm``) on the kernel: x [..., M, K] broadcast against the expert
    indices [...] (each index picks the weights of its M rows), as mlx-lm's ``SwitchGLU`` calls it, sorted or
    not (the kernel puts rows in order of their expert itself). Always the float kernel: ``kernel-int8`` rounds
    the other layers' x only."""

    def __call__(self, x, indices, sorted_indices=False):
        batch = tuple(mx.broadcast_shapes(tuple(x.shape[:-2]), tuple(indices.shape)))
        rows, features = x.shape[-2], x.shape[-1]
        xs = mx.broadcast_to(x, batch + (rows, features)).reshape(-1, features)
        experts = mx.broadcast_to(mx.expand_dims(indices, -1), batch + (rows,)).reshape(-1)
        y = mlxd_qmatmul.gather_quantized_matmul(
            xs, self["weight"], self["scales"], self["biases"], experts, self.group_size, self.bits
        ).reshape(batch + (rows, -1))
        return y + mx.expand_dims(self["bias"][indices], -2) if "bias" in self else y


_KERNEL_CLASSES: dict[type, type] = {
    nn.QuantizedLinear: KernelQuantizedLinear,
    nn.QuantizedEmbedding: KernelQuantizedEmbedding,
    QuantizedSwitchLinear: KernelQuantizedSwitchLinear,
}


def takes(layer, bits: int | None = None) -> bool:
    """Whether the kernel takes the quantized layer's format (at ``bits`` instead of its own, when given)."""
    return (
        mlxd_qmatmul.supports(bits or layer.bits, layer.group_size, getattr(layer, "mode", "affine"))
        and layer.get("biases") is not None
        and getattr(layer, "global_scale", None) is None
        and layer["weight"].dtype == mx.uint32
    )


def kernel_layers(model: nn.Module) -> list:
    """The model's quantized layers the kernel can run (before or after ``use_kernel``)."""
    kinds = tuple(_KERNEL_CLASSES)
    return [m for _, m in model.named_modules() if isinstance(m, kinds) and takes(m)]


def runs_on_kernel(model) -> bool:
    """Whether some of the model's layers run on the kernel (``use_kernel`` switched them)."""
    modules = model.named_modules() if hasattr(model, "named_modules") else []
    return any(isinstance(module, tuple(_KERNEL_CLASSES.values())) for _, module in modules)


def use_kernel(model: nn.Module, max_rows: int = DEFAULT_MAX_ROWS, int8_activations: bool = False) -> int:
    """Switch the layers the kernel takes to it; returns how many were switched. ``int8_activations``: their
    products round x to int8 where the kernel has that variant (``mlxd_qmatmul.int8_available``)."""
    count = 0
    for layer in kernel_layers(model):
        if type(layer) not in _KERNEL_CLASSES:
            continue  # switched already
        layer.__class__ = _KERNEL_CLASSES[type(layer)]
        layer.kernel_max_rows = max_rows
        int8 = int8_activations and mlxd_qmatmul.int8_available(layer.bits) and layer.group_size >= 32
        layer.kernel_int8 = mlxd_qmatmul.INT8_ROWS if int8 else mlxd_qmatmul.INT8_OFF
        count += 1
    return count


@dataclass(frozen=True)
class KernelTiming:
    shape: tuple[int, int]  # (output, input) of the layer timed
    kernel_ms: dict  # rows -> ms
    float32_ms: dict  # rows -> ms with float32 weights
    dequantize_ms: dict  # rows -> ms dequantizing for the call, then BLAS (timed apart, added)
    max_rows: int  # the most rows the kernel takes (beyond: dequantize, then BLAS)
    int8_activations: bool = False  # the kernel's products were timed with x rounded to int8

    @property
    def faster(self) -> bool:
        """The kernel beats float32 weights on one row and on a batch of 8 (decode's shapes)."""
        return all(self.kernel_ms[r] < self.float32_ms[r] for r in (1, 8))

    def describe(self) -> str:
        def row(d):
            return ", ".join(f"{r} rows {ms:.3f}" for r, ms in sorted(d.items()))

        kernel = (
            f"kernel (int8 activations, x in blocks of {mlxd_qmatmul.int8_block()})"
            if self.int8_activations
            else "kernel"
        )
        return (
            f"{self.shape[0]}x{self.shape[1]} layer, ms: {kernel} {row(self.kernel_ms)}; float32 "
            f"{row(self.float32_ms)}; dequantize+BLAS {row(self.dequantize_ms)}; {self.rows_rule}"
        )

    @property
    def rows_rule(self) -> str:
        return "kernel at every row count" if self.max_rows >= UNBOUNDED else f"kernel up to {self.max_rows} rows"


def best_ms(fn, repeats: int) -> float:
    """The fastest of ``repeats`` evaluations of ``fn()`` after one warm-up, in ms."""
    mx.eval(fn())
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        mx.eval(fn())
        best = min(best, time.perf_counter() - start)
    return best * 1e3


# Two paths timed within this factor of each other are timed again (best of ``repeats``) before the rule
# compares them; further apart, one timing each decides (code_notes.md#load-timing).
CLOSE = 1.5


def _close(a: float, b: float) -> bool:
    return max(a, b) < CLOSE * min(a, b)


def measure(
    layers: list, rows=(1, 8, 16, 32, 64, 128), repeats: int = 3, int8_activations: bool = False
) -> KernelTiming | None:
    """Time the largest of ``layers`` (``kernel_layers(model)``) on copies, so that they do not all sit in cache;
    the kernel's products as they will run (``int8_activations`` where the kernel has that variant). Each path
    is timed once at each row count, and again ``repeats`` times where the kernel and float32 weights, or the
    kernel and dequantize-then-BLAS, are within ``CLOSE`` of each other: the comparisons the rule makes."""
    if not layers:
        return None
    w, s, b, gs, bits = largest_matrix(layers)  # the kernel reads them as they are stored
    int8 = int8_activations and mlxd_qmatmul.int8_available(bits)
    copies = max(1, min(8, (64 << 20) // max(1, w.nbytes)))  # ~64 MB of packed weights per pass
    packed = [(w + 0, s + 0, b + 0) for _ in range(copies)]
    # float32 copies likewise, two where one would sit in cache (one of 64 MB or more streams from memory anyway)
    dense_copies = 1 if w.size * 4 * 32 // bits >= (64 << 20) else 2
    dense = [dequantized(pw, ps, pb, gs, bits) for pw, ps, pb in packed[:dense_copies]]
    mx.eval(packed, dense)
    out_dims, in_dims = dense[0].shape
    # dequantizing costs the same whatever the rows: timed once, the dequantize-then-BLAS path at n rows is
    # that plus the float32 product of n rows (timing the pair at every row count took most of a load:
    # code_notes.md#load-timing)
    pw, ps, pb = packed[-1]
    dequantize_once = best_ms(lambda: dequantized(pw, ps, pb, gs, bits), 1)
    kernel, float32, dequant = {}, {}, {}
    for n in rows:
        x = mx.random.normal((n, in_dims), key=mx.random.key(n))
        mx.eval(x)

        def kernel_pass(x=x):
            return [mlxd_qmatmul.quantized_matmul(x, pw, ps, pb, gs, bits, int8) for pw, ps, pb in packed]

        def float32_pass(x=x):
            return [x @ d.T for d in dense]

        kernel[n], float32[n] = best_ms(kernel_pass, 1) / copies, best_ms(float32_pass, 1) / len(dense)
        if _close(kernel[n], float32[n]) or _close(kernel[n], dequantize_once + float32[n]):
            kernel[n] = min(kernel[n], best_ms(kernel_pass, repeats) / copies)
            float32[n] = min(float32[n], best_ms(float32_pass, repeats) / len(dense))
        dequant[n] = dequantize_once + float32[n]
    return KernelTiming((int(out_dims), int(in_dims)), kernel, float32, dequant, crossover_rows(kernel, dequant), int8)


def largest_matrix(layers: list) -> tuple:
    """(weight, scales, biases, group size, bits) of the largest one matrix of ``layers``: an experts layer
    offers its first expert's."""

    def matrix(layer):
        w, s, b = layer["weight"], layer["scales"], layer["biases"]
        return (w, s, b) if w.ndim == 2 else (w[0], s[0], b[0])

    layer = max(layers, key=lambda m: matrix(m)[0].size)
    return (*matrix(layer), layer.group_size, layer.bits)


def crossover_rows(kernel: dict, dequant: dict) -> int:
    """The most rows the kernel should take, from timings by row count: the largest measured count where it
    is faster, or, when it is faster at the largest, where the lines through the two largest measurements
    of each path meet (``UNBOUNDED`` where the kernel's cost grows no faster per row: dequantizing costs a
    pass over the weights whatever the rows, the kernel's cost is per row, and BLAS's per row may be more)."""
    measured = sorted(kernel)
    faster = [r for r in measured if kernel[r] <= dequant[r]]
    if not faster:
        return 1
    last = measured[-1]
    if faster[-1] < last or len(measured) < 2:
        return faster[-1]
    before = measured[-2]
    kernel_slope = (kernel[last] - kernel[before]) / (last - before)
    dequant_slope = (dequant[last] - dequant[before]) / (last - before)
    if kernel_slope <= dequant_slope:
        return UNBOUNDED
    return min(UNBOUNDED, int(last + (dequant[last] - kernel[last]) / (kernel_slope - dequant_slope)))
