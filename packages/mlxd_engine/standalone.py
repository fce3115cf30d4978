"""Engine operations with their update step, for callers that drive one row or a few themselves.

Contract: the engine's forwards (``prefill``, ``read_step``, ``step``, ``verify_rows``) settle KV appends and
return tokens; they never write a row's tokens nor the cost model. Whoever applies the results records
them (``Sequence.record``) and gives the timed forwards to ``engine.forward_cost``: the scheduler's update
step, or, for a loop that is its own update step (the single-sequence reference loops, start-up timing
and calibration, scripts, tests), these helpers, which run the operation and apply what it gave at once.

Worked example: ``prefill_and_record(engine, seq)`` on a 5-token prompt returns the first output token
and leaves ``seq.tokens`` 6 long; ``step_and_record(engine, [seq])`` then feeds that token and makes it 7.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .forward_sample import timed_step
from .sequence import Emitted, Sequence, StepHandle

if TYPE_CHECKING:  # the engine imports modules that import this one
    from .engine import Engine


def prefill_and_record(engine: Engine, seq: Sequence, max_tokens: int | None = None) -> Emitted | None:
    """``engine.prefill`` (one chunk); the first output token, once the prompt is in, is recorded."""
    first = engine.prefill(seq, max_tokens)
    if first is not None:
        seq.record([first.token])
    return first


def step_and_record(engine: Engine, rows: list[Sequence]) -> list[Emitted]:
    """``engine.step``: one synchronous step, every row's token recorded and the step's time given to
    ``engine.forward_cost`` (``timed_step``)."""
    emitted, sample = timed_step(engine, rows)
    engine.forward_cost.observe_samples([sample])
    _record(rows, emitted)
    return emitted


def read_and_record(engine: Engine, handle: StepHandle) -> list[Emitted]:
    """``engine.read_step``: a submitted step read, every live row's token recorded."""
    emitted = engine.read_step(handle)
    _record(handle.rows, emitted)
    return emitted


def _record(rows: list[Sequence], emitted: list[Emitted]) -> None:
    for seq, out in zip(rows, emitted):
        if not seq.released:  # a released row's step tokens are never reported
            seq.record([out.token])
