"""A draft source shared across requests: recent requests' tokens, looked up by the current context's tail.

Contract:
    * ``SharedDraftStore`` keeps the token lists of recently finished requests (their outputs; their
      prompts too when the caller adds them) under a token budget: adding past it evicts the oldest
      documents first. Documents live back to back in one list addressed by global positions, so an
      evicted document is a rise of ``base`` and the index entries that point below it are removed.
    * The index is a hashed n-gram pool: for n in ``[min_ngram, max_ngram]`` the hash of each n-gram
      maps to the end positions of its most recent ``max_occurrences`` occurrences (ascending). A lookup
      tries the longest suffix of the context first; a hit is checked against the stored tokens, so a
      hash collision is never a match. No n-gram spans two documents.
    * ``lookup(context, max_tokens)`` returns a ``SharedDraft``: the match length, the draft and its
      support (the occurrences that continued the match with the draft's first token). The
      draft is walked token by token over the occurrences that agree so far: at each position the
      continuations are counted (how often each next token was seen), the most frequent one is taken,
      the occurrences that disagree drop out, and a running probability is multiplied by
      ``top count / all counts``. The walk stops when the probability would fall below
      ``min_probability``, at a document's end, at ``max_tokens``, or at ``draft_per_match`` tokens per
      matched context token (a 2-token match drafts at most 4: short matches are often chance). So a
      match seen once with a competing continuation (1:1, probability 0.5) drafts nothing past that
      point, and one seen 2:1 drafts on until the next split.
    * ``SharedDraftStores`` keeps one store per key (an API key's id; ``None`` is the store used when no
      keys are configured), at most ``max_stores`` of them, the least recently used dropped first, so
      nothing one key's requests produced is drafted into another key's. The token budget bounds them all
      together: past it the least recently used other stores give up their oldest documents first.

Worked example::

    >>> store = SharedDraftStore(SharedStoreConfig(min_ngram=2, max_ngram=4))
    >>> store.add([7, 8, 9, 10, 11])
    >>> store.lookup([1, 2, 7, 8], 8).tokens
    (9, 10, 11)
    >>> store.add([7, 8, 9, 12])           # a competing continuation after (7, 8, 9)
    >>> store.lookup([1, 2, 7, 8], 8).tokens    # 2 x 9, then 10 vs 12 (1:1): stop there
    (9,)
"""

from __future__ import annotations

import bisect
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SharedStoreConfig:
    """Knobs of a ``SharedDraftStore``.

    Attributes:
        max_tokens: The token budget of a store, and of all the stores of ``SharedDraftStores`` together
            (documents are evicted oldest first past it; at most about 1.1 KB of memory a token: 7
            index entries a token when no n-gram repeats).
        min_ngram: Shortest context suffix matched (2: a lone token across requests predicts little).
        max_ngram: Longest context suffix matched (tried first).
        max_occurrences: Occurrences kept per n-gram (the most recent).
        min_probability: A draft stops where its running continuation probability would fall below this.
        draft_per_match: A draft is at most this many tokens per matched context token.
        include_prompts: Whether finished requests' prompts go in too (outputs always do).
        max_stores: Most stores kept (one per key), least recently used dropped first.
    """

    max_tokens: int = 32768
    min_ngram: int = 2
    max_ngram: int = 8
    max_occurrences: int = 16
    min_probability: float = 0.6
    draft_per_match: float = 2.0
    include_prompts: bool = False
    max_stores: int = 64

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        if self.max_occurrences < 1:
            raise ValueError("max_occurrences must be >= 1")
        if not 0.0 < self.min_probability <= 1.0:
            raise ValueError("min_probability must be in (0, 1]")
        if self.draft_per_match <= 0:
            raise ValueError("draft_per_match must be > 0")
        if self.max_stores < 1:
            raise ValueError("max_stores must be >= 1")


@dataclass(frozen=True)
class SharedDraft:
    """A lookup's answer: ``match_length`` context tokens matched (0: none) and the drafted ``tokens``."""

    match_length: int = 0
    tokens: tuple[int, ...] = ()
    probability: float = 0.0  # the running continuation probability at the draft's last token
    support: int = 0  # the occurrences whose continuation is the draft's first token


