"""A predicted output as a draft source: the client already knows most of the reply (OpenAI's ``prediction``).

Contract:
    * ``PredictionSource(tokens, min_ngram, max_ngram)`` indexes the prediction's n-grams.
    * ``propose(context, max_tokens)`` matches the context's suffix (longest n-gram first) in the
      prediction and returns what follows it there. Among several places, the first ending at or after
      the cursor wins (a reply follows its prediction in order), else the last one before it; the
      cursor is where the last accepted prediction tokens end, so an edited reply that skips or repeats
      a line finds its place again.
    * ``accepted`` counts the prediction's tokens the target accepted (``record``); a client is told
      ``accepted`` and ``len(tokens) - accepted`` (the prediction tokens that did not make it into the reply).
"""

from __future__ import annotations

import bisect
from collections import defaultdict


class PredictionSource:
    def __init__(self, tokens: list[int], min_ngram: int = 1, max_ngram: int = 4) -> None:
        self.tokens = list(tokens)
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        # n-gram -> sorted end positions (index of its last token) in the prediction
        self._ends: dict[tuple[int, ...], list[int]] = defaultdict(list)
        for n in range(min_ngram, max_ngram + 1):
            for end in range(n - 1, len(self.tokens)):
                self._ends[tuple(self.tokens[end - n + 1 : end + 1])].append(end)
        self.cursor = 0  # where the reply is expected to be in the prediction
        self._start = 0  # where the last proposal began in it
        self.accepted = 0
        self.last_proposal_from_prediction = False

    def propose(self, context: list[int], max_tokens: int) -> list[int]:
        """What follows the context's suffix in the prediction (empty: no match, or nothing follows)."""
        self.last_proposal_from_prediction = False
        if max_tokens <= 0:
            return []
        for n in range(min(self.max_ngram, len(context)), self.min_ngram - 1, -1):
            ends = self._ends.get(tuple(context[-n:]))
            if not ends:
                continue
            at = bisect.bisect_left(ends, self.cursor - 1)
            end = ends[at] if at < len(ends) else ends[-1]
            proposal = self.tokens[end + 1 : end + 1 + max_tokens]
            if proposal:
                self._start = end + 1
                self.last_proposal_from_prediction = True
                return proposal
        return []

    def record(self, n_accepted: int) -> None:
        """The last proposal came from here and the target accepted ``n_accepted`` of it."""
        if self.last_proposal_from_prediction:
            self.accepted += n_accepted
            self.cursor = self._start + n_accepted
            self.last_proposal_from_prediction = False

    @property
    def rejected(self) -> int:
        return max(len(self.tokens) - self.accepted, 0)
