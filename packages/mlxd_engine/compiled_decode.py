"""Decode steps and verify forwards of the whole model as one compiled graph, over contiguous slot storage.

Why: a decode step of a small model is hundreds of tiny ops. Built op by op, each step pays Python for
every layer's graph and a dispatch per op; ``mx.compile`` traces the step once per shape and replays it,
fusing elementwise chains on the way. A loop of the embedded model's compiled steps outruns a loop of its
forwards (measured: docs/benchmark_results/code_notes.md#compiled-forward).

Contract:
- ``CompiledDecode.forward(storage, states, inputs)`` runs ``inputs`` [B, T] (T at most
  ``MAX_COMPILED_TOKENS``: a decode step is T=1, a verify forward T=k+1; B at most ``max_rows``,
  by default ``MAX_COMPILED_ROWS`` = 1, and a storage capacity of at most ``max_capacity``, by default
  ``MAX_COMPILED_CAPACITY``: where it measurably wins) for rows whose slots are
  adjacent and in order (``first``, ``first + 1``, ...) and returns logits [B, T, V], or ``None`` when it
  does not apply (longer inputs such as prompt chunks, more rows, rows not adjacent, a layer's buffer not yet
  allocated or grown to the storage's capacity, or the model failed to trace once: then it stays off).
  The caller runs its ordinary forward instead. Bookkeeping is the ordinary forward's: every row gets T
  pending appends from position ``state.written``.
- Shapes are fixed inside a trace: attention reads the rows' slots up to a span, the smallest of
  ``SPANS`` that holds the longest row's context after the new tokens (the storage capacity when none
  does), and a mask hides what the query may not see (positions past its own, or outside a sliding
  window). The span, not the capacity, sets what a forward reads: capacity only grows (another row's long
  context grows it for every slot), and a short row read the whole of it. Each (first slot, batch size,
  T, capacity, span) has its own trace, made on first use (a few ms for the embedded model); the
  ``MAX_TRACES`` most recently used are kept.
- The new tokens' keys and values are written into the layer buffers (one row: a slice update; several:
  one scatter of every row's tokens), which are passed in and returned;
  MLX updates them in place when nothing else holds the old buffers (the storage swaps in the returned
  ones at once).
- Results equal the ordinary forward's within float tolerance (attention sums over more, masked,
  positions; fused kernels); tests/engine/test_compiled_decode.py holds the two side by side.
- Off with ``MLXD_COMPILE_DECODE=0`` or ``Engine(compile_decode=False)``.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Callable

import mlx.core as mx

from .masks import shape_mask
from .storage.kv_dtype import narrowed
from .storage.kv_storage import scatter_tokens

log = logging.getLogger("mlxd.engine")

DISABLE_ENV = "MLXD_COMPILE_DECODE"
MAX_COMPILED_TOKENS = 16  # longer inputs (prompt chunks) are matmul-bound and would each add a trace
# Batches of more rows take the ordinary forward: with more rows, reading every slot's whole capacity and
# scattering rows at different positions cost more than the graph building saves (measured:
# docs/benchmark_results/code_notes.md#compiled-forward).
MAX_COMPILED_ROWS = 1
# Past this capacity the ordinary forward (which reads only the written positions, without a mask for one
# row) is as fast or faster (measured: docs/benchmark_results/code_notes.md#compiled-forward).
MAX_COMPILED_CAPACITY = 2048
MAX_TRACES = 64  # compiled signatures kept (least recently used goes first); a new one traces in a few ms
# What a forward's attention reads of the slots: the smallest span that holds its rows' contexts, so the
# cost follows the context and a handful of spans keeps the traces few
# (measured: docs/benchmark_results/code_notes.md#compiled-forward).
SPANS = (256, 512, 1024, 2048)


def compile_wanted() -> bool:
    return os.environ.get(DISABLE_ENV, "1").strip() != "0"


def read_span(context: int, capacity: int) -> int:
    """The positions of each slot a forward reads: the smallest of ``SPANS`` that holds ``context``, else
    the whole ``capacity``."""
    return next((span for span in SPANS if context <= span < capacity), capacity)


def slice_start(first: int, positions: mx.array) -> mx.array:
    """A lone row's (slot, position) for ``mx.slice_update`` over axes (0, 2)."""
    return mx.concatenate([mx.array([first], dtype=mx.int32), positions])