NO_DRAFT = SharedDraft()


class SharedDraftStore:
    """Recent documents under a token budget, with a hashed n-gram index over them (module docstring)."""

    def __init__(self, config: SharedStoreConfig | None = None) -> None:
        self.config = config if config is not None else SharedStoreConfig()
        self._tokens: list[int] = []  # global position p is self._tokens[p - self._base]
        self._base = 0
        self._doc_starts: deque[int] = deque()  # global start of each document, oldest first
        self._doc_ends: deque[int] = deque()  # ... its end (exclusive)
        # hash of an n-gram -> the end position of its one occurrence, or of its occurrences (a list, ascending)
        self._ends: dict[int, int | list[int]] = {}
        self.documents_added = 0
        self.documents_evicted = 0

    @property
    def token_count(self) -> int:
        """Tokens held."""
        return len(self._tokens)

    @property
    def document_count(self) -> int:
        """Documents held."""
        return len(self._doc_starts)

    def add(self, tokens: Sequence[int]) -> None:
        """Add one document (a finished request's tokens), evicting the oldest past the budget. A document
        longer than the whole budget keeps its last ``max_tokens`` tokens."""
        tokens = list(tokens)[-self.config.max_tokens :]
        if len(tokens) < 2:
            return  # nothing follows anything in it
        while self._doc_starts and len(self._tokens) + len(tokens) > self.config.max_tokens:
            self._evict_oldest()
        start = self._base + len(self._tokens)
        self._tokens.extend(tokens)
        self._doc_starts.append(start)
        self._doc_ends.append(start + len(tokens))
        self.documents_added += 1
        cap = self.config.max_occurrences
        for n in range(self.config.min_ngram, self.config.max_ngram + 1):
            # an n-gram ending on the document's last token has no continuation: not indexed
            for end in range(start + n - 1, start + len(tokens) - 1):
                key = hash(tuple(tokens[end - n + 1 - start : end + 1 - start]))
                ends = self._ends.get(key)
                if ends is None:
                    self._ends[key] = end  # most n-grams occur once: a bare int costs far less than a list
                elif isinstance(ends, int):
                    self._ends[key] = [ends, end] if cap > 1 else end
                else:
                    ends.append(end)
                    if len(ends) > cap:
                        del ends[0]

    def evict_oldest(self) -> int:
        """Drop the oldest document and its index entries. Returns the tokens freed (0: the store is empty)."""
        if not self._doc_starts:
            return 0
        start, end = self._doc_starts[0], self._doc_ends[0]
        self._evict_oldest()
        return end - start

    def _evict_oldest(self) -> None:
        start, end = self._doc_starts.popleft(), self._doc_ends.popleft()
        tokens = self._tokens[: end - start]
        for n in range(self.config.min_ngram, self.config.max_ngram + 1):
            for last in range(n - 1, len(tokens) - 1):
                key = hash(tuple(tokens[last - n + 1 : last + 1]))
                ends = self._ends.get(key)
                if ends is None:
                    continue
                if isinstance(ends, int):
                    if ends < end:  # inside this document (or older)
                        del self._ends[key]
                    continue
                cut = bisect.bisect_left(ends, end)  # positions inside this document (or older) go
                if cut >= len(ends):
                    del self._ends[key]
                elif cut:
                    del ends[:cut]
        del self._tokens[: end - start]
        self._base = end
        self.documents_evicted += 1

    def _token(self, position: int) -> int:
        return self._tokens[position - self._base]

    def _occurrences(self, context: Sequence[int]) -> tuple[int, list[int]]:
        """The longest matched suffix length and the end positions where it occurred (verified tokens)."""
        length = len(context)
        for n in range(min(self.config.max_ngram, length), self.config.min_ngram - 1, -1):
            suffix = tuple(context[length - n :])
            ends = self._ends.get(hash(suffix))
            if ends is None:
                continue
            found = [
                end
                for end in ((ends,) if isinstance(ends, int) else ends)
                if end - n + 1 >= self._base
                and all(self._token(end - n + 1 + i) == token for i, token in enumerate(suffix))
            ]
            if found:
                return n, found
        return 0, []

    def has_match(self, context: Sequence[int]) -> bool:
        """Whether ``lookup`` would find a match (its draft may still be empty). Changes nothing."""
        return self._occurrences(context)[0] > 0

    def would_draft(self, context: Sequence[int]) -> bool:
        """Whether ``lookup`` would draft at least one token: a match whose continuations split below
        ``min_probability`` at once drafts nothing. Changes nothing."""
        return bool(self.lookup(context, 1).tokens)

    def lookup(self, context: Sequence[int], max_tokens: int) -> SharedDraft:
        """The draft for the context's tail (module docstring); ``NO_DRAFT`` when nothing matches."""
        if max_tokens <= 0 or not self._doc_starts:
            return NO_DRAFT
        n, ends = self._occurrences(context)
        if not n:
            return NO_DRAFT
        max_tokens = min(max_tokens, max(1, int(self.config.draft_per_match * n)))
        doc_ends = list(self._doc_ends)
        doc_starts = list(self._doc_starts)
        limits = [doc_ends[bisect.bisect_right(doc_starts, end) - 1] for end in ends]  # each one's document end
        cursors = [end + 1 for end in ends]
        probability = 1.0
        draft: list[int] = []
        support = 0
        floor = self.config.min_probability
        while len(draft) < max_tokens:
            counts: dict[int, int] = {}
            for cursor, limit in zip(cursors, limits, strict=True):
                if cursor < limit:
                    token = self._token(cursor)
                    counts[token] = counts.get(token, 0) + 1
            if not counts:
                break
            token, top = max(counts.items(), key=lambda item: item[1])
            step = probability * top / sum(counts.values())
            if step < floor:
                break
            probability = step
            draft.append(token)
            support = support or top
            kept = [
                (cursor + 1, limit)
                for cursor, limit in zip(cursors, limits, strict=True)
                if cursor < limit and self._token(cursor) == token
            ]
            cursors = [cursor for cursor, _ in kept]
            limits = [limit for _, limit in kept]
        return SharedDraft(n, tuple(draft), probability if draft else 0.0, support)


