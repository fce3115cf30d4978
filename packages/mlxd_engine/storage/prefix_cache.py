"""The prefix cache: what finished sequences leave behind, so the next request with the same start skips its prefill.

Contract:
- ``PrefixCache(budget_bytes, max_entries, boundary_only, on_remove)`` holds entries: a token tuple and
  the storage's snapshot of exactly those tokens (``storage.read_prefix``: every attention layer's K/V;
  with sliding windows or recurrent state also the row's ring and state, valid only at the entry's end).
  On contiguous storage a snapshot is a copy. On paged storage it copies nothing: it holds references on
  the finished sequence's blocks (``paged_kv_storage.SharedPrefix``), and a hit puts those blocks into the
  new sequence's table by reference (copy-on-write for a partly reused last block).
- The cache owns every snapshot given to ``store``: whenever an entry goes (evicted, superseded, cleared,
  or not kept at all) it calls ``on_remove(snapshot)`` once (the engine passes ``storage.release_prefix``,
  which on paged storage drops the entry's block references; a block is freed when its last one goes).
- ``lookup(prompt)`` returns the entry and the tokens to reuse: the longest common prefix of the prompt
  and any entry, at most ``len(prompt) - 1`` (the last prompt token is always forwarded: its logits give
  the first output token). With ``boundary_only`` (rings or recurrent state) an entry hits only when the
  whole entry is a prefix of the prompt's first ``len(prompt) - 1`` tokens. A hit moves the entry to
  most recently used. ``find`` is the same without counting or moving; ``record`` then does both.
- ``store(tokens, snapshot, nbytes)`` adds an entry, drops entries the new one extends (their tokens
  are a prefix of its, so every hit they could give it gives as well or better), then evicts the least
  recently used until both bounds hold. An entry over the whole budget is not kept.
- ``evict_lru(keep)`` drops the least recently used entry, ``keep`` only when no other is left: the
  engine's way to free paged blocks for an admission before it refuses one. Any entry may go, even one a
  running sequence was started from: that sequence holds its own references, so eviction never takes
  memory from it (and the engine pins the blocks of the hit it is admitting first).
- Bytes: an entry counts its snapshot's ``nbytes`` (paged: the blocks it references, each counted whole).
  Entries that share blocks (two branches from one cached start) each count them, so ``bytes``
  overcounts the memory held and the budget is a conservative bound; the storage's ``usage()``
  (``blocks_cached``) says what the cache really holds.
- ``stats()``: entries, bytes, budget, lookups, hits, tokens saved (for status, metrics and tests).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

DEFAULT_MAX_ENTRIES = 32


@dataclass
class PrefixEntry:
    tokens: tuple[int, ...]
    snapshot: object  # the storage's read_prefix result
    nbytes: int
    hits: int = 0


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two 1-D token arrays."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


class PrefixCache:
    """LRU entries of token prefixes and their stored state, under a byte budget (module docstring)."""

    def __init__(
        self,
        budget_bytes: int,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        boundary_only: bool = False,
        on_remove: Callable[[object], None] | None = None,
    ):
        if budget_bytes < 0 or max_entries < 1:
            raise ValueError("the prefix cache needs a budget >= 0 bytes and at least one entry")
        self.budget_bytes = budget_bytes
        self.max_entries = max_entries
        self.boundary_only = boundary_only
        self.on_remove = on_remove  # given each snapshot once, when its entry goes (module docstring)
        self._entries: OrderedDict[tuple[int, ...], PrefixEntry] = OrderedDict()  # least recently used first
        self._arrays: dict[tuple[int, ...], np.ndarray] = {}
        self.bytes = 0
        self.lookups = self.hits = self.tokens_saved = self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, prompt: list[int]) -> tuple[PrefixEntry | None, int]:
        """The best entry for ``prompt`` and how many of its tokens to reuse (0: a miss), counted."""
        entry, length = self.find(prompt)
        self.record(entry, length)
        return entry, length

    def find(self, prompt: list[int]) -> tuple[PrefixEntry | None, int]:
        """As ``lookup``, but neither counted nor moved to most recently used (``record`` does that)."""
        usable = len(prompt) - 1
        if usable < 1 or not self._entries:
            return None, 0
        wanted = np.asarray(prompt[:usable], dtype=np.int64)
        best, best_length = None, 0
        for key, entry in self._entries.items():
            length = common_prefix(self._arrays[key], wanted)
            if self.boundary_only and length < len(key):
                continue
            if length > best_length:
                best, best_length = entry, length
        return (best, best_length) if best is not None else (None, 0)

    def record(self, entry: PrefixEntry | None, length: int) -> None:
        """Count a lookup that ``find`` answered with ``entry`` (None: a miss) and, for a hit, make the entry
        the most recently used."""
        self.lookups += 1
        if entry is None:
            return
        if entry.tokens in self._entries:
            self._entries.move_to_end(entry.tokens)
        entry.hits += 1
        self.hits += 1
        self.tokens_saved += length

    def store(self, tokens: list[int], snapshot, nbytes: int) -> bool:
        """Keep ``snapshot`` for ``tokens``; returns False when it is not kept (over the whole budget; the
        snapshot is given to ``on_remove`` at once)."""
        key = tuple(tokens)
        if not key or nbytes > self.budget_bytes:
            self._release(snapshot)
            return False
        self._remove(key)
        array = np.asarray(key, dtype=np.int64)
        for other in [
            k for k in self._entries if len(k) <= len(key) and common_prefix(self._arrays[k], array) == len(k)
        ]:
            self._remove(other)  # the new entry extends it
        self._entries[key] = PrefixEntry(key, snapshot, nbytes)
        self._arrays[key] = array
        self.bytes += nbytes
        while self.bytes > self.budget_bytes or len(self._entries) > self.max_entries:
            self._remove(next(iter(self._entries)))
            self.evictions += 1
        return True

    def evict_lru(self, keep: PrefixEntry | None = None) -> bool:
        """Drop the least recently used entry, ``keep`` only when it is the last; False when the cache is empty."""
        if not self._entries:
            return False
        key = next((k for k in self._entries if keep is None or k != keep.tokens), next(iter(self._entries)))
        self._remove(key)
        self.evictions += 1
        return True

    def clear(self) -> None:
        for key in list(self._entries):
            self._remove(key)

    def _remove(self, key: tuple[int, ...]) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._arrays.pop(key)
            self.bytes -= entry.nbytes
            self._release(entry.snapshot)

    def _release(self, snapshot) -> None:
        if self.on_remove is not None:
            self.on_remove(snapshot)

    def stats(self) -> dict:
        return {
            "entries": len(self._entries),
            "bytes": self.bytes,
            "budget_bytes": self.budget_bytes,
            "lookups": self.lookups,
            "hits": self.hits,
            "tokens_saved": self.tokens_saved,
            "evictions": self.evictions,
        }
