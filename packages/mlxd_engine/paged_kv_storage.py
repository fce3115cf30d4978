"""Paged KV storage: fixed-size blocks from one shared pool, a block table per sequence.

Contract (the ``KVStorage`` protocol of ``kv_backend.py``, as ``SlotKVStorage``, so the engine runs on either):
- Every layer owns key and value pools shaped ``[n_blocks, kv_heads, block_size, head_dim]``. A
  sequence owns a list of block ids (its block table); token position p lives in block
  ``table[p // block_size]`` at offset ``p % block_size``.
- Admission reserves: a sequence is admitted only when the pool's unreserved blocks cover its prompt plus
  its ``max_tokens`` (capped at the KV bound), so a running sequence never meets an empty pool and
  nothing has to be preempted. Blocks are still taken lazily, on append, and given back on release and
  on unwind (a block wholly past the new end returns to the free list at once).
- A forward writes each new token at its (block, offset) with one scatter per layer and reads each row's
  blocks back as one contiguous ``[B, kv_heads, L, head_dim]`` view with a gather. That gather is the
  cost paged storage adds to every forward, step and verify alike; docs/benchmark_results/paged_kv.md
  measures it.
- No context limit applies to verify rounds on paged storage: the gather grows a verify and a step alike,
  so a round that accepts a couple of drafts still pays at 8K tokens (measured:
  docs/benchmark_results/code_notes.md#paged-verify).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx

from .kv_storage import KVStorageFull, commit_pending, drop_pending, row_mask

DEFAULT_BLOCK_SIZE = 64


@dataclass(eq=False)  # identity: two sequences with equal counts are still two records (see release)
class PagedState:
    """Bookkeeping for one sequence in the pool."""

    committed: int = 0
    pending: int = 0
    reserved_blocks: int = 0  # blocks promised at admission
    blocks: list[int] = field(default_factory=list)  # the block table

    @property
    def written(self) -> int:
        return self.committed + self.pending


class PagedKVStorage:
    """Block pool shared by all sequences of one engine."""

    kind = "paged"
    can_unwind = True
    max_forward_tokens = None  # any number of appends per forward
    compiles_forward = False  # a forward gathers each row's blocks; the compiled one reads slot buffers
    mask_axes: int | None = 4  # set by make_kv_storage from the model's cache layout

    def __init__(self, n_layers: int, pool_tokens: int, max_capacity: int, block_size: int = DEFAULT_BLOCK_SIZE,
                 max_sequences: int = 256):
        if block_size < 1 or pool_tokens < block_size:
            raise ValueError("the pool must hold at least one block")
        self.n_layers = n_layers
        self.block_size = block_size
        self.n_blocks = pool_tokens // block_size
        self.max_capacity = max_capacity
        self.max_sequences = max_sequences
        self.keys: list[mx.array | None] = [None] * n_layers
        self.values: list[mx.array | None] = [None] * n_layers
        self._free = list(range(self.n_blocks - 1, -1, -1))
        self._reserved = 0  # blocks promised to admitted sequences and not yet taken
        # the admitted sequences' records, by identity: two waiting sequences with the same reservation and
        # no blocks have equal fields, and releasing one must never drop the other's record
        self.sequences: set[PagedState] = set()

    # -- admission and lifetime ------------------------------------------------------------------
    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def fits(self, tokens: int) -> bool:
        return tokens <= self.max_capacity and self.blocks_for(tokens) <= self.n_blocks

    def can_admit(self, tokens: int) -> bool:
        return (len(self.sequences) < self.max_sequences
                and self.blocks_for(tokens) <= len(self._free) - self._reserved)

    def allocate(self, reserve_tokens: int = 0) -> PagedState:
        blocks = self.blocks_for(max(reserve_tokens, 1))
        if not self.can_admit(max(reserve_tokens, 1)):
            raise KVStorageFull(f"the KV pool has {len(self._free) - self._reserved} unreserved blocks; "
                                f"{blocks} are needed")
        state = PagedState(reserved_blocks=blocks)
        self._reserved += blocks
        self.sequences.add(state)
        return state

    def release(self, state: PagedState) -> None:
        if state not in self.sequences:
            return  # released before (a finish after a cancel, say)
        self.sequences.remove(state)
        self._reserved -= max(state.reserved_blocks - len(state.blocks), 0)
        self._free.extend(reversed(state.blocks))
        state.blocks = []

    @property
    def free_slots(self) -> int:
        return self.max_sequences - len(self.sequences)

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    def usage(self) -> dict:
        per_block = 0
        if self.keys and self.keys[0] is not None:
            per_block = sum(k.nbytes + v.nbytes for k, v in zip(self.keys, self.values)) // self.n_blocks
        used = self.n_blocks - len(self._free)
        return {"backend": self.kind, "block_size": self.block_size, "blocks": self.n_blocks, "blocks_used": used,
                "blocks_reserved": self._reserved + used, "sequences": len(self.sequences),
                "allocated_bytes": per_block * self.n_blocks}

    def arrays(self) -> list:
        return [a for a in self.keys + self.values if a is not None]

    # -- appends ---------------------------------------------------------------------------------
    def read_order(self, states: list[PagedState]) -> list[int] | None:
        """Rows read through their block tables: any order is as cheap (see SlotKVStorage.read_order)."""
        return None

    def reserve(self, states: list[PagedState], n_tokens: int) -> None:
        """Take the blocks the next ``n_tokens`` appends of each state need."""
        for state in states:
            needed = state.written + n_tokens
            if needed > self.max_capacity:
                raise KVStorageFull(f"sequence would hold {needed} tokens; the KV bound is {self.max_capacity}")
            while len(state.blocks) < self.blocks_for(needed):
                if not self._free:
                    raise KVStorageFull("the KV pool is exhausted")
                state.blocks.append(self._free.pop())
                if len(state.blocks) <= state.reserved_blocks:
                    self._reserved -= 1  # a promised block was taken

    def commit(self, state: PagedState, n: int) -> None:
        commit_pending(state, n)

    def unwind(self, state: PagedState, n: int) -> int:
        drop_pending(state, n)
        keep = self.blocks_for(state.written)
        while len(state.blocks) > keep:
            self._free.append(state.blocks.pop())
            if len(state.blocks) < state.reserved_blocks:
                self._reserved += 1  # the promise stands: the block may be needed again
        return 0  # a counter move: nothing to forward again

    # -- prefixes (prefix_cache.py) -----------------------------------------------------------------
    prefix_at_boundary_only = False  # any prefix of a snapshot is a valid prefix

    def prefix_end(self, state: PagedState) -> int | None:
        """The longest prefix of ``state`` a snapshot can hold: its committed tokens."""
        return state.committed

    def _places(self, state: PagedState, n: int) -> tuple[mx.array, mx.array]:
        positions = range(n)
        return (mx.array([state.blocks[p // self.block_size] for p in positions]),
                mx.array([p % self.block_size for p in positions]))

    def read_prefix(self, state: PagedState, n: int) -> list:
        """Copies of the first ``n`` positions of ``state``: per layer (keys, values) ``[kv_heads, n, dim]``."""
        blocks, offsets = self._places(state, n)
        return [(k[blocks, :, offsets].transpose(1, 0, 2), v[blocks, :, offsets].transpose(1, 0, 2))
                for k, v in zip(self.keys, self.values)]

    def write_prefix(self, state: PagedState, layers: list, n: int) -> None:
        """Put the first ``n`` positions of ``layers`` (a ``read_prefix`` result) into a new sequence's blocks."""
        if state.written:
            raise ValueError("a prefix goes into a sequence with nothing in storage")
        self.reserve([state], n)
        blocks, offsets = self._places(state, n)
        for layer, (k, v) in enumerate(layers):
            self.ensure_layer(layer, k.shape[0], k.shape[2], v.shape[2], k.dtype)
            self.keys[layer][blocks, :, offsets] = k[:, :n].transpose(1, 0, 2)
            self.values[layer][blocks, :, offsets] = v[:, :n].transpose(1, 0, 2)
        state.committed = n

    def ensure_layer(self, layer: int, kv_heads: int, k_dim: int, v_dim: int, dtype) -> None:
        if self.keys[layer] is None:
            self.keys[layer] = mx.zeros((self.n_blocks, kv_heads, self.block_size, k_dim), dtype)
            self.values[layer] = mx.zeros((self.n_blocks, kv_heads, self.block_size, v_dim), dtype)

    def views(self, states: list[PagedState], n_tokens: int) -> list["PagedLayerView"]:
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
    def make(cls, states: list[PagedState], n_tokens: int, block_size: int) -> "PagedPlan":
        starts = [s.written for s in states]
        read_length = max(starts) + n_tokens
        write_blocks, write_offsets = [], []
        for state in states:
            for position in range(state.written, state.written + n_tokens):
                write_blocks.append(state.blocks[position // block_size])
                write_offsets.append(position % block_size)
        width = -(-read_length // block_size)
        tables = [s.blocks[:width] + [s.blocks[-1]] * (width - len(s.blocks[:width])) for s in states]
        return cls(starts, n_tokens, read_length, mx.array(write_blocks), mx.array(write_offsets), mx.array(tables),
                   len(set(starts)) == 1)


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
        # one scatter per layer: token t of row r goes to (write_blocks[r*T+t], :, write_offsets[r*T+t])
        k_pool[plan.write_blocks, :, plan.write_offsets] = keys.transpose(0, 2, 1, 3).reshape(batch * n, kv_heads, k_dim)
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
        return row_mask(plan.starts, plan.read_length, n, return_array, window_size, plan.uniform,
                        mask_axes=self.storage.mask_axes)

    @property
    def state(self):
        return self.storage.keys[self.layer], self.storage.values[self.layer]
