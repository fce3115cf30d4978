"""Paged KV storage: fixed-size blocks from one shared pool, a block table per sequence.

Contract (the ``KVStorage`` protocol of ``kv_backend.py``, as ``SlotKVStorage``, so the engine runs on either):
- Every layer owns key and value pools shaped ``[n_blocks, kv_heads, block_size, head_dim]``. A
  sequence owns a list of block ids (its block table); token position p lives in block
  ``table[p // block_size]`` at offset ``p % block_size``.
- Blocks are reference counted. A sequence's table holds one reference on each of its blocks, a prefix
  snapshot (``read_prefix``, kept by the prefix cache) one on each block it covers. A block is on the free
  list exactly when its count is 0: a release or an unwind drops the holder's references and a block goes
  back only when the last one goes.
- Admission reserves: a sequence is admitted only when the pool's unreserved blocks cover its prompt plus
  its ``max_tokens`` (capped at the KV bound) less the whole blocks it shares from a prefix snapshot, so a
  running sequence never meets an empty pool and nothing has to be preempted. Blocks are still taken
  lazily, on append, and given back on release and on unwind (a block wholly past the new end returns to
  the free list at once, if nothing else holds it). Blocks only snapshots hold are occupied but can be
  freed by dropping those snapshots (``evictable_blocks``; ``can_admit(..., extra_blocks=)`` counts them,
  and the engine evicts cache entries before it refuses an admission).
- Prefix sharing (prefix_cache.py): ``read_prefix`` of a finished sequence's first ``n`` tokens copies
  nothing: it returns a ``SharedPrefix`` (block ids + ``n``) holding references on the
  ``ceil(n / block_size)`` blocks those tokens fill, the last possibly partly filled. Its owner gives them
  back with ``release_prefix``. ``write_prefix`` of ``m <= n`` of those tokens into a new sequence puts the
  snapshot's ``m // block_size`` whole blocks at the head of its table by reference (``PagedState.shared``)
  and, when ``m`` ends inside a block, copies that block into a fresh block of the sequence
  (copy-on-write: the sequence appends right after position ``m``). So a sequence writes only blocks it
  alone holds: ``reserve`` refuses a forward whose appends would land in a block with count > 1, and an
  unwind never cuts the table below its shared blocks (it cannot anyway: it drops only pending appends,
  past ``committed >= m``). ``pin_prefix`` takes a short-lived reference on a hit's blocks (not counted
  as the cache's), so the engine may evict the very entry it is admitting a hit from.
- A forward writes each new token at its (block, offset) with one scatter per layer and reads each row's
  blocks back as one contiguous ``[B, kv_heads, L, head_dim]`` view with a gather. That gather is the
  cost paged storage adds to every forward, step and verify alike; docs/benchmark_results/paged_kv.md
  measures it.
- No context limit applies to verify rounds on paged storage: the gather grows a verify and a step alike,
  so a round that accepts a couple of drafts still pays at long contexts
  (docs/benchmark_results/code_notes.md#paged-verify).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from ..errors import KVStorageFull
from .kv_dtype import held_dtype, narrowed, stored_dtype
from .kv_storage import commit_pending, drop_pending, row_mask

DEFAULT_BLOCK_SIZE = 64


@dataclass(eq=False)  # identity: a snapshot is released once, whatever its fields
class SharedPrefix:
    """A prefix snapshot of paged storage: references on the blocks holding a sequence's first ``tokens``.

    ``nbytes`` is the pool memory those blocks occupy (each block counted whole, partly filled or not).
    ``cached``: held for the prefix cache (``read_prefix``; its blocks count as the cache's, evictable),
    or a short-lived pin (``pin_prefix``) that keeps a hit's blocks alive while the engine evicts."""

    blocks: tuple[int, ...]
    tokens: int
    nbytes: int
    cached: bool = True
    released: bool = False


@dataclass(eq=False)  # identity: two sequences with equal counts are still two records (see release)
class PagedState:
    """Bookkeeping for one sequence in the pool."""

    committed: int = 0
    pending: int = 0
    reserved_blocks: int = 0  # blocks promised at admission: the most it will take from the free list
    blocks: list[int] = field(default_factory=list)  # the block table
    shared: int = 0  # leading table blocks put in by reference from a prefix snapshot (not taken, not promised)
    discount: int = 0  # shared blocks allocate was told of (write_prefix checks the promise against them)

    @property
    def written(self) -> int:
        return self.committed + self.pending


class PagedKVStorage:
    """Block pool shared by all sequences of one engine."""

    kind = "paged"
    can_unwind = True
    max_forward_tokens: int | None = None  # any number of appends per forward
    compiles_forward = False  # a forward gathers each row's blocks; the compiled one reads slot buffers
    mask_axes: int | None = 4  # set by make_kv_storage from the model's cache layout
    kv_dtype: mx.Dtype | None = None  # float32 keys and values kept in this dtype (kv_dtype.py), set likewise

    def __init__(
        self,
        n_layers: int,
        pool_tokens: int,
        max_capacity: int,
        block_size: int = DEFAULT_BLOCK_SIZE,
        max_sequences: int = 256,
    ):
        if block_size < 1 or pool_tokens < block_size:
            raise ValueError("the pool must hold at least one block")
        self.n_layers = n_layers
        self.block_size = block_size
        self.n_blocks = pool_tokens // block_size
        self.max_capacity = max_capacity
        self.max_sequences = max_sequences
        # a layer's buffers are None until its first write makes them (ensure_layer); they are read only
        # after it, so they are typed as made (the few readers that can come first check for None)
        self.keys: list[mx.array] = [None] * n_layers  # type: ignore[list-item]
        self.values: list[mx.array] = [None] * n_layers  # type: ignore[list-item]
        self._free = list(range(self.n_blocks - 1, -1, -1))  # exactly the blocks with reference count 0
        self._refs = np.zeros(self.n_blocks, dtype=np.int64)  # references per block: tables + snapshots
        self._snapshot_refs = np.zeros(self.n_blocks, dtype=np.int64)  # of those, the snapshots'
        self._reserved = 0  # blocks promised to admitted sequences and not yet taken
        # the admitted sequences' records, by identity: two waiting sequences with the same reservation and
        # no blocks have equal fields, and releasing one must never drop the other's record
        self.sequences: set[PagedState] = set()

    # -- admission and lifetime ------------------------------------------------------------------
    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def fits(self, tokens: int) -> bool:
        return tokens <= self.max_capacity and self.blocks_for(tokens) <= self.n_blocks

    def can_admit(self, tokens: int, shared_blocks: int = 0, extra_blocks: int = 0) -> bool:
        """Whether a sequence that may grow to ``tokens``, ``shared_blocks`` of them shared from a prefix
        snapshot, can be admitted now; ``extra_blocks``: blocks the caller could free first (evictable)."""
        return (
            len(self.sequences) < self.max_sequences
            and self.blocks_for(tokens) - shared_blocks <= len(self._free) - self._reserved + extra_blocks
        )

    def allocate(self, reserve_tokens: int = 0, shared_blocks: int = 0) -> PagedState:
        """A record promised the blocks ``reserve_tokens`` need, less ``shared_blocks`` that the following
        ``write_prefix`` puts in by reference."""
        blocks = max(self.blocks_for(max(reserve_tokens, 1)) - shared_blocks, 0)
        if not self.can_admit(max(reserve_tokens, 1), shared_blocks):
            raise KVStorageFull(
                f"the KV pool has {len(self._free) - self._reserved} unreserved blocks; {blocks} are needed"
            )
        state = PagedState(reserved_blocks=blocks, discount=shared_blocks)
        self._reserved += blocks
        self.sequences.add(state)
        return state

    def release(self, state: PagedState) -> None:
        """Drop the sequence's promise and its references; a block no one else holds goes back to the pool."""
        if state not in self.sequences:
            return  # released before (a finish after a cancel, say)
        self.sequences.remove(state)
        self._reserved -= max(state.reserved_blocks - self._owned(state), 0)
        for block in reversed(state.blocks):  # the free list is a stack: the table's first block comes out first
            self._unref(block)
        state.blocks = []
        state.shared = 0

    @staticmethod
    def _owned(state: PagedState) -> int:
        """Blocks the sequence took from the free list (its table past the shared head)."""
        return len(state.blocks) - state.shared

    def _take(self) -> int:
        block = self._free.pop()
        self._refs[block] = 1
        return block

    def _unref(self, block: int) -> None:
        self._refs[block] -= 1
        if self._refs[block] == 0:
            self._free.append(block)
        elif self._refs[block] < 0:
            raise AssertionError(f"block {block} released more often than it was referenced")

    def evictable_blocks(self) -> int:
        """Blocks only cache snapshots hold: dropping every one of them would free these."""
        return int(np.count_nonzero((self._refs > 0) & (self._refs == self._snapshot_refs)))

    @property
    def free_slots(self) -> int:
        return self.max_sequences - len(self.sequences)

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    def bytes_per_block(self) -> int:
        if not self.keys or self.keys[0] is None:
            return 0
        return sum(k.nbytes + v.nbytes for k, v in zip(self.keys, self.values) if k is not None) // self.n_blocks

    def usage(self) -> dict:
        """Occupancy. ``blocks_used``: blocks with any reference (sequences' or the prefix cache's);
        ``blocks_reserved``: blocks sequences hold or were promised (0 once idle, whatever the cache holds);
        ``blocks_cached``: blocks a prefix snapshot holds; ``blocks_cache_only``: of those, the ones nothing
        else holds (freed by evicting); ``blocks_shared``: blocks with more than one reference."""
        used = self.n_blocks - len(self._free)
        cache_only = self.evictable_blocks()
        return {
            "backend": self.kind,
            "block_size": self.block_size,
            "blocks": self.n_blocks,
            "blocks_used": used,
            "blocks_reserved": self._reserved + used - cache_only,
            "sequences": len(self.sequences),
            "blocks_cached": int(np.count_nonzero(self._snapshot_refs)),
            "blocks_cache_only": cache_only,
            "blocks_shared": int(np.count_nonzero(self._refs > 1)),
            "allocated_bytes": self.bytes_per_block() * self.n_blocks,
            "dtype": held_dtype(self.keys),
        }

    def arrays(self) -> list:
        return [a for a in self.keys + self.values if a is not None]

    # -- appends ---------------------------------------------------------------------------------
    def read_order(self, states: list[PagedState]) -> list[int] | None:
        """Rows read through their block tables: any order is as cheap (see SlotKVStorage.read_order)."""
        return None

    def reserve(self, states: list[PagedState], n_tokens: int) -> None:
        """Take the blocks the next ``n_tokens`` appends of each state need.

        Refuses (ValueError) appends that would land in a block someone else holds too: sharing relies on
        no sequence ever writing a shared block (see the module docstring)."""
        for state in states:
            needed = state.written + n_tokens
            if needed > self.max_capacity:
                raise KVStorageFull(f"sequence would hold {needed} tokens; the KV bound is {self.max_capacity}")
            first = state.written // self.block_size
            if n_tokens and first < len(state.blocks) and (first < state.shared or self._refs[state.blocks[first]] > 1):
                raise ValueError(
                    f"appends at position {state.written} would write block {state.blocks[first]}, which is shared"
                )
            while len(state.blocks) < self.blocks_for(needed):
                if not self._free:
                    raise KVStorageFull("the KV pool is exhausted")
                state.blocks.append(self._take())
                if self._owned(state) <= state.reserved_blocks:
                    self._reserved -= 1  # a promised block was taken

    def commit(self, state: PagedState, n: int) -> None:
        commit_pending(state, n)

    def unwind(self, state: PagedState, n: int) -> int:
        drop_pending(state, n)
        keep = max(self.blocks_for(state.written), state.shared)  # shared blocks hold committed tokens only
        while len(state.blocks) > keep:
            self._unref(state.blocks.pop())
            if self._owned(state) < state.reserved_blocks:
                self._reserved += 1  # the promise stands: the block may be needed again
        return 0  # a counter move: nothing to forward again

    # -- prefixes (prefix_cache.py) -----------------------------------------------------------------
    prefix_at_boundary_only = False  # any prefix of a snapshot is a valid prefix

    def prefix_end(self, state: PagedState) -> int | None:
        """The longest prefix of ``state`` a snapshot can hold: its committed tokens."""
        return state.committed

    def prefix_blocks(self, n: int) -> int:
        """Blocks a hit reusing ``n`` tokens puts into the new table by reference: the whole ones."""
        return n // self.block_size

    def read_prefix(self, state: PagedState, n: int) -> SharedPrefix:
        """A snapshot of the first ``n`` positions of ``state``: references on the blocks holding them, no copy.

        Taken when the sequence is released, so nothing writes those positions again: its own last (pending)
        appends land past ``n``, and the blocks cannot be handed out while the snapshot holds them."""
        if n > state.committed:
            raise ValueError(f"a snapshot holds committed tokens only ({state.committed}); asked for {n}")
        return self._snapshot(state.blocks[: self.blocks_for(n)], n, cached=True)

    def pin_prefix(self, snapshot: SharedPrefix, n: int) -> SharedPrefix:
        """A pin on the blocks holding the first ``n`` tokens of ``snapshot``: they outlive the snapshot's own
        release until ``release_prefix(pin)``. The engine pins a hit's blocks before it evicts entries for
        room (the entry hit may be among them) and writes the prefix from the pin."""
        if snapshot.released or n > snapshot.tokens:
            raise ValueError(f"the snapshot holds {0 if snapshot.released else snapshot.tokens} tokens; asked for {n}")
        return self._snapshot(snapshot.blocks[: self.blocks_for(n)], n, cached=False)

    def _snapshot(self, blocks, n: int, cached: bool) -> SharedPrefix:
        blocks = tuple(blocks)
        for block in blocks:
            self._refs[block] += 1
            if cached:
                self._snapshot_refs[block] += 1
        return SharedPrefix(blocks, n, len(blocks) * self.bytes_per_block(), cached)

    def release_prefix(self, snapshot: SharedPrefix) -> None:
        """Drop a snapshot's (or pin's) references (the prefix cache calls this when an entry goes); a block
        whose last reference this was goes back to the pool. A second call is ignored."""
        if snapshot.released:
            return
        snapshot.released = True
        for block in reversed(snapshot.blocks):
            if snapshot.cached:
                self._snapshot_refs[block] -= 1
            self._unref(block)

    def write_prefix(self, state: PagedState, snapshot: SharedPrefix, n: int) -> None:
        """Give a new sequence the first ``n`` positions of ``snapshot``: its whole blocks by reference, the
        partly reused last block (if ``n`` ends inside one) as a copy in a block of the sequence's own."""
        if state.written or state.blocks:
            raise ValueError("a prefix goes into a sequence with nothing in storage")
        if snapshot.released or n > snapshot.tokens:
            raise ValueError(f"the snapshot holds {0 if snapshot.released else snapshot.tokens} tokens; asked for {n}")
        whole = n // self.block_size
        if whole != state.discount:  # allocate promised blocks for a different share: settle the difference
            more = state.discount - whole  # > 0: fewer shared than promised for, more new blocks needed
            if more > len(self._free) - self._reserved:
                raise KVStorageFull(
                    f"the KV pool has {len(self._free) - self._reserved} unreserved blocks; {more} more are needed"
                )
            more = max(more, -state.reserved_blocks)
            state.reserved_blocks += more
            self._reserved += more
            state.discount = whole
        for block in snapshot.blocks[:whole]:
            self._refs[block] += 1
        state.blocks = list(snapshot.blocks[:whole])
        state.shared = whole
        if n % self.block_size:  # copy-on-write: the sequence appends into this block next
            if not self._free:
                raise KVStorageFull("the KV pool is exhausted")
            source, own = snapshot.blocks[whole], self._take()
            state.blocks.append(own)
            if self._owned(state) <= state.reserved_blocks:
                self._reserved -= 1  # a promised block was taken
            for layer in range(self.n_layers):
                if self.keys[layer] is not None:
                    self.keys[layer][own] = self.keys[layer][source]
                    self.values[layer][own] = self.values[layer][source]
        state.committed = n

    def ensure_layer(self, layer: int, kv_heads: int, k_dim: int, v_dim: int, dtype) -> None:
        if self.keys[layer] is None:
            dtype = stored_dtype(self.kv_dtype, dtype)
            self.keys[layer] = mx.zeros((self.n_blocks, kv_heads, self.block_size, k_dim), dtype)
            self.values[layer] = mx.zeros((self.n_blocks, kv_heads, self.block_size, v_dim), dtype)

    def views(self, states: list[PagedState], n_tokens: int) -> list[PagedLayerView]:
        plan = PagedPlan.make(states, n_tokens, self.block_size)
        for state in states:
            state.pending += n_tokens
        return [PagedLayerView(self, layer, plan) for layer in range(self.n_layers)]


@dataclass
class PagedPlan:
    """Where one forward writes (block, offset per new token) and what it reads (block tables)."""

    starts: list[int]
    n_tokens: int
    read_length: int
    write_blocks: mx.array  # [B * T]
    write_offsets: mx.array  # [B * T]
    tables: mx.array  # [B, blocks to read], padded with each row's last block (masked anyway)
    uniform: bool

    @classmethod
    def make(cls, states: list[PagedState], n_tokens: int, block_size: int) -> PagedPlan:
        starts = [s.written for s in states]
        read_length = max(starts) + n_tokens
        write_blocks, write_offsets = [], []
        for state in states:
            for position in range(state.written, state.written + n_tokens):
                write_blocks.append(state.blocks[position // block_size])
                write_offsets.append(position % block_size)
        width = -(-read_length // block_size)
        tables = [s.blocks[:width] + [s.blocks[-1]] * (width - len(s.blocks[:width])) for s in states]
        return cls(
            starts,
            n_tokens,
            read_length,
            mx.array(write_blocks),
            mx.array(write_offsets),
            mx.array(tables),
            len(set(starts)) == 1,
        )


class PagedLayerView:
    """mlx-lm cache protocol for one layer and one forward over paged storage."""

    def __init__(self, storage: PagedKVStorage, layer: int, plan: PagedPlan):
        self.storage = storage
        self.layer = layer
        self.plan = plan
        self.offset = plan.starts[0] if plan.uniform else mx.array(plan.starts)

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        # keys: [B, kv_heads, T, k_dim]
        s, plan = self.storage, self.plan
        batch, kv_heads, n, k_dim = keys.shape
        s.ensure_layer(self.layer, kv_heads, k_dim, values.shape[3], keys.dtype)
        k_pool, v_pool = s.keys[self.layer], s.values[self.layer]
        keys, values = narrowed(keys, k_pool.dtype), narrowed(values, v_pool.dtype)
        # one scatter per layer: token t of row r goes to (write_blocks[r*T+t], :, write_offsets[r*T+t])
        k_pool[plan.write_blocks, :, plan.write_offsets] = keys.transpose(0, 2, 1, 3).reshape(
            batch * n, kv_heads, k_dim
        )
        v_pool[plan.write_blocks, :, plan.write_offsets] = values.transpose(0, 2, 1, 3).reshape(batch * n, kv_heads, -1)
        s.keys[self.layer], s.values[self.layer] = k_pool, v_pool
        return self._gather(k_pool), self._gather(v_pool)

    def _gather(self, pool: mx.array) -> mx.array:
        # pool[tables]: [B, nb, H, bs, D] -> [B, H, nb * bs, D], cut to the longest row
        gathered = pool[self.plan.tables]
        batch, blocks, heads, size, dim = gathered.shape
        contiguous = gathered.transpose(0, 2, 1, 3, 4).reshape(batch, heads, blocks * size, dim)
        return contiguous[:, :, : self.plan.read_length, :]

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None):
        plan = self.plan
        return row_mask(
            plan.starts, plan.read_length, n, return_array, window_size, plan.uniform, mask_axes=self.storage.mask_axes
        )

    @property
    def state(self):
        return self.storage.keys[self.layer], self.storage.values[self.layer]
