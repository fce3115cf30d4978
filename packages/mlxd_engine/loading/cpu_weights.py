"""The CPU weight rule: on MLX's CPU backend compute in float32, and dequantize when it fits.

Why: MLX's CPU backend runs float16 / bfloat16 arithmetic slowly, and its quantized matmul costs about
one pass over the weights per input token, so a multi-token verify forward costs as many steps as it
has tokens; dequantized float32 weights go through BLAS, where a verify's extra tokens cost far less.
Figures: docs/benchmark_results/cpu_weights.md.

Contract: ``apply_cpu_weight_rule(model, budget_bytes)`` changes the model in place and returns a
``WeightForm`` saying what it did, for the log and the daemon's status:
- On Metal and CUDA nothing changes (the checkpoint runs as stored).
- On the CPU every float16 / bfloat16 parameter is cast to float32 (exact: every such value is a
  float32 value). When mlxd's CPU quantized-matmul kernel is built (``mlxd_qmatmul``) and takes some
  quantized layers (2/3/5/6-bit ones too, repacked exactly at 4 or 8 bits: ``repack.py``; a GGUF file's
  Q6_K / Q3_K / Q2_K tensors as 8-bit groups of 16 in place of their float values: ``group16.py``), those stay
  quantized and run on it (``kernel_layers.py``) if the timing at load
  says it beats float32 weights on decode's shapes (both timings are logged), sibling projections of one
  input packed into one product each (``projection_groups.py``); their scales and biases then
  stay as stored (float16 or bfloat16 read by the kernel: fewer bytes a step, the same values). The
  quantized layers it does not take (other modes, group sizes), or all of them when it is not built or not
  faster, are dequantized to float32 (with float32 scales,
  so the values are exactly ``scale * q + bias`` computed in float32) when the model then fits
  ``budget_bytes``; above it they stay quantized with float32 scales (MLX's own quantized kernels).
- ``MLXD_CPU_WEIGHTS`` (or ``mlxd --cpu-weights``, which takes precedence) chooses otherwise: ``stored`` keeps
  the checkpoint as stored, ``quantized`` casts
  but never dequantizes (MLX's own quantized matmul), ``kernel`` runs the kernel without timing it,
  ``kernel-int8`` too, with x rounded to int8 for the products where the CPU has AVX-512 VNNI (opt-in: not
  float32 rounding; greedy agreement and perplexity in docs/benchmark_results/qmatmul_int8.md; the float
  kernel elsewhere; the layers put in the int8 kernel's column-block order, ``int8_columns.py``),
  ``dequantized`` dequantizes whatever the budget; ``auto`` (default) as above.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

import mlxd_qmatmul
from mlxd_protocol.serving_defaults import CPU_WEIGHT_FORMS

from .group16 import swap_in
from .int8_columns import order_int8_columns
from .kernel_layers import dequantized, kernel_layers, measure, use_kernel
from .projection_groups import group_projections, grouping_wanted
from .repack import repack_for_kernel
from .split_tiles import choose_split_tiles

log = logging.getLogger("mlxd.engine")

ENV = "MLXD_CPU_WEIGHTS"
CHOICES = CPU_WEIGHT_FORMS  # also mlxd --cpu-weights
DEFAULT_BUDGET_FRACTION = 0.4  # of the machine's memory, for the float32 weights


@dataclass(frozen=True)
class WeightForm:
    form: str  # "stored", "float32", "float32 quantized", "kernel quantized", "float32 dequantized"
    detail: str  # one line for the log

    def __str__(self) -> str:
        return self.detail


def default_budget_bytes(fraction: float = DEFAULT_BUDGET_FRACTION) -> int:
    import psutil

    return int(psutil.virtual_memory().total * fraction)


def _is_quantized(module) -> bool:
    return hasattr(module, "scales") and hasattr(module, "bits") and hasattr(module, "group_size")


def quantized_layers(model: nn.Module) -> list:
    return [m for _, m in model.named_modules() if _is_quantized(m)]


def _dense_bytes(layer) -> int:
    """Bytes a quantized layer's weight takes dequantized to float32."""
    weight = layer["weight"]
    return weight.size * 32 // layer.bits * 4 if weight.dtype == mx.uint32 else weight.size * 4


