"""What one forward costs: milliseconds as a function of its rows, query tokens per row and context.

Why: whether a verify round pays depends on what its extra query tokens cost beside the rows it runs
with, and that differs by orders of magnitude between machines and models: on a GPU a forward of 8 rows
x 9 tokens costs little more than 8 x 1 (the weights are read once either way), on a CPU much more. So it
is measured, not assumed (docs/benchmark_results/code_notes.md#forward-cost).

Contract:
- ``ForwardCost.estimate(rows, width, context)``: the expected milliseconds of one forward of ``rows``
  rows, each ``width`` query tokens (padding included), at a mean of ``context`` tokens in storage;
  None until the model has seen enough to say (then callers fall back to their bounds).
- The model is linear in three features: a fixed cost, the forward's query tokens (``rows x width``) and
  its attention work (query tokens x ``context / 1024``: every query token reads the row's context),
  fitted by weighted least squares.
- ``calibrate(points)`` sets measured points (start-up: ``Engine.calibrate_forward_cost``) that keep a
  constant weight; ``observe(...)`` adds a forward timed while serving (``observe_samples``: the
  ``ForwardSample`` values an execute step returned, given by its update step), with a weight that decays
  (``FORGET`` per observation) so the fit follows the machine's present load; the first forward of each
  (rows, width) shape is not counted (one-off costs); the fit is redone every ``REFIT_EVERY``
  observations. A small ridge keeps the fit
  defined when the observations do not vary a feature (every online step has width 1, say).
- A shape (rows, width) timed ``MIN_SHAPE_SAMPLES`` times while serving is estimated from its own
  timings instead: the median of its last ``SHAPE_SAMPLES``, moved to the asked context by the fit's
  context term. The fit is a line through shapes that do not lie on one, and a gate priced by it alone
  verified forwards that lost (docs/benchmark_results/code_notes.md#forward-shapes). A shape not
  timed for ``STALE_AFTER`` observations falls back to the fit (the machine's load moves on).
- Estimates never go below ``min_ms`` (the least time observed), so a poorly conditioned fit cannot
  make a forward look free.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable

import numpy as np

from .forward_sample import ForwardSample
from .sampling.chain import SamplingParams
from .standalone import prefill_and_record, step_and_record

FORGET = 0.97  # weight kept by each online observation per newer one: about the last 30 count
CALIBRATION_WEIGHT = 1.0  # each start-up point weighs as much as one fresh online observation
RIDGE = 1e-6
REFIT_EVERY = 8  # observations between refits: a fit is a 3x3 solve, estimates are asked every tick
SHAPE_SAMPLES = 9  # a shape's last timings kept; its estimate is their median ...
MIN_SHAPE_SAMPLES = 2  # ... once this many are in (the first of each shape is never counted)
STALE_AFTER = 400  # observations after a shape's last timing when the fit stands in for it again


def feature_values(rows: int, width: int, context: float) -> tuple[float, float, float]:
    """The model's three features: a fixed cost, query tokens, query tokens x context / 1024."""
    tokens = float(rows * width)
    return 1.0, tokens, tokens * float(context) / 1024.0


def features(rows: int, width: int, context: float) -> np.ndarray:
    return np.array(feature_values(rows, width, context))


class ShapeTimings:
    """One (rows, width) shape's last timings: their median ms and mean context, worked out once per new one."""

    def __init__(self):
        self.samples: deque[tuple[float, float]] = deque(maxlen=SHAPE_SAMPLES)  # (ms, context)
        self.median_ms = self.mean_context = 0.0
        self.last_seen = 0  # the model's observation count at the newest timing

    def add(self, ms: float, context: float, observation: int) -> None:
        self.samples.append((ms, context))
        self.median_ms = statistics.median(ms for ms, _ in self.samples)
        self.mean_context = sum(c for _, c in self.samples) / len(self.samples)
        self.last_seen = observation


