"""The dtype KV storage keeps keys and values in (``mlxd --kv-dtype``).

Keys and values come out of the model in the dtype it computes in: float32 on the CPU backend, where mlxd
runs every model in float32. Kept as float16 instead they take half the memory and half the bytes every
forward's attention reads, which at a long context or many rows is as much as the weights (llama.cpp keeps
its cache in float16 by default). The CPU attention op widens them exactly as it reads them, and every
forward (prefill, step, verify) reads the rounded values from storage, so greedy output with prompt lookup
stays token for token that of plain decode; against a float32 cache it is a rounding of keys and values.

Contract:
- ``KV_DTYPES`` maps the names ``--kv-dtype`` takes to the dtype float32 keys and values are kept in
  ("float32": as they come).
- ``held_dtype(buffers)``: the name of the dtype a storage's key buffers hold ("float16", "float32", ...; None
  before its first write), for its ``usage()`` (status and metrics).
- ``stored_dtype(kv_dtype, dtype)``: what a storage allocates for keys and values of ``dtype``: ``kv_dtype``
  where it is set and ``dtype`` is float32, else ``dtype`` (a bfloat16 or float16 model's cache is kept as
  it is; a model computing in float32 on a GPU backend is narrowed the same way).
- ``narrowed(x, dtype)``: new keys or values as a storage of ``dtype`` writes them. Into float16 a wider float
  saturates at +-65504 (``HALF_MAX``) rather than overflowing to inf: one key past half's range would make every
  later attention score over it inf or NaN, and the row's output NaN from then on. Values in range round exactly
  as a plain cast rounds them.
"""

from __future__ import annotations

import mlx.core as mx

from mlxd_protocol.serving_defaults import KV_DTYPE_NAMES

HALF_MAX = 65504.0  # the largest finite float16

KV_DTYPES: dict[str, mx.Dtype | None] = dict(zip(KV_DTYPE_NAMES, (None, mx.float16)))


def parse_kv_dtype(name: str) -> mx.Dtype | None:
    """The dtype ``--kv-dtype NAME`` stands for; ValueError naming the choices for another name."""
    if name not in KV_DTYPES:
        raise ValueError(f"unknown KV dtype {name!r}; known: {', '.join(KV_DTYPES)}")
    return KV_DTYPES[name]


def stored_dtype(kv_dtype: mx.Dtype | None, dtype: mx.Dtype) -> mx.Dtype:
    """The dtype keys and values of ``dtype`` are kept in under ``kv_dtype`` (see the module's contract)."""
    return kv_dtype if kv_dtype is not None and dtype == mx.float32 else dtype


def narrowed(x: mx.array, dtype: mx.Dtype) -> mx.array:
    """``x`` in ``dtype`` for a storage's buffers (see the module's contract): as it is when it has that dtype."""
    if x.dtype == dtype:
        return x
    if dtype == mx.float16 and mx.issubdtype(x.dtype, mx.floating):
        return mx.clip(x, -HALF_MAX, HALF_MAX).astype(dtype)
    return x.astype(dtype)


def held_dtype(buffers: list) -> str | None:
    """The dtype name of the first allocated buffer in ``buffers`` (None while none is)."""
    first = next((b for b in buffers if b is not None), None)
    return None if first is None else dtype_name(first.dtype)


def dtype_name(dtype: mx.Dtype) -> str:
    """The name of ``dtype`` without its module: "float16" for ``mx.float16`` (printed "mlx.core.float16")."""
    return str(dtype).rsplit(".", 1)[-1]
