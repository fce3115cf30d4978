"""Recurrent state (mlx-lm's ``ArraysCache``: Mamba, gated-delta and short-conv layers), one row per sequence.

Contract:
- ``RecurrentState(size, n_slots)`` holds one entry's state arrays shaped ``[n_slots, ...]`` (the shapes
  the layer writes on its first forward); ``None`` until then. A row is zeroed when a sequence takes it
  (a zero state is what mlx-lm's layers start from, and what its own batch merge fills in).
- ``RecurrentView`` is the ArraysCache protocol for one forward over fixed rows: ``view[i]`` gathers the
  rows' state i, ``view[i] = new`` scatters it back, so rows at different positions batch without a mask.
  It keeps what each state was before the forward (``before``: the first read, or a gather taken just
  before the first write): the very arrays the layer reads anyway, so keeping them costs no compute.
- ``CompositeView`` is the CacheList protocol (falcon_h1): ``view[i]`` is part i's view.
Unwinding is the row storage's (``row_storage.py``): it restores ``before`` and replays the kept tokens.
"""

from __future__ import annotations

import mlx.core as mx


class RecurrentState:
    """One recurrent entry's state arrays for every row."""

    def __init__(self, size: int, n_slots: int):
        self.arrays: list[mx.array | None] = [None] * size
        self.n_slots = n_slots

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays if a is not None)

    def zero_row(self, row: int) -> None:
        for i, array in enumerate(self.arrays):
            if array is not None:
                array[row] = mx.zeros(array.shape[1:], array.dtype)
                self.arrays[i] = array

    def restore_row(self, row: int, before: list[mx.array | None]) -> None:
        """Put one row's states back to ``before`` (per state: its row as it was; None: zero)."""
        for i, array in enumerate(self.arrays):
            if array is not None:
                saved = before[i]
                array[row] = mx.zeros(array.shape[1:], array.dtype) if saved is None else saved
                self.arrays[i] = array


class RecurrentView:
    """mlx-lm's ArraysCache protocol for one entry and one forward over a fixed set of rows."""

    lengths = None  # no padding: every row's tokens are real
    left_padding = None

    def __init__(self, state: RecurrentState, rows: list[int]):
        self.state_rows, self.rows = state, mx.array(rows)
        self.before: list[mx.array | None] = [None] * len(state.arrays)  # [B, ...] per state, pre-forward
        self._seen = [False] * len(state.arrays)

    def __getitem__(self, i: int):
        array = self.state_rows.arrays[i]
        value = None if array is None else array[self.rows]  # [B, ...]; None: every row starts from zero
        if not self._seen[i]:
            self.before[i], self._seen[i] = value, True
        return value

    def __setitem__(self, i: int, value: mx.array) -> None:
        arrays = self.state_rows.arrays
        if not self._seen[i]:
            self[i]  # noqa: B018 - keeps the pre-forward state before it is overwritten
        array = arrays[i]
        if array is None:
            array = mx.zeros((self.state_rows.n_slots, *value.shape[1:]), value.dtype)
        array[self.rows] = value
        arrays[i] = array

    def row_before(self, b: int) -> list[mx.array | None]:
        """Row b's states as they were before this forward."""
        return [None if value is None else value[b] for value in self.before]

    def make_mask(self, n: int, **_):
        return None

    def advance(self, n: int) -> None:
        pass

    def empty(self) -> bool:
        return self.state_rows.arrays[0] is None

    @property
    def cache(self):
        return [self[i] for i in range(len(self.state_rows.arrays))]

    @property
    def state(self):
        return [a for a in self.state_rows.arrays if a is not None]


class CompositeView:
    """mlx-lm's CacheList protocol: ``view[i]`` is part i's view (a recurrent or a KV view)."""

    def __init__(self, parts: list):
        self.parts = parts

    def __getitem__(self, i: int):
        return self.parts[i]