def dequantized_bytes(model: nn.Module) -> int:
    """Bytes the model's parameters take in float32 once every quantized layer is dequantized."""
    total = 0
    packed: set[int] = set()  # ids of the quantized layers' own arrays (counted by their unpacked size)
    for layer in quantized_layers(model):
        total += _dense_bytes(layer)
        packed.update(id(layer[key]) for key in ("weight", "scales", "biases") if key in layer)
    return total + sum(array.size * 4 for _, array in _flat_parameters(model) if id(array) not in packed)


def _flat_parameters(model: nn.Module):
    from mlx.utils import tree_flatten

    return tree_flatten(model.parameters())


def _floating(dtype) -> bool:
    return mx.issubdtype(dtype, mx.floating)


def apply_cpu_weight_rule(
    model: nn.Module,
    budget_bytes: int | None = None,
    choice: str | None = None,
    group16: Path | None = None,
    column_blocks: bool = True,
) -> WeightForm:
    """Apply the rule of the module docstring to ``model`` (in place). ``choice`` overrides the environment;
    ``group16``: a GGUF conversion's file of 8-bit groups of 16 (``group16.py``), whose layers replace their
    float16 copies (unless ``quantized``: MLX's kernels do not take them) and run on the kernel or as float32.
    ``column_blocks``: under ``kernel-int8``, 4-bit layers go into the int8 kernel's column-block order
    (``int8_columns.py``); False for a model sharded after the rule."""
    if not isinstance(model, nn.Module):
        return WeightForm("stored", "weights as stored (not an mlx module)")
    if mx.default_device() != mx.cpu:
        return WeightForm("stored", "weights as stored (GPU backend)")
    choice = (choice or os.environ.get(ENV, "auto")).strip().lower() or "auto"
    if choice not in CHOICES:
        raise ValueError(f"{ENV}={choice!r}: expected one of {', '.join(CHOICES)}")
    if choice == "stored":
        return WeightForm("stored", f"weights as stored ({ENV}=stored; float16 math on the CPU is slow)")
    small_groups = swap_in(model, group16) if group16 is not None and choice != "quantized" else 0
    low_precision = [a for _, a in _flat_parameters(model) if _floating(a.dtype) and a.dtype != mx.float32]
    stored_scales = {
        id(layer): (layer["scales"], layer["biases"]) for layer in quantized_layers(model) if "biases" in layer
    }  # the kernel reads them as stored
    model.set_dtype(mx.float32)  # casts floating parameters only (scales and biases included)
    cast = f"cast {len(low_precision)} float16/bfloat16 tensors to float32" if low_precision else "float32"
    layers = quantized_layers(model)
    if not layers:
        mx.eval(model.parameters())
        return WeightForm("float32", f"weights: {cast}")
    budget = default_budget_bytes() if budget_bytes is None else budget_bytes
    kernel_form = _try_kernel(model, layers, choice, cast, stored_scales, budget, column_blocks)
    if kernel_form is not None:
        if small_groups:
            note = f"; {small_groups} of them 8-bit in groups of 16 (the GGUF file's Q6_K / Q3_K / Q2_K tensors)"
            return WeightForm(kernel_form.form, kernel_form.detail + note)
        return kernel_form
    small = [layer for layer in layers if layer.group_size not in mlxd_qmatmul.GROUP_SIZES]
    if small:  # groups of 16 off the kernel: no MLX kernel takes them, so their float32 values
        dequantize_layers(model, small)
        layers = [layer for layer in layers if layer.group_size in mlxd_qmatmul.GROUP_SIZES]
        cast += f"; {len(small)} layers of 8-bit groups of 16 (the GGUF file's K-quants) dequantized to float32"
        if not layers:
            mx.eval(model.parameters())
            return WeightForm("float32", f"weights: {cast}")
    needed = dequantized_bytes(model)
    if choice == "quantized" or (choice == "auto" and needed > budget):
        why = (
            f"{ENV}=quantized"
            if choice == "quantized"
            else f"dequantized they would take {needed / 2**30:.2f} GiB, above the budget of {budget / 2**30:.2f} GiB"
        )
        mx.eval(model.parameters())
        return WeightForm(
            "float32 quantized",
            f"weights: {cast}; {len(layers)} quantized layers kept quantized with float32 scales ({why}): "
            "on the CPU a k-token verify forward then costs about k decode steps",
        )
    dequantize_layers(model, layers)
    mx.eval(model.parameters())
    return WeightForm(
        "float32 dequantized",
        f"weights: {cast}; {len(layers)} quantized layers dequantized to float32 "
        f"({needed / 2**30:.2f} GiB of a {budget / 2**30:.2f} GiB budget)",
    )


