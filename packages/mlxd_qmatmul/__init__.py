"""mlxd's CPU quantized matmul: MLX's affine 4-bit and 8-bit weights read at memory speed on the CPU.

Why: MLX's own CPU quantized matmul recomputes the dequantization for every input row, and float32
copies of the weights read 4 bytes a weight where the checkpoint holds 0.5-1. This MLX extension (a C++
``Primitive`` with ``eval_cpu``, ``native/``) decodes each block of weights once per tile of rows, in
registers, with SIMD chosen at run time (AVX-512, AVX2 + FMA, SSE2 / NEON), its output columns shared
over the CPU's cores. Figures: docs/benchmark_results/qmatmul_kernel.md.

Contract:
- ``available()`` is True when the extension was built (``make setup`` runs ``scripts/build_qmatmul.sh``)
  and imports; ``unavailable_reason()`` says why not, for the log (the engine then keeps its float32 rule).
- ``quantized_matmul(x, w, scales, biases, group_size, bits)`` equals
  ``mx.quantized_matmul(x, w, scales, biases, transpose=True, group_size=..., bits=..., mode="affine")``
  within float32 rounding, for bits 4 and 8 and group sizes 32, 64, 128; CPU only; float32 math.
- ``supports(bits, group_size, mode)`` says whether a layer's format is one the kernel takes.
- ``kernel_isa()`` / ``kernel_threads()``: what it runs with here. ``MLXD_QMM_ISA`` (avx512, avx2, sse2,
  neon) forces a narrower instruction set, ``MLXD_QMM_THREADS`` the thread count.
"""

from __future__ import annotations

BITS = (4, 8)
GROUP_SIZES = (32, 64, 128)

try:
    from . import _ext  # built by scripts/build_qmatmul.sh
except ImportError as error:  # not built, or built against another mlx
    _ext = None
    _REASON = f"the CPU quantized-matmul extension is not built or does not load ({error}); run make setup"
else:
    _REASON = ""


def available() -> bool:
    return _ext is not None


def unavailable_reason() -> str:
    return _REASON


def supports(bits: int, group_size: int, mode: str = "affine") -> bool:
    return mode == "affine" and bits in BITS and group_size in GROUP_SIZES


def quantized_matmul(x, w, scales, biases, group_size: int, bits: int):
    if _ext is None:
        raise RuntimeError(_REASON)
    return _ext.quantized_matmul(x, w, scales, biases, group_size, bits)


def kernel_isa() -> str:
    return _ext.kernel_isa() if _ext is not None else "none"


def kernel_threads() -> int:
    return _ext.kernel_threads() if _ext is not None else 0
