"""The KV storage protocol: what the engine asks of any storage backend, and the one place backends are named.

Contract:
- ``KVStorage`` is the interface both backends implement (``SlotKVStorage``: a slot per sequence;
  ``PagedKVStorage``: blocks from a pool). The engine and its callers use only these members; what a
  backend can do differently is said by an attribute (``compiles_forward``), never by comparing its name.
- ``make_kv_storage(backend, ...)`` builds a backend by its name in ``STORAGE_BACKENDS`` (the names
  ``mlxd --decode-storage-backend`` takes) and raises ValueError listing the known names for any other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import mlx.core as mx

from .kv_storage import SlotKVStorage
from .paged_kv_storage import PagedKVStorage


@runtime_checkable
class KVStorage(Protocol):
    """Per-layer K/V storage shared by every sequence of one engine (see ``kv_storage.py`` for the model)."""

    kind: str  # the backend's name, for status and metrics only
    can_unwind: bool  # whether ``unwind`` can drop speculative appends (by a counter move or a replay)
    max_forward_tokens: int | None  # most appends one forward may make per row (None: no limit)
    # The compiled one-row forward (compiled_decode.py) reads this storage's slot buffers directly.
    compiles_forward: bool
    max_capacity: int  # most tokens one sequence may hold
    # the form of batched mask arrays the model's attention broadcasts (masks.shape_mask)
    mask_axes: int | None
    kv_dtype: mx.Dtype | None

    def fits(self, tokens: int) -> bool:
        """Whether a sequence that may grow to ``tokens`` could ever be held."""

    def can_admit(self, tokens: int, shared_blocks: int = 0, extra_blocks: int = 0) -> bool:
        """Whether such a sequence can be admitted now; ``shared_blocks`` of it shared from a prefix snapshot,
        ``extra_blocks`` the caller could free first (paged storage only; ignored by the others)."""

    def allocate(self, reserve_tokens: int = 0, shared_blocks: int = 0):
        """A record for a new sequence (raises KVStorageFull when there is no room now); its reservation is
        ``shared_blocks`` smaller (what the following ``write_prefix`` puts in by reference)."""

    def release(self, state) -> None:
        """Give a sequence's room back; a record released before is ignored."""

    @property
    def free_slots(self) -> int:
        """Sequences that could still be admitted (ignoring token room)."""

    def usage(self) -> dict:
        """Occupancy for status and metrics (``backend`` is ``kind``)."""

    def arrays(self) -> list:
        """The arrays holding keys and values (to evaluate them)."""

    def read_order(self, states: list) -> list[int] | None:
        """The order a batched forward should run ``states`` in, or None for as given."""

    def reserve(self, states: list, n_tokens: int) -> None:
        """Make room for ``n_tokens`` more appends of each state (raises KVStorageFull past the bound)."""

    def commit(self, state, n: int) -> None:
        """Turn the oldest ``n`` pending appends into committed ones."""

    def unwind(self, state, n: int) -> int:
        """Drop the newest ``n`` pending appends; returns how many kept tokens the caller must forward
        again (0 for a counter move; recurrent state: ``row_storage.py``)."""

    def views(self, states: list, n_tokens: int) -> list:
        """mlx-lm cache objects, one per layer, for one forward of ``n_tokens`` per row."""

    # prefix snapshots (prefix_cache.py): copies on contiguous storage, shared blocks on paged storage
    prefix_at_boundary_only: bool  # a snapshot holds only at its end (rings, recurrent state)

    def prefix_end(self, state) -> int | None:
        """The longest prefix of ``state`` a snapshot can hold now (None: none)."""

    def read_prefix(self, state, n: int):
        """A snapshot of the first ``n`` tokens of ``state`` (its owner gives it to ``release_prefix``)."""

    def write_prefix(self, state, snapshot, n: int) -> None:
        """Put the first ``n`` tokens of ``snapshot`` into a new sequence's storage."""

    def pin_prefix(self, snapshot, n: int):
        """Keep what the first ``n`` tokens of ``snapshot`` occupy alive until ``release_prefix`` of the pin."""

    def release_prefix(self, snapshot) -> None:
        """Give back what a snapshot or pin holds (paged: block references); a second call is ignored."""

    def prefix_blocks(self, n: int) -> int:
        """Blocks a hit reusing ``n`` tokens shares by reference (0 where snapshots are copies)."""

    def evictable_blocks(self) -> int:
        """Blocks only snapshots hold: freed if every snapshot were released (0 where they are copies)."""


def _contiguous(
    n_layers: int, max_sequences: int, max_kv_size: int, block_size: int, pool_tokens: int | None
) -> KVStorage:
    return SlotKVStorage(n_layers, max_sequences, max_kv_size)


def _paged(n_layers: int, max_sequences: int, max_kv_size: int, block_size: int, pool_tokens: int | None) -> KVStorage:
    return PagedKVStorage(n_layers, pool_tokens or max_sequences * max_kv_size, max_kv_size, block_size, max_sequences)


# Backend name -> builder(n_layers, max_sequences, max_kv_size, block_size, pool_tokens).
STORAGE_BACKENDS: dict[str, Callable[..., KVStorage]] = {"contiguous": _contiguous, "paged": _paged}


def make_kv_storage(
    backend: str,
    n_layers: int,
    max_sequences: int,
    max_kv_size: int,
    block_size: int,
    pool_tokens: int | None = None,
    mask_axes: int | None = 4,
    kv_dtype: mx.Dtype | None = None,
) -> KVStorage:
    """Build the storage backend named ``backend``.

    Args:
        backend: A key of ``STORAGE_BACKENDS``.
        n_layers: The model's cache entries (its layers, fewer under KV sharing: cache_layout.py).
        max_sequences: Sequences held at once.
        max_kv_size: Most tokens one sequence may hold.
        block_size: Tokens per block (paged only).
        pool_tokens: Pool size in tokens (paged only; None: ``max_sequences`` x ``max_kv_size``).
        mask_axes: The batched mask form the model takes (``CacheLayout.mask_axes``).
        kv_dtype: The dtype float32 keys and values are kept in (``kv_dtype.py``; None: as they come).
    Returns:
        The storage.
    Raises:
        ValueError: an unknown backend name (the message lists the known ones).
    """
    build = STORAGE_BACKENDS.get(backend)
    if build is None:
        raise ValueError(f"unknown KV storage backend {backend!r}; known: {', '.join(STORAGE_BACKENDS)}")
    storage = build(n_layers, max_sequences, max_kv_size, block_size, pool_tokens)
    storage.mask_axes = mask_axes
    storage.kv_dtype = kv_dtype
    return storage
