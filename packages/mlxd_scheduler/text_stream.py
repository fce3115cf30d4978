"""Streaming text for one request: token deltas, stop strings across token boundaries.

Contract: ``TextStream`` is built at the edge with the tokenizer's streaming detokenizer (an object with
``add_token``, ``finalize`` and ``last_segment``, as mlx-lm's are) and the request's stop strings. The
scheduler feeds it token ids and gets back the text that is safe to show now, and whether a stop string
was hit. Text that could be the start of a stop string is held back until it is known not to be, so a
stop string split over several tokens is never streamed, and the final text ends right before it.

Worked example: stop ["END"], tokens decode to "ab", "cE", "N", "D!" → deltas "ab", "c", "", stop
(final text "abc").
"""

from __future__ import annotations


class TextStream:
    def __init__(self, detokenizer, stop: list[str] | None = None):
        self.detokenizer = detokenizer
        self.stop = [s for s in (stop or []) if s]
        self.held = ""  # decoded text not yet emitted (a possible stop-string prefix)
        self.text = ""  # text emitted so far
        self.stopped = False

    def push(self, token: int) -> tuple[str, bool]:
        """Add one token. Returns (text to emit now, whether a stop string ended the output)."""
        if self.stopped:
            return "", True
        self.detokenizer.add_token(token)
        return self._emit(self.detokenizer.last_segment)

    def finish(self) -> str:
        """Flush at the end of the request: the rest of the text (nothing after a stop string)."""
        if self.stopped:
            return ""
        self.detokenizer.finalize()
        delta, _ = self._emit(self.detokenizer.last_segment)
        rest, self.held = self.held, ""
        self.text += rest
        return delta + rest

    def _emit(self, segment: str) -> tuple[str, bool]:
        candidate = self.held + segment
        if not self.stop:
            self.held = ""
            self.text += candidate
            return candidate, False
        hits = [candidate.find(s) for s in self.stop]
        hits = [i for i in hits if i >= 0]
        if hits:
            delta = candidate[: min(hits)]
            self.held = ""
            self.text += delta
            self.stopped = True
            return delta, True
        keep = self._longest_stop_prefix_suffix(candidate)
        delta, self.held = candidate[: len(candidate) - keep], candidate[len(candidate) - keep :]
        self.text += delta
        return delta, False

    def _longest_stop_prefix_suffix(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of some stop string."""
        best = 0
        for stop in self.stop:
            for n in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:n]):
                    best = n
                    break
        return best