def _set_scales(layers: list, scales: dict) -> None:
    for layer in layers:
        if id(layer) in scales:
            layer["scales"], layer["biases"] = scales[id(layer)]


def dequantize_layers(model: nn.Module, layers: list) -> None:
    """Replace each of ``layers`` (quantized layers of ``model``) by its float layer holding the dequantized
    weights (float32 for float32 scales), in place: ``Linear``, ``Embedding`` or mlx-lm's ``SwitchLinear``
    (``mlx_lm.utils.dequantize_model`` for chosen layers only)."""
    from mlx.utils import tree_unflatten
    from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchLinear

    chosen = {id(layer) for layer in layers}
    replaced = []
    for name, module in model.named_modules():
        if id(module) not in chosen or not isinstance(
            module, (nn.QuantizedLinear, nn.QuantizedEmbedding, QuantizedSwitchLinear)
        ):
            continue  # another library's quantized layer stays as it is (as mlx-lm's dequantize_model leaves it)
        bias = "bias" in module
        small = module.group_size not in mlxd_qmatmul.GROUP_SIZES  # mlxd's own 8-bit groups of 16 (group16)
        weight = (
            dequantized(module["weight"], module["scales"], module["biases"], module.group_size, module.bits)
            if small
            else mx.dequantize(
                module["weight"],
                module["scales"],
                module.get("biases"),
                group_size=module.group_size,
                bits=module.bits,
                mode=getattr(module, "mode", "affine"),
                global_scale=getattr(module, "global_scale", None),
                dtype=mx.float32,  # what the CPU computes in (MXFP4 and NVFP4 would come out as bfloat16)
            )
        )
        if isinstance(module, nn.QuantizedEmbedding):
            dense: nn.Module = nn.Embedding(*weight.shape)
        elif isinstance(module, QuantizedSwitchLinear):
            dense = SwitchLinear(weight.shape[2], weight.shape[1], weight.shape[0], bias=bias)
        else:
            dense = nn.Linear(weight.shape[1], weight.shape[0], bias=bias)
        dense.weight = weight
        if bias:
            dense.bias = module["bias"]
        replaced.append((name, dense))
    if replaced:
        model.update_modules(tree_unflatten(replaced))


def _place_the_rest(model: nn.Module, rest: list, budget: int) -> str:
    """The quantized layers the kernel does not take, once the others run on it: dequantized to float32 when
    the model then fits ``budget``, else left quantized (MLX's kernels). Returns what was done, for the log."""
    formats = ", ".join(sorted({f"{getattr(m, 'mode', 'affine')} {m.bits}-bit" for m in rest}))
    now = sum(array.nbytes for _, array in _flat_parameters(model))
    extra = sum(
        _dense_bytes(m) - sum(m[key].nbytes for key in ("weight", "scales", "biases") if m.get(key) is not None)
        for m in rest
    )
    if now + extra > budget:
        return (
            f"the other {len(rest)} ({formats}) kept quantized on MLX's kernels: dequantized the model would "
            f"take {(now + extra) / 2**30:.2f} GiB, above the budget of {budget / 2**30:.2f} GiB"
        )
    dequantize_layers(model, rest)
    mx.eval(model.parameters())
    return f"the other {len(rest)} ({formats}) dequantized to float32"