class _TracedView:
    """mlx-lm cache protocol inside the traced step: one layer's buffers, rows first..first+B-1."""

    def __init__(
        self,
        keys: mx.array,
        values: mx.array,
        first: int,
        positions: mx.array,
        start: mx.array | None,
        mask_axes: int | None,
        span: int,
    ):
        self.keys, self.values = keys, values
        self.mask_axes = mask_axes
        self.span = span  # positions of each slot that attention reads (the rest are past every row's context)
        self.first, self.rows = first, positions.shape[0]
        self.offset = positions  # RoPE position of each row's new token
        self.start = start  # one row: (slot, position) of its slice update, one op shared by every layer; else None

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        # keys: [B, kv_heads, T, k_dim]; the buffers: [slots, kv_heads, capacity, k_dim]
        keys, values = narrowed(keys, self.keys.dtype), narrowed(values, self.values.dtype)
        if self.start is not None:
            # one row: a slice update at (slot, position) writes all its new tokens (faster than a scatter)
            self.keys = mx.slice_update(self.keys, keys, self.start, axes=(0, 2))
            self.values = mx.slice_update(self.values, values, self.start, axes=(0, 2))
        else:
            slots = mx.arange(self.first, self.first + self.rows)
            positions = self.offset[:, None] + mx.arange(keys.shape[2])[None, :]
            self.keys = scatter_tokens(self.keys, slots, positions, keys)
            self.values = scatter_tokens(self.values, slots, positions, values)
        rows = slice(self.first, self.first + self.rows)
        return self.keys[rows, :, : self.span], self.values[rows, :, : self.span]

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None) -> mx.array:
        # [B, 1, T, span]: query i of a row sees the row's positions up to its own
        key_positions = mx.arange(self.span)[None, None, :]
        query_positions = (self.offset[:, None] + mx.arange(n)[None, :])[:, :, None]
        mask = key_positions <= query_positions
        if window_size is not None:
            mask = mask & (key_positions > query_positions - window_size)
        return shape_mask(mask[:, None, :, :], self.mask_axes)

    @property
    def state(self):
        return self.keys, self.values


class CompiledDecode:
    """The model's forward over a few tokens per row (decode steps, verify forwards), compiled; see the
    module docstring."""

    def __init__(
        self,
        model,
        max_traces: int = MAX_TRACES,
        max_rows: int = MAX_COMPILED_ROWS,
        max_capacity: int = MAX_COMPILED_CAPACITY,
        mask_axes: int | None = 4,
    ):
        self.model = model
        self.mask_axes = mask_axes  # the model's batched mask form (cache_layout.py)
        self.max_rows = max_rows
        self.max_capacity = max_capacity
        self.enabled = True
        self.steps = 0  # forwards that ran compiled (tests, diagnostics)
        self.max_traces = max_traces
        # (first slot, batch, tokens, capacity, span) -> its own compiled function, least recently used first:
        # a trace holds its graph, so a long-lived daemon keeps only the ones it uses (rows grow into new
        # capacities and leave the old traces behind)
        self._traces: OrderedDict[tuple, Callable] = OrderedDict()

    def _trace_for(self, first: int, batch: int, tokens: int, capacity: int, span: int) -> Callable:
        key = (first, batch, tokens, capacity, span)
        traced = self._traces.get(key)
        if traced is not None:
            self._traces.move_to_end(key)
            return traced
        model, mask_axes = self.model, self.mask_axes

        def step(inputs: mx.array, positions: mx.array, *buffers: mx.array):
            start = slice_start(first, positions) if batch == 1 else None
            views = [
                _TracedView(buffers[2 * i], buffers[2 * i + 1], first, positions, start, mask_axes, span)
                for i in range(len(buffers) // 2)
            ]
            logits = model(inputs, cache=views)
            return (logits, *[array for view in views for array in (view.keys, view.values)])

        traced = self._traces[key] = mx.compile(step)
        while len(self._traces) > self.max_traces:
            self._traces.popitem(last=False)
        return traced

    def forward(self, storage, states: list, inputs: mx.array) -> mx.array | None:
        if not self.enabled or inputs.shape[1] > MAX_COMPILED_TOKENS or len(states) > self.max_rows:
            return None
        first = states[0].slot
        if any(s.slot != first + i for i, s in enumerate(states)):
            return None
        if storage.capacity > self.max_capacity:
            return None
        if any(k is None or k.shape[2] != storage.capacity for k in storage.keys):
            return None  # the ordinary forward allocates or grows the buffers first
        positions = mx.array([s.written for s in states], dtype=mx.int32)
        span = read_span(max(s.written for s in states) + inputs.shape[1], storage.capacity)
        buffers = [array for pair in zip(storage.keys, storage.values) for array in pair]
        try:
            traced = self._trace_for(first, len(states), inputs.shape[1], storage.capacity, span)
            logits, *updated = traced(inputs, positions, *buffers)
        except Exception as error:  # noqa: BLE001 - a model the trace cannot follow runs uncompiled
            self.enabled = False
            log.warning("compiled decode step is off for this model (%s: %s)", type(error).__name__, error)
            return None
        del buffers
        storage.keys = list(updated[0::2])
        storage.values = list(updated[1::2])
        for state in states:
            state.pending += inputs.shape[1]
        self.steps += 1
        return logits
