"""Fused RMSNorm and RoPE layers for the CPU backend.

Why: on the CPU, MLX has no single kernel for ``mx.fast.rms_norm`` or ``mx.fast.rope``; each call is
expanded into small elementwise ops (square, sum, rsqrt, broadcasts, sin, cos, ...) and every op is a
separate dispatch. For a small model those dispatches, not the matmuls, set the decode step time.
``mx.compile`` fuses the elementwise parts of each call into one generated kernel (mlx.nn already does
this for its activations). The results are bit-identical (tests/engine/test_cpu_fusion.py); the speed
is in docs/benchmark_results/code_notes.md#cpu-fusion.

Contract:
- ``fuse_cpu_layers(model)`` changes, in place, every module whose class is exactly ``nn.RMSNorm`` or
  ``nn.RoPE`` into a subclass whose ``__call__`` runs the compiled function; parameters, state and
  ``parameters()`` stay as they were. Subclasses of those (models with their own norm or rope) are left
  alone. Idempotent; returns how many modules of the model are fused afterwards.
- Applied by ``Engine`` when the default device is the CPU, unless ``MLXD_FUSE_CPU_LAYERS=0``. On Metal
  and CUDA the two calls already are single kernels, so nothing changes there.
- RoPE is fused for inputs of at most ``MAX_FUSED_ROPE_TOKENS`` positions (decode steps and verify
  forwards). ``mx.compile`` specialises on input shapes; longer inputs (prompt chunks of any length) would
  each add a compiled entry, and there the matmuls dominate anyway, so they take the stock path. The
  offset is always passed as an array, so a new position never means a new compile.
- Where mlxd's CPU extension is built, RoPE and RMSNorm on float32 inputs are its single ops instead
  (``mlxd_qmatmul.rope`` for any length, ``mlxd_qmatmul.rms_norm``): bit-identical to ``mx.fast.rope`` /
  ``mx.fast.rms_norm`` (tests/qmatmul/test_one_op_layers.py).
- Attention likewise: the model files of ``model`` call ``cpu_attention`` (the extension's one op for float32
  queries of any length, its (batch, head) pairs over the kernel's threads, within float32 rounding of MLX's;
  MLX's path for other dtypes, sinks and quantized caches), and ``cpu_swiglu`` for mlx-lm's ``swiglu`` (the
  extension's one op on float32, bit-identical to MLX's). Both take exp eight floats at a time where MLX's
  x86-64 CPU backend spends about 13 ns on each (docs/benchmark_results/code_notes.md#vector-exp).
- Without a C++ compiler MLX runs compiled functions unfused; results are the same.
"""

from __future__ import annotations

import os
import sys
from functools import partial

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import activations as mlx_lm_activations
from mlx_lm.models import base as mlx_lm_base

import mlxd_qmatmul

DISABLE_ENV = "MLXD_FUSE_CPU_LAYERS"
MAX_FUSED_ROPE_TOKENS = 16
_ONE_OP_KERNELS = mlxd_qmatmul.available()  # the extension's RoPE and RMSNorm: one op each, else compiled
_STOCK_ATTENTION = mlx_lm_base.scaled_dot_product_attention
_STOCK_SWIGLU = mlx_lm_activations.swiglu


@partial(mx.compile, shapeless=True)
def _rms_norm(x: mx.array, weight: mx.array, eps: float) -> mx.array:
    return mx.fast.rms_norm(x, weight, eps)


@mx.compile
def _rope(x: mx.array, offset: mx.array, dims: int, traditional: bool, base: float, scale: float) -> mx.array:
    return mx.fast.rope(x, dims, traditional=traditional, base=base, scale=scale, offset=offset)


class FusedRMSNorm(nn.RMSNorm):
    def __call__(self, x: mx.array) -> mx.array:
        weight = self["weight"]
        if _ONE_OP_KERNELS and x.dtype == mx.float32 and weight.dtype == mx.float32:
            return mlxd_qmatmul.rms_norm(x, weight, self.eps)
        return _rms_norm(x, weight, self.eps)


