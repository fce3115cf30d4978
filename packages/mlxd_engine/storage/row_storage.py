"""Storage for models whose cache list is not all full attention: per-row state beside a KV backend.

Contract (the ``KVStorage`` protocol of ``kv_backend.py``, so the engine runs on it unchanged):
- ``RowStorage(inner, entries, n_slots, slack)`` wraps a KV backend (contiguous or paged) that holds the
  model's full-attention entries. Every sequence also takes a row (lowest free first) in
  - a ``WindowRing`` per sliding-window entry (``sliding_window.py``: bounded by window + ``slack``), and
  - a ``RecurrentState`` per recurrent entry (``recurrent_state.py``: zeroed when the row is taken).
  A ``CacheList`` entry (``composite``: falcon_h1) gets a ``CompositeView`` of its leaves' views.
- ``max_forward_tokens`` (= ``slack``, only with sliding entries) is the most tokens one forward may write
  for a row; ``reserve`` refuses more (the engine splits prompt chunks and caps drafts to it).
- Commit is the inner backend's counter move (rings move with it).
- Unwind: the KV parts and rings drop the newest appends by a counter move. Recurrent state has moved
  through every appended token and cannot move back; so every forward keeps, per row, the state it read
  (``RecurrentView.before``: a point at the row's position then), a commit drops the points before the
  newest one at or before the committed count, and ``unwind`` puts the newest such point back, moves the
  counts back to it and returns how many kept tokens the caller must forward again to reach the new end
  (``Engine.unwind_appends`` does; at most one forward's worth). An unwind must drop every pending
  append (the verify round commits what it keeps first). A full accept costs nothing extra.
- No compiled forward (``compiles_forward`` False): the compiled graph reads slot KV buffers only.
- Prefix snapshots (``read_prefix``) hold only at the row's end (``prefix_at_boundary_only``). The
  attention layers' part is the inner backend's own snapshot, so on paged storage it shares blocks by
  reference like any paged snapshot (``release_prefix`` gives them back); the ring cells and recurrent
  state are copied out and copied into the new row on a hit.
"""

from __future__ import annotations

import heapq
import itertools

import mlx.core as mx

from ..cache_layout import COMPOSITE, RECURRENT, SLIDING_WINDOW
from ..errors import KVStorageFull
from .recurrent_state import CompositeView, RecurrentState, RecurrentView
from .sliding_window import RingView, WindowRing

DEFAULT_SLACK = 64  # cells past the window: the longest forward a row may write (prompt pieces, verify)


class _StatePoint:
    """A row's recurrent state at ``position``: what one forward's views read before it (``before``)."""

    def __init__(self, position: int, views: list[RecurrentView], batch_index: int):
        self.position, self.views, self.batch_index = position, views, batch_index

    def rows(self) -> list[list]:
        """Per recurrent view: the row's state arrays at ``position`` (None: zero)."""
        return [view.row_before(self.batch_index) for view in self.views]


