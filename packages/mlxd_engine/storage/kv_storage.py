"""Contiguous KV storage: one slot per sequence in a preallocated per-layer buffer.

Contract:
- Every layer owns a key buffer and a value buffer shaped ``[slots, kv_heads, capacity, head_dim]``.
  A sequence holds one slot for its lifetime. Rows of one batch may sit at different positions.
- A sequence's tokens in storage are ``committed`` (part of its history) followed by ``pending``
  appends (written by a step in flight or by a verify forward and not yet accepted). ``commit`` turns
  the oldest pending appends into committed ones; ``unwind`` drops the newest pending appends. Both are
  O(1): nothing is moved, dropped positions are simply masked out and later overwritten.
- Capacity grows for all slots in chunks of ``GROW_CHUNK`` tokens (one copy per chunk, never one per
  step) up to ``max_capacity``; a sequence may not pass ``max_capacity`` tokens.
- Slots are handed out lowest first and a batched forward runs its rows in slot order (``read_order``),
  so the rows of a batch usually occupy a run of adjacent slots and read their keys as one slice. Rows
  with a free slot between them read the runs of adjacent slots, sliced and joined; rows out of slot
  order are gathered, which copies every row's keys each step (docs/benchmark_results/code_notes.md#slot-gaps).
- ``LayerView`` objects implement mlx-lm's cache protocol (``offset``, ``update_and_fetch``,
  ``make_mask``) for one forward over a given set of rows, so every mlx-lm architecture whose attention
  follows the standard path runs on this storage unchanged.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import mlx.core as mx

import mlxd_qmatmul

from ..errors import KVStorageFull
from ..masks import shape_mask
from .kv_dtype import held_dtype, narrowed, stored_dtype

GROW_CHUNK = 256
# new keys and values of rows at different positions written by the extension's one op on the CPU
# (``scatter_tokens``); MLXD_KV_WRITE_OP=0 keeps MLX's scatter
_NATIVE_WRITES = mlxd_qmatmul.available() and os.environ.get("MLXD_KV_WRITE_OP", "1").strip() != "0"


@dataclass(eq=False)  # identity, as PagedState: a record is one sequence, whatever its counts
class SlotState:
    """Bookkeeping for one occupied slot."""

    slot: int
    committed: int = 0  # tokens whose K/V are part of the sequence
    pending: int = 0  # appends after `committed` that may still be unwound

    @property
    def written(self) -> int:
        return self.committed + self.pending


def commit_pending(state, n: int) -> None:
    """Turn the oldest ``n`` pending appends of ``state`` into committed ones (both storage kinds)."""
    if n < 0 or n > state.pending:
        raise ValueError(f"cannot commit {n} appends; {state.pending} pending")
    state.committed += n
    state.pending -= n


def drop_pending(state, n: int) -> None:
    """Drop the newest ``n`` pending appends of ``state`` (both storage kinds)."""
    if n < 0 or n > state.pending:
        raise ValueError(f"cannot unwind {n} appends; {state.pending} pending")
    state.pending -= n


def row_mask(
    starts: list[int],
    read_length: int,
    n: int,
    return_array: bool,
    window_size: int | None,
    uniform: bool,
    starts_array: Callable[[], mx.array] | None = None,
    mask_axes: int | None = 4,
):
    """mlx-lm attention mask for rows whose ``n`` new tokens start at ``starts`` (both storage kinds).

    ``uniform``: every row starts at the same position. ``starts_array`` returns ``starts`` as an array
    when the caller already holds one (it is only asked for when a mask array is built). ``mask_axes``:
    the form the model's attention broadcasts (``masks.shape_mask``)."""
    if uniform and window_size is None and not return_array:
        # every row ends at read_length: the plain causal (or no) mask is exact
        return None if n == 1 else "causal"
    # [B, 1, n, L]: key j is visible to query i of row r when j <= start_r + i
    key_positions = mx.arange(read_length)[None, None, None, :]
    starts_mx = starts_array() if starts_array is not None else mx.array(starts)
    query_positions = starts_mx[:, None, None, None] + mx.arange(n)[None, None, :, None]
    mask = key_positions <= query_positions
    if window_size is not None:
        mask = mask & (key_positions > query_positions - window_size)
    return shape_mask(mask, mask_axes)


