"""Recent timings of one recurring cost, read as a figure a decision can act on.

Contract: ``RecentTimings(keep)`` holds the last ``keep`` timings ``add``-ed; ``lower_median()`` is their
lower median (None while empty) and ``least()`` their minimum. A lower median ignores one-off spikes (a
first call's set-up, a pause of the whole process, the machine's other work), which a moving average
carries for many samples, and which are always slower, never faster, than the cost they spoil.
"""

from __future__ import annotations

from collections import deque


class RecentTimings:
    def __init__(self, keep: int):
        self.samples: deque[float] = deque(maxlen=keep)

    def __len__(self) -> int:
        return len(self.samples)

    def add(self, ms: float) -> None:
        self.samples.append(ms)

    def clear(self) -> None:
        self.samples.clear()

    def lower_median(self) -> float | None:
        if not self.samples:
            return None
        ordered = sorted(self.samples)
        return ordered[(len(ordered) - 1) // 2]

    def least(self) -> float | None:
        return min(self.samples) if self.samples else None