class RowStorage:
    """A KV backend for full-attention entries plus rows for sliding-window and recurrent entries."""

    can_unwind = True  # counter moves, and for recurrent state a restore and replay
    compiles_forward = False

    def __init__(self, inner, entries: list, n_slots: int, slack: int = DEFAULT_SLACK):
        # entries: the layout's CacheEntry list; the inner backend holds one layer per attention leaf, in order
        self.inner = inner
        self.kind = inner.kind
        self.max_capacity = inner.max_capacity
        self.entries = entries
        self.n_slots = n_slots
        leaves = [leaf for entry in entries for leaf in entry.leaves()]
        self.rings = {
            i: WindowRing(leaf.window, slack, n_slots) for i, leaf in enumerate(leaves) if leaf.kind == SLIDING_WINDOW
        }
        self.kv_dtype = inner.kv_dtype
        for ring in self.rings.values():
            ring.kv_dtype = inner.kv_dtype
        self.recurrent = {
            i: RecurrentState(leaf.size, n_slots) for i, leaf in enumerate(leaves) if leaf.kind == RECURRENT
        }
        self.max_forward_tokens = slack if self.rings else None
        self._free = list(range(n_slots))
        self._row_of: dict = {}  # sequence record (by identity) -> its row
        self._points: dict = {}  # sequence record -> its _StatePoints at or after its committed count

    @property
    def mask_axes(self):
        return self.inner.mask_axes

    @mask_axes.setter
    def mask_axes(self, value):
        self.inner.mask_axes = value

    # -- lifetime --------------------------------------------------------------------------------
    def fits(self, tokens: int) -> bool:
        return self.inner.fits(tokens)

    def can_admit(self, tokens: int, shared_blocks: int = 0, extra_blocks: int = 0) -> bool:
        return bool(self._free) and self.inner.can_admit(tokens, shared_blocks, extra_blocks)

    def allocate(self, reserve_tokens: int = 0, shared_blocks: int = 0):
        if not self._free:
            raise KVStorageFull(f"all {self.n_slots} state rows are in use")
        state = self.inner.allocate(reserve_tokens, shared_blocks)
        row = heapq.heappop(self._free)
        self._row_of[state] = row
        for recurrent in self.recurrent.values():
            recurrent.zero_row(row)
        return state

    def release(self, state) -> None:
        self.inner.release(state)
        self._points.pop(state, None)
        row = self._row_of.pop(state, None)
        if row is not None:
            heapq.heappush(self._free, row)

    @property
    def free_slots(self) -> int:
        return min(self.inner.free_slots, len(self._free))

    def usage(self) -> dict:
        usage = dict(self.inner.usage())
        window_bytes = sum(ring.nbytes for ring in self.rings.values())
        usage["allocated_bytes"] = usage.get("allocated_bytes", 0) + window_bytes
        usage["sliding_window_bytes"] = window_bytes
        usage["recurrent_state_bytes"] = sum(r.nbytes for r in self.recurrent.values())
        return usage

    def arrays(self) -> list:
        held = [a for ring in self.rings.values() for a in (ring.keys, ring.values) if a is not None]
        held += [a for r in self.recurrent.values() for a in r.arrays if a is not None]
        return self.inner.arrays() + held

    def read_order(self, states: list) -> list[int] | None:
        return self.inner.read_order(states)

    # -- appends ---------------------------------------------------------------------------------
    def reserve(self, states: list, n_tokens: int) -> None:
        if self.max_forward_tokens is not None and n_tokens + max(s.pending for s in states) > self.max_forward_tokens:
            raise ValueError(
                f"a forward may append at most {self.max_forward_tokens} tokens per row here "
                f"(sliding-window ring slack); asked for {n_tokens} after "
                f"{max(s.pending for s in states)} pending"
            )
        self.inner.reserve(states, n_tokens)

    def commit(self, state, n: int) -> None:
        self.inner.commit(state, n)
        points = self._points.get(state)
        if points:  # keep the newest point at or before the committed count, and every later one
            keep = max((i for i, p in enumerate(points) if p.position <= state.committed), default=0)
            del points[:keep]

    def unwind(self, state, n: int) -> int:
        """Drop the newest ``n`` appends; returns how many kept tokens must be forwarded again."""
        if n == 0:
            return 0
        if not self.recurrent:
            self.inner.unwind(state, n)
            return 0
        if n != state.pending:
            raise ValueError(
                f"recurrent state unwinds every pending append at once ({state.pending} pending, "
                f"asked to drop {n}); commit what is kept first"
            )
        point = self._point_at_or_before(state, state.committed)
        self._points.pop(state, None)
        row = self._row_of[state]
        for recurrent_view, before in zip(point.views, point.rows()):
            recurrent_view.state_rows.restore_row(row, before)
        self.inner.unwind(state, n)
        replay = state.committed - point.position
        state.committed = point.position  # the kept tokens are forwarded again from here
        return replay

    def _point_at_or_before(self, state, position: int) -> _StatePoint:
        points = [p for p in self._points.get(state, []) if p.position <= position]
        if not points:
            raise ValueError("no recurrent state point to unwind to (a forward outside this storage?)")
        return points[-1]

    # -- prefixes (prefix_cache.py): a snapshot holds only at its end ---------------------------------
    prefix_at_boundary_only = True  # rings and recurrent state are known only at the row's end

    def prefix_end(self, state) -> int | None:
        """The longest prefix of ``state`` a snapshot can hold: its committed tokens when the recurrent
        state is known there (nothing pending, or a forward started there), else None."""
        if not self.recurrent or state.pending == 0:
            return state.committed
        points = [p for p in self._points.get(state, []) if p.position == state.committed]
        return state.committed if points else None

    def prefix_blocks(self, n: int) -> int:
        return self.inner.prefix_blocks(n)

    def evictable_blocks(self) -> int:
        return self.inner.evictable_blocks()

    def pin_prefix(self, snapshot: dict, n: int) -> dict:
        """The inner backend's pin of the attention part; the ring and state copies as they are."""
        return {**snapshot, "kv": self.inner.pin_prefix(snapshot["kv"], n)}

    def release_prefix(self, snapshot: dict) -> None:
        """Give back the inner backend's part (paged: block references); rings and state are copies."""
        self.inner.release_prefix(snapshot["kv"])

    def read_prefix(self, state, n: int) -> dict:
        """The inner backend's snapshot of the attention layers (paged: shared blocks, contiguous: copies)
        and copies of the row's ring cells and recurrent state, valid at ``n``, the row's end."""
        if n != self.prefix_end(state):
            raise ValueError(f"a snapshot of this storage holds only at the row's end ({self.prefix_end(state)})")
        row = self._row_of[state]
        snapshot = {"kv": self.inner.read_prefix(state, n), "rings": {}, "recurrent": {}}
        for i, ring in self.rings.items():
            if ring.keys is not None:
                snapshot["rings"][i] = (
                    mx.contiguous(ring.keys[row]),
                    mx.contiguous(ring.values[row]),  # type: ignore[index]  # made with the keys
                )
        if not self.recurrent:
            pass  # rings only: their cells hold at the end (the slack covers what is pending)
        elif state.pending == 0:
            for i, recurrent in self.recurrent.items():
                snapshot["recurrent"][i] = [None if a is None else mx.contiguous(a[row]) for a in recurrent.arrays]
        else:
            point = [p for p in self._points[state] if p.position == n][-1]
            by_state = {id(view.state_rows): before for view, before in zip(point.views, point.rows())}
            for i, recurrent in self.recurrent.items():
                snapshot["recurrent"][i] = by_state.get(id(recurrent), [None] * len(recurrent.arrays))
        return snapshot

    def write_prefix(self, state, snapshot: dict, n: int) -> None:
        self.inner.write_prefix(state, snapshot["kv"], n)
        row = self._row_of[state]
        for i, (k, v) in snapshot["rings"].items():
            ring = self.rings[i]
            ring.ensure(k.shape[1], k.shape[0], k.shape[2], v.shape[2], k.dtype)
            ring.keys[row, :, : k.shape[1]] = k  # type: ignore[index]  # ensure() made the buffers
            ring.values[row, :, : k.shape[1]] = v  # type: ignore[index]
        for i, arrays in snapshot["recurrent"].items():
            recurrent = self.recurrent[i]
            for j, value in enumerate(arrays):
                if value is not None:
                    array = recurrent.arrays[j]
                    if array is None:
                        array = recurrent.arrays[j] = mx.zeros((self.n_slots, *value.shape), value.dtype)
                    array[row] = value

    def views(self, states: list, n_tokens: int) -> list:
        starts = [s.written for s in states]
        kv_views = iter(self.inner.views(states, n_tokens))  # the inner backend counts the appends
        rows = [self._row_of[s] for s in states]
        leaf_index = itertools.count()  # leaves in layout order, as rings and recurrent number them
        recurrent_views: list[RecurrentView] = []

        def view(entry):
            if entry.kind == COMPOSITE:
                return CompositeView([view(part) for part in entry.parts])
            i = next(leaf_index)
            if entry.kind == RECURRENT:
                recurrent_views.append(RecurrentView(self.recurrent[i], rows))
                return recurrent_views[-1]
            if entry.kind == SLIDING_WINDOW:
                return RingView(self.rings[i], rows, starts, n_tokens, self.mask_axes)
            return next(kv_views)

        views = [view(entry) for entry in self.entries]
        if recurrent_views:
            for b, state in enumerate(states):
                self._points.setdefault(state, []).append(_StatePoint(starts[b], recurrent_views, b))
        return views
