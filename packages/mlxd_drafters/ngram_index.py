"""Incremental suffix n-gram index for prompt-lookup drafting.

Contract:
    * The index owns a growing token sequence (prompt + committed output).
      ``append``/``extend`` cost O(max_ngram - min_ngram + 1) per token,
      independent of context length; ``propose``/``has_match`` cost at
      most that many dictionary lookups. Nothing rescans the context.
    * ``propose(k)`` tries the current suffix n-gram for n from
      ``max_ngram`` down to ``min_ngram``. For the first n whose suffix
      occurred *earlier* in the sequence, it returns up to ``k`` tokens that
      followed the most recent earlier occurrence. The suffix itself is
      never its own match. The continuation may run into the suffix region
      (that is how a repeating pattern extends); where it reaches the end
      of the sequence, the text since the earlier occurrence is a loop of
      that period, and the proposal goes on around it (a model stuck
      repeating one token or a short phrase gets whole drafts, not one or
      two tokens a round).
    * The proposal is a plain ``list[int]`` owned by the caller.

Worked example::

    >>> index = NgramIndex(min_ngram=1, max_ngram=4)
    >>> index.extend([1, 2, 3, 4, 1, 2])
    >>> index.propose(3)          # suffix (1, 2) occurred ending at position 1
    [3, 4, 1]
    >>> index.propose(4)
    [3, 4, 1, 2]
    >>> index.propose(6)          # past the end: the period-4 loop goes on
    [3, 4, 1, 2, 3, 4]
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import overload


class TokenView(Sequence[int]):
    """Read-only view over the index's token list (no copy is made).

    Slicing returns a new ``list``, so callers can never mutate the index.
    """

    __slots__ = ("_tokens",)

    def __init__(self, tokens: list[int]) -> None:
        self._tokens = tokens

    @overload
    def __getitem__(self, position: int) -> int: ...

    @overload
    def __getitem__(self, position: slice) -> list[int]: ...

    def __getitem__(self, position: int | slice) -> int | list[int]:
        return self._tokens[position]

    def __len__(self) -> int:
        return len(self._tokens)

    def __iter__(self) -> Iterator[int]:
        return iter(self._tokens)

    def __repr__(self) -> str:
        return f"TokenView(len={len(self._tokens)})"


class NgramIndex:
    """Maps every n-gram (n in [min_ngram, max_ngram]) to its latest end.

    The n-grams ending at the *last* position are registered only when the
    next token arrives. At lookup time the table therefore holds exactly
    the occurrences strictly before the current suffix, which is what makes
    "most recent earlier occurrence" a single dict lookup.

    Args:
        min_ngram: Shortest suffix length tried (>= 1).
        max_ngram: Longest suffix length tried (>= min_ngram).
        tokens: Optional initial tokens (e.g. the prompt).
    """

    __slots__ = ("_min_ngram", "_max_ngram", "_tokens", "_last_end_by_n", "last_match_length", "last_match_end")

    def __init__(self, min_ngram: int = 1, max_ngram: int = 4, tokens: Iterable[int] = ()) -> None:
        if min_ngram < 1 or max_ngram < min_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self._min_ngram = min_ngram
        self._max_ngram = max_ngram
        self.last_match_length = 0  # n of the match the last lookup found (0: none)
        self.last_match_end = -1  # where that match ended (its last token's position; -1: none)
        self._tokens: list[int] = []
        # One table per n keeps keys short and lets propose() stop at the
        # longest n without touching the others.
        self._last_end_by_n: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(min_ngram, max_ngram + 1)}
        self.extend(tokens)

    @property
    def min_ngram(self) -> int:
        """Shortest suffix n-gram length tried."""
        return self._min_ngram

    @property
    def max_ngram(self) -> int:
        """Longest suffix n-gram length tried."""
        return self._max_ngram

    @property
    def tokens(self) -> TokenView:
        """Read-only view of all tokens appended so far."""
        return TokenView(self._tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    def append(self, token: int) -> None:
        """Add one token at the end of the sequence.

        Args:
            token: The token id.
        """
        tokens = self._tokens
        previous_end = len(tokens) - 1
        if previous_end >= 0:
            # The old suffix becomes an "earlier occurrence" now that a
            # newer suffix is about to exist; overwriting keeps recency.
            available = previous_end + 1
            for n, table in self._last_end_by_n.items():
                if n > available:
                    break
                table[tuple(tokens[available - n : available])] = previous_end
        tokens.append(token)

    def extend(self, tokens: Iterable[int]) -> None:
        """Add several tokens in order (the same index as appending them one by one, built table by table).

        Args:
            tokens: Token ids to append.
        """
        all_tokens = self._tokens
        start = len(all_tokens)
        all_tokens.extend(tokens)
        last = len(all_tokens) - 1  # the newest suffix is not an earlier occurrence yet
        for n, table in self._last_end_by_n.items():
            for end in range(max(start - 1, n - 1), last):
                table[tuple(all_tokens[end - n + 1 : end + 1])] = end

    def _match_end(self) -> int | None:
        """End position of the best earlier match of the suffix, if any (its length: ``last_match_length``)."""
        tokens = self._tokens
        length = len(tokens)
        for n in range(min(self._max_ngram, length), self._min_ngram - 1, -1):
            end = self._last_end_by_n[n].get(tuple(tokens[length - n :]))
            if end is not None:
                self.last_match_length, self.last_match_end = n, end
                return end
        self.last_match_length, self.last_match_end = 0, -1
        return None

    def has_match(self) -> bool:
        """Whether ``propose`` would return a non-empty list (for k >= 1).

        Returns:
            True if some suffix n-gram occurred earlier. Side-effect free.
        """
        return self._match_end() is not None

    def propose(self, max_tokens: int) -> list[int]:
        """Tokens that followed the best earlier match of the current suffix.

        Args:
            max_tokens: Upper bound on the proposal length.

        Returns:
            ``max_tokens`` tokens (the loop's continuation past the end of
            the sequence, see the module docstring); empty if there is no
            match or ``max_tokens <= 0``.
        """
        if max_tokens <= 0:
            return []
        end = self._match_end()
        if end is None:
            return []
        run = self._tokens[end + 1 : end + 1 + max_tokens]
        if len(run) < max_tokens:  # the match is the previous lap of a loop of len(run) tokens
            run = (run * (max_tokens // len(run) + 1))[:max_tokens]
        return run
