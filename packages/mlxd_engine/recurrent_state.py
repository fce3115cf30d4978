"""Recurrent state (mlx-lm's ``ArraysCache``: Mamba, gated-delta and short-conv layers) beside a KV backend.

Contract (the ``KVStorage`` protocol of ``kv_backend.py``, so the engine runs on it unchanged):
- ``RecurrentStateStorage(inner, entries, n_slots)`` wraps a KV backend that holds the model's attention
  entries; every recurrent entry owns its state arrays shaped ``[slots, ...]`` (the shapes the layer
  writes on its first forward), one row per sequence, zeroed when a sequence takes the row (a zero state
  is what mlx-lm's layers start from, and what its own batch merge fills in).
- A ``CacheList`` entry (``composite``: falcon_h1's recurrent state and attention per layer) gets a
  ``CompositeView`` whose parts are the views of its leaves, so each part is stored by its own kind.
- A forward's view of a recurrent entry reads its rows' states with a gather and writes the new states
  back with a scatter (``RecurrentView``: ``view[i]``, ``view[i] = state``), so rows at different
  positions batch without a mask; attention entries get the inner backend's views.
- The state moves with every forward and cannot be moved back: ``can_unwind`` is False, ``unwind`` of
  any append raises, and the eligibility predicate keeps prompt lookup off for such models
  (``Engine.can_unwind``). Commit is the inner backend's counter move.
- No compiled forward (``compiles_forward`` False): the compiled graph reads slot KV buffers only.
"""

from __future__ import annotations

import heapq
import itertools

import mlx.core as mx

from .cache_layout import COMPOSITE, RECURRENT


class RecurrentStateStorage:
    """A KV backend for the attention entries plus one state row per sequence for the recurrent ones."""

    can_unwind = False
    compiles_forward = False

    def __init__(self, inner, entries: list, n_slots: int):
        # entries: the layout's CacheEntry list; the inner backend holds one layer per KV leaf, in order
        self.inner = inner
        self.kind = inner.kind
        self.max_capacity = inner.max_capacity
        self.entries = entries
        self.n_slots = n_slots
        leaves = [leaf for entry in entries for leaf in entry.leaves()]
        self.states: dict[int, list[mx.array | None]] = {
            i: [None] * leaf.size for i, leaf in enumerate(leaves) if leaf.kind == RECURRENT}
        self._free = list(range(n_slots))
        self._row_of: dict = {}  # sequence record (by identity) -> its state row

    @property
    def mask_axes(self):
        return self.inner.mask_axes

    @mask_axes.setter
    def mask_axes(self, value):
        self.inner.mask_axes = value

    # -- lifetime --------------------------------------------------------------------------------
    def fits(self, tokens: int) -> bool:
        return self.inner.fits(tokens)

    def can_admit(self, tokens: int) -> bool:
        return bool(self._free) and self.inner.can_admit(tokens)

    def allocate(self, reserve_tokens: int = 0):
        from .kv_storage import KVStorageFull

        if not self._free:
            raise KVStorageFull(f"all {self.n_slots} recurrent state rows are in use")
        state = self.inner.allocate(reserve_tokens)
        row = heapq.heappop(self._free)
        self._row_of[state] = row
        for arrays in self.states.values():
            for i, array in enumerate(arrays):
                if array is not None:
                    array[row] = mx.zeros(array.shape[1:], array.dtype)
                    arrays[i] = array
        return state

    def release(self, state) -> None:
        self.inner.release(state)
        row = self._row_of.pop(state, None)
        if row is not None:
            heapq.heappush(self._free, row)

    @property
    def free_slots(self) -> int:
        return min(self.inner.free_slots, len(self._free))

    def usage(self) -> dict:
        usage = dict(self.inner.usage())
        usage["recurrent_state_bytes"] = sum(a.nbytes for arrays in self.states.values() for a in arrays if a is not None)
        return usage

    def arrays(self) -> list:
        return self.inner.arrays() + [a for arrays in self.states.values() for a in arrays if a is not None]

    def read_order(self, states: list) -> list[int] | None:
        return self.inner.read_order(states)

    # -- appends ---------------------------------------------------------------------------------
    def reserve(self, states: list, n_tokens: int) -> None:
        self.inner.reserve(states, n_tokens)

    def commit(self, state, n: int) -> None:
        self.inner.commit(state, n)

    def unwind(self, state, n: int) -> None:
        if n:
            raise ValueError("recurrent state cannot unwind appends: its layers have already consumed them")
        self.inner.unwind(state, 0)

    def views(self, states: list, n_tokens: int) -> list:
        kv_views = iter(self.inner.views(states, n_tokens))  # the inner backend counts the appends
        rows = mx.array([self._row_of[s] for s in states])
        leaf_index = itertools.count()  # leaves in layout order, as self.states numbers them

        def view(entry):
            if entry.kind == COMPOSITE:
                return CompositeView([view(part) for part in entry.parts])
            i = next(leaf_index)
            return RecurrentView(self.states[i], rows, self.n_slots) if entry.kind == RECURRENT else next(kv_views)

        return [view(entry) for entry in self.entries]


class CompositeView:
    """mlx-lm's CacheList protocol: ``view[i]`` is part i's view (a recurrent or a KV view)."""

    def __init__(self, parts: list):
        self.parts = parts

    def __getitem__(self, i: int):
        return self.parts[i]


class RecurrentView:
    """mlx-lm's ArraysCache protocol for one entry and one forward over a fixed set of rows."""

    lengths = None  # no padding: every row's tokens are real
    left_padding = None

    def __init__(self, arrays: list, rows: mx.array, n_slots: int):
        self.arrays, self.rows, self.n_slots = arrays, rows, n_slots

    def __getitem__(self, i: int):
        array = self.arrays[i]
        return None if array is None else array[self.rows]  # [B, ...]; None: every row starts from zero

    def __setitem__(self, i: int, value: mx.array) -> None:
        array = self.arrays[i]
        if array is None:
            array = mx.zeros((self.n_slots, *value.shape[1:]), value.dtype)
        array[self.rows] = value
        self.arrays[i] = array

    def make_mask(self, n: int, **_):
        return None

    def advance(self, n: int) -> None:
        pass

    def empty(self) -> bool:
        return self.arrays[0] is None

    @property
    def cache(self):
        return [self[i] for i in range(len(self.arrays))]

    @property
    def state(self):
        return [a for a in self.arrays if a is not None]
