"""The decode step of the whole model as one compiled graph, over contiguous slot storage.

Why: a decode step of a small model is hundreds of tiny ops. Built op by op, each step pays Python for
every layer's graph and a dispatch per op; ``mx.compile`` traces the step once per shape and replays it,
fusing elementwise chains on the way. Measured on the embedded model, B=1 greedy, one BLAS thread,
interleaved rounds: a loop of compiled steps ran 1.39-1.49x the tokens per second of a loop of the
model's plain forwards (with the CPU-fused norm and RoPE layers in both).

Contract:
- ``CompiledDecode.forward(storage, states, inputs)`` runs one token per row (``inputs`` [B, 1]) for rows
  whose slots are adjacent and in order (``first``, ``first + 1``, ...) and returns the last-position
  logits [B, V], or ``None`` when it does not apply (rows not adjacent, a layer's buffer not yet allocated
  or grown to the storage's capacity, or the step failed to trace once: then it stays off). The caller
  runs its ordinary forward instead. Bookkeeping is the ordinary forward's: every row gets one pending
  append at position ``state.written``.
- Shapes are fixed inside a trace: attention reads every position of the rows' slots up to the storage
  capacity and a mask hides what the row has not written (positions past ``written``, or outside a
  sliding window). Each new (first slot, batch size, capacity) traces once; capacity grows in chunks.
- The new token's key and value are scattered into the layer buffers, which are passed in and returned;
  MLX updates them in place when nothing else holds the old buffers (the storage swaps in the returned
  ones at once).
- Results equal the ordinary forward's within float tolerance (attention sums over more, masked,
  positions; fused kernels); tests/engine/test_compiled_decode.py holds the two side by side.
- Off with ``MLXD_COMPILE_DECODE=0`` or ``Engine(compile_decode=False)``.
"""

from __future__ import annotations

import logging
import os

import mlx.core as mx

log = logging.getLogger("mlxd.engine")

DISABLE_ENV = "MLXD_COMPILE_DECODE"


def compile_wanted() -> bool:
    return os.environ.get(DISABLE_ENV, "1").strip() != "0"


class _TracedView:
    """mlx-lm cache protocol inside the traced step: one layer's buffers, rows first..first+B-1."""

    def __init__(self, keys: mx.array, values: mx.array, first: int, positions: mx.array):
        self.keys, self.values = keys, values
        self.first, self.rows = first, positions.shape[0]
        self.offset = positions  # RoPE position of each row's new token

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        # keys: [B, kv_heads, 1, k_dim]; the buffers: [slots, kv_heads, capacity, k_dim]
        slots = mx.arange(self.first, self.first + self.rows)
        self.keys[slots, :, self.offset] = keys[:, :, 0]
        self.values[slots, :, self.offset] = values[:, :, 0]
        rows = slice(self.first, self.first + self.rows)
        return self.keys[rows], self.values[rows]

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None) -> mx.array:
        # [B, 1, 1, capacity]: a row sees what it has written, its new token included
        key_positions = mx.arange(self.keys.shape[2])[None, :]
        query_positions = self.offset[:, None]
        mask = key_positions <= query_positions
        if window_size is not None:
            mask = mask & (key_positions > query_positions - window_size)
        return mask[:, None, None, :]

    @property
    def state(self):
        return self.keys, self.values


class CompiledDecode:
    """The model's one-token step, compiled; see the module docstring."""

    def __init__(self, model):
        self.model = model
        self.enabled = True
        self.steps = 0  # steps that ran compiled (tests, diagnostics)

        def step(first: int, tokens: mx.array, positions: mx.array, *buffers: mx.array):
            views = [_TracedView(buffers[2 * i], buffers[2 * i + 1], first, positions)
                     for i in range(len(buffers) // 2)]
            logits = model(tokens, cache=views)[:, -1, :]
            return (logits, *[array for view in views for array in (view.keys, view.values)])

        self._step = mx.compile(step)

    def forward(self, storage, states: list, inputs: mx.array) -> mx.array | None:
        if not self.enabled or inputs.shape[1] != 1:
            return None
        first = states[0].slot
        if any(s.slot != first + i for i, s in enumerate(states)):
            return None
        if any(k is None or k.shape[2] != storage.capacity for k in storage.keys):
            return None  # the ordinary forward allocates or grows the buffers first
        positions = mx.array([s.written for s in states], dtype=mx.int32)
        buffers = [array for pair in zip(storage.keys, storage.values) for array in pair]
        try:
            logits, *updated = self._step(first, inputs, positions, *buffers)
        except Exception as error:  # noqa: BLE001 - a model the trace cannot follow runs uncompiled
            self.enabled = False
            log.warning("compiled decode step is off for this model (%s: %s)", type(error).__name__, error)
            return None
        del buffers
        storage.keys = list(updated[0::2])
        storage.values = list(updated[1::2])
        for state in states:
            state.pending += 1
        self.steps += 1
        return logits