def _try_kernel(
    model: nn.Module, layers: list, choice: str, cast: str, stored_scales: dict, budget: int, column_blocks: bool
) -> WeightForm | None:
    """Run the quantized layers the CPU kernel takes on it when it is built, takes some, and (auto) is faster;
    ``stored_scales``: each layer's scales and biases as the checkpoint had them (by layer id)."""
    if choice not in ("auto", "kernel", "kernel-int8"):
        return None
    if not mlxd_qmatmul.available():
        if choice != "auto":
            raise ValueError(f"{ENV}={choice}: {mlxd_qmatmul.unavailable_reason()}")
        log.info("%s; quantized layers are dequantized to float32 instead", mlxd_qmatmul.unavailable_reason())
        return None
    repacked = repack_for_kernel(layers)  # 2/3/5/6-bit layers as the same codes at 4 or 8 bits
    capable = kernel_layers(model)
    if not capable:
        log.info(
            "the CPU quantized-matmul kernel takes none of the %d quantized layers (affine, 4 or 8 bits, groups "
            "of 32/64/128); the float32 rule applies",
            len(layers),
        )
        if choice != "auto":
            raise ValueError(f"{ENV}={choice}: the kernel takes none of the {len(layers)} quantized layers")
        return None
    wide = {id(layer): (layer["scales"], layer["biases"]) for layer in capable}
    _set_scales(capable, stored_scales)
    mx.eval(model.parameters())
    int8 = choice == "kernel-int8"
    if int8:
        mlxd_qmatmul.asked_int8_block()  # a ValueError naming MLXD_INT8_BLOCK where it asks for no block the kernel has
    if int8 and not mlxd_qmatmul.int8_available(capable[0].bits):
        log.info("%s=kernel-int8: this CPU has no int8-activation kernel (AVX-512 VNNI); the float kernel runs", ENV)
    timing = measure(capable, int8_activations=int8)
    assert timing is not None  # None only without layers
    log.info(
        "CPU quantized-matmul kernel (%s, %s) at load: %s",
        mlxd_qmatmul.kernel_isa(),
        mlxd_qmatmul.describe_threads(),
        timing.describe(),
    )
    if choice == "auto" and not timing.faster:
        _set_scales(capable, wide)
        log.info("the kernel is not faster than float32 weights here; quantized layers are dequantized")
        return None
    switched = use_kernel(model, timing.max_rows, int8_activations=int8)
    tiles = choose_split_tiles(capable, int8)
    if tiles:
        log.info("CPU quantized-matmul kernel, %s", tiles)
    capable_ids = {id(layer) for layer in capable}
    rest = [layer for layer in layers if id(layer) not in capable_ids]
    placed = f"; {_place_the_rest(model, rest, budget)}" if rest else ""
    if repacked:
        stored = "/".join(str(bits) for bits in sorted(repacked))
        placed = f"; {sum(repacked.values())} of them repacked exactly from {stored} bits{placed}"
    groups = group_projections(model) if grouping_wanted() else 0
    if int8 and column_blocks:
        ordered = order_int8_columns(model)
        placed += f"; {ordered} layers in the int8 kernel's column-block order" if ordered else ""
    packed = sum(layer["weight"].nbytes + layer["scales"].nbytes + layer["biases"].nbytes for layer in capable)
    scale_types = sorted({str(layer["scales"].dtype).removeprefix("mlx.core.") for layer in capable})
    widths = "/".join(str(bits) for bits in sorted({layer.bits for layer in capable}))
    return WeightForm(
        "kernel quantized",
        f"weights: {cast} (quantized layers' scales kept {'/'.join(scale_types)}); {switched} quantized "
        f"layers ({packed / 2**20:.0f} MiB) kept {widths}-bit on "
        f"the CPU quantized-matmul kernel ({mlxd_qmatmul.kernel_isa()}, {mlxd_qmatmul.describe_threads()}; "
        f"{groups} groups of sibling projections run as one product each; {timing.describe()}"
        f"{'; ' + tiles if tiles else ''}){placed}",
    )