def token_rows(rows: mx.array, positions: mx.array, heads: int, capacity: int) -> mx.array:
    """Where ``scatter_tokens`` writes: for a buffer [slots, heads, capacity, dim] seen as
    [slots x heads x capacity, dim], the row of new token (b, h, i) (in that order) is
    (rows[b] x heads + h) x capacity + positions[b, i]. int32 [B x heads x n]; one per forward serves every
    layer of the same heads and capacity."""
    head = mx.arange(heads, dtype=mx.int32)[None, :, None]
    index = (rows.astype(mx.int32)[:, None, None] * heads + head) * capacity + positions.astype(mx.int32)[:, None, :]
    return index.reshape(-1)


def scatter_tokens(buffer: mx.array, rows: mx.array, positions: mx.array, new: mx.array) -> mx.array:
    """``buffer`` [rows, heads, positions, dim] with ``new`` [B, heads, n, dim] written at row ``rows[b]``,
    position ``positions[b, i]`` (distinct within a row): one write of the whole forward's tokens
    (docs/benchmark_results/code_notes.md#one-scatter, #row-writes)."""
    _, heads, capacity, _ = buffer.shape
    return write_token_rows(buffer, new, token_rows(rows, positions, heads, capacity))


def writes_natively() -> bool:
    """Whether ``write_token_rows`` writes with the extension's one op (on the CPU), else MLX's scatter."""
    return _NATIVE_WRITES and mx.default_device() == mx.cpu


def narrows_natively(new: mx.array, buffer: mx.array) -> bool:
    """Whether ``write_token_rows`` narrows ``new`` into ``buffer`` inside the extension's op (float32 into
    float16, as ``narrowed`` does, without a cast op)."""
    return new.dtype == mx.float32 and buffer.dtype == mx.float16 and writes_natively()


def write_token_rows(buffer: mx.array, new: mx.array, index: mx.array) -> mx.array:
    """``buffer`` with ``new``'s rows of its last axis (in row-major order) written at its rows ``index``
    (``buffer`` seen as [size / dim, dim]; ``token_rows`` says where a forward's tokens go). On the CPU the
    extension's one op writes them (MLX's scatter builds a dozen index ops around each); elsewhere one
    scatter over the buffer's flattened rows."""
    if writes_natively():
        # new values take the buffer's dtype (a layer's values may differ from its keys)
        return mlxd_qmatmul.write_rows(
            buffer, new if narrows_natively(new, buffer) else narrowed(new, buffer.dtype), index
        )
    dim = buffer.shape[-1]
    flat = buffer.reshape(-1, dim)
    flat[index] = narrowed(new, buffer.dtype).reshape(-1, dim)
    return flat.reshape(buffer.shape)