class SharedDraftStores:
    """One ``SharedDraftStore`` per key (``None``: the store of a server without keys), least recently used
    dropped past ``config.max_stores``. ``config.max_tokens`` bounds all stores together: past it, the least
    recently used other stores give up their oldest documents first (one store alone may fill it)."""

    def __init__(self, config: SharedStoreConfig | None = None) -> None:
        self.config = config if config is not None else SharedStoreConfig()
        self._stores: OrderedDict[str | None, SharedDraftStore] = OrderedDict()

    def store(self, key: str | None) -> SharedDraftStore:
        """The key's store (made when first asked for)."""
        store = self._stores.get(key)
        if store is None:
            store = self._stores[key] = SharedDraftStore(self.config)
            while len(self._stores) > self.config.max_stores:
                self._stores.popitem(last=False)
        else:
            self._stores.move_to_end(key)
        return store

    def add(self, key: str | None, prompt: Sequence[int], output: Sequence[int]) -> None:
        """A finished request's tokens into its key's store, as one document: the whole prompt then the
        output when the config includes prompts; else the output after the prompt's last ``max_ngram``
        tokens (so the start of a reply is found from the end of the next similar prompt)."""
        lead = list(prompt) if self.config.include_prompts else list(prompt)[-self.config.max_ngram :]
        tokens = lead + list(output)
        store = self.store(key)
        store.add(tokens)
        excess = sum(held.token_count for held in self._stores.values()) - self.config.max_tokens
        for other in list(self._stores.values()):  # least recently used first; the store just fed is last
            while excess > 0 and other is not store and other.token_count:
                excess -= other.evict_oldest()

    def __len__(self) -> int:
        return len(self._stores)

    def summary(self) -> dict[str, int]:
        """Counts for status and metrics."""
        return {
            "stores": len(self._stores),
            "tokens": sum(store.token_count for store in self._stores.values()),
            "documents": sum(store.document_count for store in self._stores.values()),
        }
