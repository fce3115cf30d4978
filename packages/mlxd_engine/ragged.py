"""Verify forwards of rows of different widths that cost their real tokens only, on the CPU kernel.

A verify forward feeds every row up to the widest row's tokens (``Engine.verify_rows`` pads after each row's
real tokens). On the CPU, where each query token costs its share of every product, a 6-token draft beside
three plain rows made a forward of 4 x 6 = 24 query rows for 9 real ones.

Contract: inside ``real_lengths(lengths, width)`` (the engine's verify forward of several rows; ``lengths``:
each row's real tokens, ``width``: the padded width), the kernel's products of a ``[rows, width, features]``
input compute the real tokens only. The fused layers' two ops take the counts (``lengths_for``, passed to
``mlxd_qmatmul.attention_input`` / ``block_output``: the padding's products and attention are skipped). The
other kernel layers, the output head among them, take the real rows (``real_index``) and give each padding
position a copy of its row's last real result (one gather; a scatter into zeros cost about what the products
saved). Nothing reads the padding's results: each row's real tokens come first, so the causal mask hides
the padding from every real position, and the padding's appends are unwound with the rejected drafts. The
real positions' results are the padded forward's within float32 rounding (the kernel's products of another
row count). Everything else (a GPU, layers off the kernel) computes the padding as before. The verify gate
still prices the forward as its padded shape, an upper bound, and the cost model does not learn from it
(``ForwardSample.ragged``): priced by its real tokens, the gate verified more and lost at c = 8
(docs/benchmark_results/code_notes.md#ragged-verify). Off with ``MLXD_RAGGED_VERIFY=0``.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import mlx.core as mx

DISABLE_ENV = "MLXD_RAGGED_VERIFY"


@dataclass(frozen=True)
class RealLengths:
    lengths: mx.array  # int32 [rows]
    index: mx.array  # the real tokens' positions in the flattened [rows x width], in order
    spread: mx.array  # for each position of the flattened [rows x width], the real token (in index) it takes
    rows: int
    width: int


_current: ContextVar[RealLengths | None] = ContextVar("mlxd_real_lengths", default=None)


def ragged_wanted() -> bool:
    return os.environ.get(DISABLE_ENV, "1").strip() != "0"


def is_ragged(enabled: bool, lengths: list[int]) -> bool:
    """Whether a verify forward of rows with these token counts computes only their real tokens: several
    rows of different widths, on an engine that does (``Engine.ragged_verify``)."""
    return enabled and len(lengths) > 1 and min(lengths) < max(lengths)


@contextmanager
def real_lengths(lengths: list[int] | None, width: int) -> Iterator[None]:
    """The forward built inside is one of ``len(lengths)`` rows padded to ``width``, row i's first
    ``lengths[i]`` tokens real (None: an ordinary forward)."""
    if lengths is None:
        yield
        return
    index = [row * width + t for row, n in enumerate(lengths) for t in range(n)]
    starts = itertools.accumulate(lengths, initial=0)  # each row's first real token in index
    spread = [start + min(t, n - 1) for start, n in zip(starts, lengths) for t in range(width)]
    token = _current.set(
        RealLengths(
            mx.array(lengths, dtype=mx.int32),
            mx.array(index, dtype=mx.int32),
            mx.array(spread, dtype=mx.int32),
            len(lengths),
            width,
        )
    )
    try:
        yield
    finally:
        _current.reset(token)


def _active(x: mx.array) -> RealLengths | None:
    real = _current.get()
    if real is None or x.ndim != 3 or x.shape[0] != real.rows or x.shape[1] != real.width:
        return None
    return real


def lengths_for(x: mx.array) -> mx.array | None:
    """The rows' real token counts where ``x`` is this forward's ``[rows, width, ...]`` input, else None."""
    real = _active(x)
    return None if real is None else real.lengths


def real_index(x: mx.array) -> tuple[mx.array, mx.array] | None:
    """Where ``x`` is this forward's ``[rows, width, ...]`` input: the flat positions of its real tokens, and
    for every flat position the real token whose result it takes (``spread``); else None."""
    real = _active(x)
    return None if real is None else (real.index, real.spread)