class ForwardCost:
    """Forward time model (module docstring)."""

    def __init__(self):
        self._calibration: list[tuple[np.ndarray, float]] = []
        self._online_xx = np.zeros((3, 3))
        self._online_xy = np.zeros(3)
        self._online_weight = 0.0
        self._widths: set[int] = set()  # widths seen: a fit needs two to split fixed from per-token cost
        self._shapes: set[tuple[int, int]] = set()  # (rows, width) forwards seen once
        self._timings: dict[tuple[int, int], ShapeTimings] = {}  # the shapes' own timings while serving
        self._theta: np.ndarray | None = None
        self.min_ms: float | None = None
        self.observations = 0
        self.spent_ms = 0.0  # every observed forward's time, summed (a caller's tick subtracts its share)

    @property
    def ready(self) -> bool:
        return len(self._widths) >= 2

    def calibrate(self, points: list[tuple[int, int, float, float]]) -> None:
        """Measured (rows, width, context, ms) points that keep their weight (start-up timings)."""
        self._calibration = [(features(r, w, c), float(ms)) for r, w, c, ms in points]
        for _rows, width, _, ms in points:
            self._widths.add(width)
            self.min_ms = ms if self.min_ms is None else min(self.min_ms, ms)
        self._theta = None

    def observe(self, rows: int, width: int, context: float, ms: float) -> None:
        """A forward timed while serving. The first of each (rows, width) shape is left out: it pays
        one-off costs (graph building, allocation) that would skew a fit of few points."""
        if rows < 1 or width < 1 or ms <= 0:
            return
        self.spent_ms += ms  # every timed forward, counted in the fit or not
        if (rows, width) not in self._shapes:
            self._shapes.add((rows, width))
            return
        x = features(rows, width, context)
        self._online_xx = FORGET * self._online_xx + np.outer(x, x)
        self._online_xy = FORGET * self._online_xy + x * ms
        self._online_weight = FORGET * self._online_weight + 1.0
        self._widths.add(width)
        self.min_ms = ms if self.min_ms is None else min(self.min_ms, ms)
        self.observations += 1
        self._timings.setdefault((rows, width), ShapeTimings()).add(ms, context, self.observations)
        if self._theta is None or self.observations % REFIT_EVERY == 0:
            self._theta = None  # refitted on the next estimate

    def observe_samples(self, samples: Iterable[ForwardSample]) -> None:
        """``observe`` each sample, in order (the forwards an execute step timed); a ragged one's time is
        spent forward time all the same, but not fitted (``ForwardSample.ragged``)."""
        for sample in samples:
            if sample.ragged:
                self.spent_ms += sample.ms
            else:
                self.observe(sample.rows, sample.width, sample.context, sample.ms)

    def coefficients(self) -> np.ndarray | None:
        """(fixed ms, ms per query token, ms per query token and 1024 context tokens), or None before ``ready``."""
        if not self.ready:
            return None
        if self._theta is None:
            xx, xy = self._online_xx.copy(), self._online_xy.copy()
            for x, ms in self._calibration:
                xx += CALIBRATION_WEIGHT * np.outer(x, x)
                xy += CALIBRATION_WEIGHT * x * ms
            scale = max(float(np.trace(xx)), 1.0)
            theta = np.linalg.solve(xx + RIDGE * scale * np.eye(3), xy)
            self._theta = np.maximum(theta, 0.0)  # no feature makes a forward cheaper
            self._floats = tuple(float(t) for t in self._theta)
        return self._theta

    def estimate(self, rows: int, width: int, context: float) -> float | None:
        if self._theta is None and self.coefficients() is None or rows < 1:
            return None
        timings = self._timings.get((rows, width))
        if (
            timings is not None
            and len(timings.samples) >= MIN_SHAPE_SAMPLES
            and self.observations - timings.last_seen <= STALE_AFTER
        ):
            # this shape's own timings, moved to the asked context by the fit's context term
            value = timings.median_ms + self._floats[2] * rows * width * (context - timings.mean_context) / 1024.0
        else:  # plain floats, no numpy: the gate asks many times a tick
            value = sum(t * x for t, x in zip(self._floats, feature_values(rows, width, context)))
        return max(value, self.min_ms or 0.0)

    def summary(self) -> dict:
        theta = self.coefficients()
        return {
            "ready": self.ready,
            "observations": self.observations,
            "fixed_ms": None if theta is None else round(float(theta[0]), 4),
            "per_token_ms": None if theta is None else round(float(theta[1]), 4),
            "per_token_kcontext_ms": None if theta is None else round(float(theta[2]), 6),
            "shapes_timed": sum(len(t.samples) >= MIN_SHAPE_SAMPLES for t in self._timings.values()),
        }


def calibrate_forward_cost(
    engine, batch: int = 4, width: int = 9, context: int = 32, long_context: int = 192, repeats: int = 2, wide: int = 16
) -> list:
    """Time plain steps and verify-shaped forwards (1 and ``batch`` rows at ``context`` tokens, one row at
    ``long_context``; 1 and ``width`` tokens each, and a lone row ``wide`` tokens too: the longest verify
    forward a lone row's full draft makes) on scratch sequences and give the points to
    ``engine.forward_cost``. Returns the (rows, width, context, ms) points; none where the engine cannot
    unwind (no verify rounds) or has no free slot. Every scratch sequence is released with nothing kept
    (no prefix cache entry). About 50 forwards and 320 prompt tokens.
    Every scratch row stays within contiguous storage's first growth chunk (256 tokens): growing the
    slot buffers for a calibration would make every later step of a short-context server copy more."""
    import statistics
    import time

    import mlx.core as mx

    if engine.storage.free_slots < 1 or not engine.can_unwind:
        return []
    vocab = engine.loaded.vocab_size
    budget = max(width, wide) + 2 * (repeats + 1) + 1
    context = min(context, engine.max_kv_size - budget - 1)  # a small --max-kv-size: shorter scratch rows
    if context < 1:
        return []  # no verify forward fits the KV bound: the model learns from served forwards alone

    def scratch(length: int, salt: int):
        prompt = [(7 * i + 3 + salt) % vocab for i in range(length)]
        if engine.storage.free_slots < 1 or not engine.fits(length, budget) or not engine.can_admit(length, budget):
            return None
        seq = engine.add_sequence(prompt, SamplingParams(), budget, cache_prompt=False)
        seqs.append(seq)
        while prefill_and_record(engine, seq) is None:
            pass
        return seq

    def timed(group: list, w: int) -> float:
        times = []
        for _ in range(repeats + 1):  # the first run warms up
            started = time.perf_counter()
            if w == 1:
                step_and_record(engine, group)
            else:
                mx.eval(engine.verify_rows(group, [[s.tokens[-1]] * w for s in group]))
                for s in group:
                    engine.unwind_appends(s, w)
            times.append((time.perf_counter() - started) * 1000.0)
        return statistics.median(times[1:])

    seqs: list = []
    try:
        short = [seq for seq in (scratch(context, row) for row in range(batch)) if seq is not None]
        if not short:
            return []
        groups = [short[:1]] + ([short] if len(short) > 1 else [])
        long = scratch(long_context, batch) if engine.max_kv_size > long_context + budget else None
        if long is not None:
            groups.append([long])
        points = []
        for group in groups:
            for w in (1, width) + ((wide,) if len(group) == 1 and wide > width else ()):
                ms = timed(group, w)
                points.append((len(group), w, sum(s.kv.written for s in group) / len(group), ms))
        engine.forward_cost.calibrate(points)
        return points
    finally:
        for seq in seqs:
            engine.release(seq, keep_prefix=False)