class FusedRoPE(nn.RoPE):
    def __call__(self, x: mx.array, offset=0) -> mx.array:
        if _ONE_OP_KERNELS and x.dtype == mx.float32 and x.ndim >= 3:
            if not isinstance(offset, mx.array):
                offset = mx.array(offset, dtype=mx.int32)
            return mlxd_qmatmul.rope(x, offset, self.dims, self.traditional, self.base, self.scale)
        if x.shape[-2] > MAX_FUSED_ROPE_TOKENS:
            return super().__call__(x, offset)
        if not isinstance(offset, mx.array):
            offset = mx.array(offset, dtype=mx.int32)
        return _rope(x, offset, self.dims, self.traditional, self.base, self.scale)


_FUSED: dict[type, type] = {nn.RMSNorm: FusedRMSNorm, nn.RoPE: FusedRoPE}


def cpu_attention(queries, keys, values, cache, scale, mask, sinks=None):
    """mlx-lm's ``scaled_dot_product_attention``, as the extension's one op where it applies: the CPU,
    float32 queries over float32 or float16 keys and values, no sinks, an unquantized cache, no mask /
    "causal" / a mask array."""
    if _one_op_attention_applies(queries, keys, values, cache, mask, sinks):
        causal = isinstance(mask, str)
        return mlxd_qmatmul.attention(queries, keys, values, scale, causal, None if causal else mask)
    return _STOCK_ATTENTION(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)


def _one_op_attention_applies(queries, keys, values, cache, mask, sinks) -> bool:
    if sinks is not None or hasattr(cache, "bits") or mx.default_device() != mx.cpu:
        return False
    if not (queries.ndim == keys.ndim == values.ndim == 4):
        return False
    if queries.dtype != mx.float32 or keys.dtype != values.dtype or keys.dtype not in (mx.float32, mx.float16):
        return False  # float16 keys and values: a cache kept in half precision (storage/kv_dtype.py)
    return _one_op_mask_applies(mask, queries.shape[2], keys.shape[2])


def _one_op_mask_applies(mask, queries: int, keys: int) -> bool:
    """Whether the one-op attention takes ``mask`` for ``queries`` query tokens over ``keys`` keys: none,
    "causal" (at least as many keys as queries), or a boolean or float32 array of at most 4 axes."""
    if isinstance(mask, str):
        return mask == "causal" and keys >= queries
    return mask is None or (isinstance(mask, mx.array) and mask.dtype in (mx.bool_, mx.float32) and mask.ndim <= 4)


def cpu_swiglu(gate, x):
    """mlx-lm's ``swiglu``, as the extension's one op where it applies: the CPU, float32, one shape."""
    if gate.dtype == x.dtype == mx.float32 and gate.shape == x.shape and mx.default_device() == mx.cpu:
        return mlxd_qmatmul.swiglu(gate, x)
    return _STOCK_SWIGLU(gate, x)


_ONE_OP_FUNCTIONS = (
    ("scaled_dot_product_attention", _STOCK_ATTENTION, cpu_attention),
    ("swiglu", _STOCK_SWIGLU, cpu_swiglu),
)


def _use_one_op_functions(module: nn.Module) -> None:
    """Point the module's mlx-lm model file at ``cpu_attention`` and ``cpu_swiglu`` (module-level names
    those files import from ``mlx_lm.models.base`` and ``.activations``; every model of that file in this
    process then takes them, and they keep MLX's path wherever they do not apply)."""
    namespace = sys.modules.get(type(module).__module__)
    if namespace is None:
        return
    for name, stock, one_op in _ONE_OP_FUNCTIONS:
        if getattr(namespace, name, None) is stock:
            setattr(namespace, name, one_op)


def fusion_wanted() -> bool:
    """Whether an engine should fuse: the default device is the CPU and the environment allows it."""
    return os.environ.get(DISABLE_ENV, "1").strip() != "0" and mx.default_device() == mx.cpu


def fuse_cpu_layers(model: nn.Module) -> int:
    """Swap exact ``nn.RMSNorm`` / ``nn.RoPE`` modules of ``model`` for their fused forms.

    Returns how many modules are fused afterwards (the ones swapped now and any swapped before); 0 for a
    model that is not an ``nn.Module`` (a stub)."""
    if not isinstance(model, nn.Module):
        return 0
    fused_classes = set(_FUSED.values())
    count = 0
    for _, module in model.named_modules():
        if _ONE_OP_KERNELS:
            _use_one_op_functions(module)
        fused = _FUSED.get(type(module))
        if fused is not None:
            module.__class__ = fused
        count += type(module) in fused_classes
    return count