class SlotKVStorage:
    """Per-layer slot buffers shared by all sequences of one engine."""

    kind = "contiguous"
    can_unwind = True
    max_forward_tokens: int | None = None  # any number of appends per forward
    compiles_forward = True  # compiled_decode.py reads and writes these slot buffers directly
    mask_axes: int | None = 4  # set by make_kv_storage from the model's cache layout
    kv_dtype: mx.Dtype | None = None  # float32 keys and values kept in this dtype (kv_dtype.py), set likewise

    def __init__(self, n_layers: int, n_slots: int, max_capacity: int):
        self.n_layers = n_layers
        self.n_slots = n_slots
        self.max_capacity = max_capacity
        self.capacity = 0
        # a layer's buffers are None until its first write makes them (ensure_layer); they are read only
        # after it, so they are typed as made (the few readers that can come first check for None)
        self.keys: list[mx.array] = [None] * n_layers  # type: ignore[list-item]
        self.values: list[mx.array] = [None] * n_layers  # type: ignore[list-item]
        self._free = list(range(n_slots))  # a heap: the lowest free slot goes first
        self.slots: dict[int, SlotState] = {}

    # -- slot lifetime -----------------------------------------------------------------------
    def fits(self, tokens: int) -> bool:
        """Whether a sequence of ``tokens`` could ever be held (it may have to wait for a slot)."""
        return tokens <= self.max_capacity

    def can_admit(self, tokens: int, shared_blocks: int = 0, extra_blocks: int = 0) -> bool:
        """Whether a sequence that may grow to ``tokens`` can be admitted now (a free slot; the block
        counts of paged storage do not apply: prefix snapshots here are copies outside the slots)."""
        return bool(self._free)

    def allocate(self, reserve_tokens: int = 0, shared_blocks: int = 0) -> SlotState:
        if not self._free:
            raise KVStorageFull(f"all {self.n_slots} KV slots are in use")
        state = SlotState(slot=heapq.heappop(self._free))
        self.slots[state.slot] = state
        return state

    def release(self, state: SlotState) -> None:
        if self.slots.pop(state.slot, None) is not None:
            heapq.heappush(self._free, state.slot)

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def usage(self) -> dict:
        """Occupancy for status and metrics."""
        per_token = 0
        if self.keys and self.keys[0] is not None:
            per_token = sum(k.nbytes + v.nbytes for k, v in zip(self.keys, self.values)) // max(
                self.capacity * self.n_slots, 1
            )
        return {
            "backend": self.kind,
            "slots": self.n_slots,
            "slots_free": len(self._free),
            "capacity_tokens": self.capacity,
            "allocated_bytes": per_token * self.capacity * self.n_slots,
            "dtype": held_dtype(self.keys),
        }

    def arrays(self) -> list:
        return [a for a in self.keys + self.values if a is not None]

    def read_order(self, states: list[SlotState]) -> list[int] | None:
        """The order in which a batched forward should run ``states`` (indices), or None for as given:
        slot order, so that adjacent slots are read as one slice instead of gathered."""
        slots = [s.slot for s in states]
        if all(a < b for a, b in zip(slots, slots[1:])):
            return None
        return sorted(range(len(slots)), key=slots.__getitem__)

    # -- appends ---------------------------------------------------------------------------------
    def reserve(self, states: list[SlotState], n_tokens: int) -> None:
        """Make room for ``n_tokens`` more appends on each state; grows capacity when needed."""
        needed = max(s.written for s in states) + n_tokens
        if needed > self.max_capacity:
            raise KVStorageFull(f"sequence would hold {needed} tokens; the KV bound is {self.max_capacity}")
        if needed > self.capacity:
            self._grow(needed)

    def commit(self, state: SlotState, n: int) -> None:
        commit_pending(state, n)

    def unwind(self, state: SlotState, n: int) -> int:
        drop_pending(state, n)
        return 0  # a counter move: nothing to forward again

    # -- prefixes (prefix_cache.py) -----------------------------------------------------------------
    prefix_at_boundary_only = False  # any prefix of a snapshot is a valid prefix

    def prefix_end(self, state: SlotState) -> int | None:
        """The longest prefix of ``state`` a snapshot can hold: its committed tokens."""
        return state.committed

    def prefix_blocks(self, n: int) -> int:
        """Nothing is shared by reference here: a hit copies its prefix into the slot."""
        return 0

    def evictable_blocks(self) -> int:
        return 0  # snapshots are copies: evicting one frees memory outside the slots, never a slot

    def pin_prefix(self, snapshot, n: int):
        return snapshot  # a copy: nothing in the slots to keep alive

    def release_prefix(self, snapshot) -> None:
        """Nothing to give back: a snapshot is a copy, freed with its entry."""

    def read_prefix(self, state: SlotState, n: int) -> list:
        """Copies of the first ``n`` positions of ``state``: per layer (keys, values) ``[kv_heads, n, dim]``."""
        return [
            (mx.contiguous(k[state.slot, :, :n]), mx.contiguous(v[state.slot, :, :n]))
            for k, v in zip(self.keys, self.values)
        ]

    def write_prefix(self, state: SlotState, layers: list, n: int) -> None:
        """Put the first ``n`` positions of ``layers`` (a ``read_prefix`` result) into a new sequence's slot."""
        if state.written:
            raise ValueError("a prefix goes into a sequence with nothing in storage")
        self.reserve([state], n)
        for layer, (k, v) in enumerate(layers):
            self.ensure_layer(layer, k.shape[0], k.shape[2], v.shape[2], k.dtype)
            self.keys[layer][state.slot, :, :n] = k[:, :n]
            self.values[layer][state.slot, :, :n] = v[:, :n]
        state.committed = n

    def _grow(self, needed: int) -> None:
        # Buffers are (re)made lazily by ensure_layer, which is the first place that knows head shapes.
        self.capacity = min(self.max_capacity, -(-needed // GROW_CHUNK) * GROW_CHUNK)

    def ensure_layer(self, layer: int, kv_heads: int, k_dim: int, v_dim: int, dtype) -> None:
        """Allocate or grow one layer's buffers to the current capacity (shapes come from the model)."""
        keys = self.keys[layer]
        if keys is not None and keys.shape[2] == self.capacity:
            return
        dtype = stored_dtype(self.kv_dtype, dtype)
        k_new = mx.zeros((self.n_slots, kv_heads, self.capacity, k_dim), dtype)
        v_new = mx.zeros((self.n_slots, kv_heads, self.capacity, v_dim), dtype)
        if keys is not None:
            old = keys.shape[2]
            k_new[:, :, :old, :] = keys
            v_new[:, :, :old, :] = self.values[layer]
        self.keys[layer], self.values[layer] = k_new, v_new

    def views(self, states: list[SlotState], n_tokens: int) -> list[LayerView]:
        """Cache objects for one forward of ``n_tokens`` per row over ``states`` (in row order).

        The caller must have called ``reserve`` first; the forward's appends become pending.
        """
        plan = RowPlan.make(states, n_tokens)
        for state in states:
            state.pending += n_tokens
        return [LayerView(self, layer, plan) for layer in range(self.n_layers)]


@dataclass
class RowPlan:
    """Where one forward writes and reads: shared by the views of every layer."""

    slots: list[int]
    starts: list[int]  # first written position per row
    n_tokens: int
    read_length: int  # keys visible to the last query of the longest row
    contiguous: bool  # rows are slots a, a+1, ... (read is a slice, no gather)
    uniform: bool  # every row starts at the same position
    _arrays: dict = field(default_factory=dict)
    _derived: dict = field(default_factory=dict)  # what the views of every layer share (``slot_runs``)

    @classmethod
    def make(cls, states: list[SlotState], n_tokens: int) -> RowPlan:
        if len(states) == 1:  # the B=1 decode step: nothing to compare
            state = states[0]
            return cls([state.slot], [state.written], n_tokens, state.written + n_tokens, True, True)
        slots = [s.slot for s in states]
        starts = [s.written for s in states]
        contiguous = slots == list(range(slots[0], slots[0] + len(slots)))
        return cls(slots, starts, n_tokens, max(starts) + n_tokens, contiguous, len(set(starts)) == 1)

    def slot_runs(self) -> list[tuple[int, int]] | None:
        """The rows' slots as runs of adjacent slots, [start, end) each, when they ascend (the engine runs a
        batch in slot order: ``read_order``); None otherwise. Worked out once for every layer's view."""
        if "slot_runs" in self._derived:
            return self._derived["slot_runs"]
        slots, runs = self.slots, None
        if all(a < b for a, b in zip(slots, slots[1:])):
            runs, start = [], slots[0]
            for previous, slot in zip(slots, slots[1:]):
                if slot != previous + 1:
                    runs.append((start, previous + 1))
                    start = slot
            runs.append((start, slots[-1] + 1))
        self._derived["slot_runs"] = runs
        return runs

    def token_rows(self, heads: int, capacity: int, n: int) -> mx.array:
        """``token_rows`` of this forward's rows and new positions in a buffer of ``heads`` and
        ``capacity``: made once, shared by every layer's writes."""
        key = ("token_rows", heads, capacity, n)
        if key not in self._derived:
            # ``token_rows``' index, counted here: an array made from numbers is no op on the stream
            self._derived[key] = mx.array(
                [
                    (slot * heads + head) * capacity + start + i
                    for slot, start in zip(self.slots, self.starts)
                    for head in range(heads)
                    for i in range(n)
                ],
                dtype=mx.int32,
            )
        return self._derived[key]

    def array(self, name: str) -> mx.array:
        if name not in self._arrays:
            self._arrays[name] = mx.array(getattr(self, name))
        return self._arrays[name]


class LayerView:
    """mlx-lm cache protocol for one layer and one forward over a fixed set of rows."""

    def __init__(self, storage: SlotKVStorage, layer: int, plan: RowPlan):
        self.storage = storage
        self.layer = layer
        self.plan = plan
        # RoPE position of the first new token per row: an int when all rows agree (fast path).
        self.offset = plan.starts[0] if plan.uniform else plan.array("starts")

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        # keys: [B, kv_heads, T, k_dim]; values: [B, kv_heads, T, v_dim]
        s, layer, plan = self.storage, self.layer, self.plan
        _, kv_heads, n, k_dim = keys.shape
        s.ensure_layer(layer, kv_heads, k_dim, values.shape[3], keys.dtype)
        k_buf, v_buf = s.keys[layer], s.values[layer]
        first = plan.slots[0]
        # keys and values into a float16 cache on the CPU: the one-op row writes narrow them, no cast op
        native = narrows_natively(keys, k_buf) and narrows_natively(values, v_buf)
        if plan.contiguous and plan.uniform and not native:
            keys, values = narrowed(keys, k_buf.dtype), narrowed(values, v_buf.dtype)
            start = plan.starts[0]
            k_buf[first : first + len(plan.slots), :, start : start + n, :] = keys
            v_buf[first : first + len(plan.slots), :, start : start + n, :] = values
        else:  # rows at different positions: every row's tokens at (slot, start + i), one write each
            index = plan.token_rows(kv_heads, k_buf.shape[2], n)
            k_buf = write_token_rows(k_buf, keys, index)
            v_buf = write_token_rows(v_buf, values, index)
        s.keys[layer], s.values[layer] = k_buf, v_buf
        length = plan.read_length
        if plan.contiguous:
            rows = slice(first, first + len(plan.slots))
            return k_buf[rows, :, :length, :], v_buf[rows, :, :length, :]
        # rows in ascending slots with gaps (a finished row's slot, rows verified beside the others): the
        # runs of adjacent slots, sliced and joined, cheaper than a gather from the strided slice
        # (docs/benchmark_results/code_notes.md#slot-gaps)
        runs = plan.slot_runs()
        if runs is not None:
            return (
                mx.concatenate([k_buf[a:b, :, :length, :] for a, b in runs]),
                mx.concatenate([v_buf[a:b, :, :length, :] for a, b in runs]),
            )
        index = plan.array("slots")
        return mx.take(k_buf[:, :, :length, :], index, axis=0), mx.take(v_buf[:, :, :length, :], index, axis=0)

    def update_in_place(self, keys: mx.array, values: mx.array) -> tuple | None:
        """``update_and_fetch`` for a layer op that reads the buffers itself: the forward's keys and values
        written (one extension op each), and (key buffer, value buffer, first slot, read length) returned
        instead of slices of the buffers, or None (nothing written) where the rows are not adjacent slots or the
        writes are not the extension's. The slices' two ops a layer go (code_notes.md#eval-handoffs)."""
        s, layer, plan = self.storage, self.layer, self.plan
        if not plan.contiguous or not writes_natively():
            return None
        _, kv_heads, n, k_dim = keys.shape
        s.ensure_layer(layer, kv_heads, k_dim, values.shape[3], keys.dtype)
        k_buf, v_buf = s.keys[layer], s.values[layer]
        index = plan.token_rows(kv_heads, k_buf.shape[2], n)
        k_buf, v_buf = write_token_rows(k_buf, keys, index), write_token_rows(v_buf, values, index)
        s.keys[layer], s.values[layer] = k_buf, v_buf
        return k_buf, v_buf, plan.slots[0], plan.read_length

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None):
        plan = self.plan
        return row_mask(
            plan.starts,
            plan.read_length,
            n,
            return_array,
            window_size,
            plan.uniform,
            lambda: plan.array("starts"),
            self.storage.mask_axes,
        )  # the array the RoPE offsets use

    @property
    def state(self):  # mlx-lm reads this only to evaluate caches; the storage owns the arrays
        return self.storage.keys[self.layer], self.storage.values[self.layer]
