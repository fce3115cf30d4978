"""Sliding-window attention KV (mlx-lm's ``RotatingKVCache``) in a ring per sequence, bounded by the window.

Contract:
- ``WindowRing(window, slack, n_slots)`` holds one sliding entry's keys and values for every row:
  ``[n_slots, kv_heads, size, head_dim]`` with ``size = window + slack``. Token position p of a row lives
  in cell ``p % size``; the buffers grow with the longest row up to ``size`` and never past it, so memory
  is bounded by the window whatever the context.
- Keys carry their RoPE rotation, so attention does not care in which order cells sit: ``RingView``'s
  mask gives each cell the position it holds and lets query q see positions in ``(q - window, q]``.
- ``slack`` is the most tokens one forward may write (``max_forward_tokens``: a prompt piece, a verify of
  the current token plus its draft, or chained lookahead steps). With that bound an unwind stays a counter
  move: the speculative appends it drops overwrote only cells whose positions are out of every later
  query's window (position p - size <= q - window for any later query q, because the dropped appends
  number at most ``slack``). The storage refuses a longer forward; the engine splits prompt chunks.
"""

from __future__ import annotations

import mlx.core as mx

from ..masks import shape_mask
from .kv_dtype import narrowed, stored_dtype
from .kv_storage import GROW_CHUNK, scatter_tokens


class WindowRing:
    """One sliding-window entry's ring buffers for every row (see the module docstring)."""

    kv_dtype: mx.Dtype | None = None  # float32 keys and values kept in this dtype (kv_dtype.py)

    def __init__(self, window: int, slack: int, n_slots: int):
        self.window = window
        self.size = window + slack
        self.n_slots = n_slots
        self.keys: mx.array | None = None
        self.values: mx.array | None = None

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes  # type: ignore[union-attr]

    def ensure(self, length: int, kv_heads: int, k_dim: int, v_dim: int, dtype) -> None:
        """Buffers holding at least ``min(length, size)`` cells (grown in chunks; shapes from the model)."""
        held = 0 if self.keys is None else self.keys.shape[2]
        if held >= min(length, self.size):
            return
        cells = min(self.size, -(-length // GROW_CHUNK) * GROW_CHUNK)
        dtype = stored_dtype(self.kv_dtype, dtype)
        keys = mx.zeros((self.n_slots, kv_heads, cells, k_dim), dtype)
        values = mx.zeros((self.n_slots, kv_heads, cells, v_dim), dtype)
        if self.keys is not None:
            keys[:, :, :held] = self.keys
            values[:, :, :held] = self.values  # type: ignore[assignment]  # set with the keys
        self.keys, self.values = keys, values


class RingView:
    """mlx-lm's cache protocol for one sliding entry and one forward over fixed rows."""

    def __init__(self, ring: WindowRing, rows: list[int], starts: list[int], n_tokens: int, mask_axes: int | None):
        self.ring, self.rows, self.starts, self.n = ring, rows, starts, n_tokens
        self.mask_axes = mask_axes
        self.uniform = len(set(starts)) == 1
        self.offset = starts[0] if self.uniform else mx.array(starts)  # RoPE position of each row's first token
        self.ends = [s + n_tokens for s in starts]
        self.length = min(ring.size, max(self.ends))  # cells a query reads

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        # keys: [B, kv_heads, n, k_dim]
        ring, n = self.ring, keys.shape[2]
        ring.ensure(max(self.ends), keys.shape[1], keys.shape[3], values.shape[3], keys.dtype)
        k_buf, v_buf = ring.keys, ring.values
        assert k_buf is not None and v_buf is not None  # ensure() made them
        first_cell = self.starts[0] % ring.size
        if len(self.rows) == 1 and first_cell + n <= ring.size:
            row = self.rows[0]
            keys, values = narrowed(keys, k_buf.dtype), narrowed(values, v_buf.dtype)  # scatter_tokens narrows too
            k_buf[row : row + 1, :, first_cell : first_cell + n] = keys
            v_buf[row : row + 1, :, first_cell : first_cell + n] = values
        else:
            rows, starts = mx.array(self.rows), mx.array(self.starts)
            # token i of every row into its row's cell (a forward's appends fit the ring's slack: distinct)
            cells = (starts[:, None] + mx.arange(n)[None, :]) % ring.size
            k_buf = scatter_tokens(k_buf, rows, cells, keys)
            v_buf = scatter_tokens(v_buf, rows, cells, values)
        ring.keys, ring.values = k_buf, v_buf
        if len(self.rows) == 1:
            row = self.rows[0]
            return k_buf[row : row + 1, :, : self.length], v_buf[row : row + 1, :, : self.length]
        rows = mx.array(self.rows)
        return mx.take(k_buf[:, :, : self.length], rows, axis=0), mx.take(v_buf[:, :, : self.length], rows, axis=0)

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None):
        window = min(window_size or self.ring.window, self.ring.window)
        if self.uniform and max(self.ends) <= min(window, self.ring.size) and not return_array:
            # nothing wrapped and nothing out of the window yet: the plain causal (or no) mask is exact
            return None if n == 1 else "causal"
        # [B, 1, n, L]: cell c of row r holds the newest position p < end_r with p % size == c
        size = self.ring.size
        cells = mx.arange(self.length)[None, None, None, :]
        ends = mx.array(self.ends)[:, None, None, None]
        positions = cells + size * mx.floor_divide(ends - 1 - cells, size)
        queries = mx.array(self.starts)[:, None, None, None] + mx.arange(n)[None, None, :, None]
        mask = (positions >= 0) & (positions <= queries) & (positions > queries - window)
        return shape_mask(mask, self.mask_axes)

    @property
    def state(self):
        return self.ring.keys, self.ring.values
