"""One timed forward, measured where it runs and handed to whoever applies the results.

Contract: an execute step times its forwards and returns ``ForwardSample`` values; it never writes the
cost model. The update step gives them to ``ForwardCost.observe_samples`` (the scheduler's), or a loop
that is its own update step does so at once (``standalone.step_and_record``, ``verify_round.verify_rows``).

Worked example: ``tokens, sample = timed_step(engine, [a, b])`` runs one synchronous step of two rows
and returns their tokens (not recorded) with ``ForwardSample(rows=2, width=1, context=..., ms=...)``;
``context`` is the rows' mean tokens in storage once the step has committed its appends.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .sequence import Emitted, Sequence, mean_context

if TYPE_CHECKING:  # the engine imports modules that import this one
    from .engine import Engine


@dataclass(frozen=True)
class ForwardSample:
    """One forward's shape and wall time: ``rows`` rows of ``width`` query tokens each (padding included)
    at a mean of ``context`` tokens in storage, in ``ms`` milliseconds. ``ragged``: the forward computed
    its rows' real tokens only (``ragged.py``); the cost model does not learn from it (it costs less than
    the ``rows x width`` shape it names, and the verify gate prices it as that shape, an upper bound), but
    its time counts as forward time."""

    rows: int
    width: int
    context: float
    ms: float
    ragged: bool = False


def timed_step(engine: Engine, rows: list[Sequence]) -> tuple[list[Emitted], ForwardSample]:
    """``engine.step(rows)`` timed: every row's token (not recorded) and the step's sample."""
    started = time.perf_counter()
    emitted = engine.step(rows)
    return emitted, ForwardSample(len(rows), 1, mean_context(rows), (time.perf_counter() - started) * 1000.0)
