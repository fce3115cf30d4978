"""CPU step settings chosen by timing the loaded model's decode steps at start-up: BLAS threads, compiled steps.

Why: rules tuned on the embedded tiny model do not carry to a real one: the BLAS thread count and
compiled steps that are fastest for one are slower for the other, so both are measured, not assumed
(docs/benchmark_results/code_notes.md#step-tuning).

Contract: ``tune_steps(engine)`` returns a ``StepSettings`` and leaves the engine and OpenBLAS set to it.
A lone row's decode steps are timed, interleaved over a few rounds (best step of each). Timings taken
while other processes load the machine (several daemons starting at once) favour fewer threads and
mislead, so the choice leans on the step's length: a step of ``LONG_STEP_MS`` or more is compute-bound
(its matmuls split over cores; compiling it saves only Python time, a small share), a shorter one is set
by Python and dispatch.
- BLAS threads: ``MLXD_BLAS_THREADS`` (or ``OPENBLAS_NUM_THREADS``) is taken as given; without OpenBLAS, or
  off the CPU backend, nothing is set. Otherwise one thread and every core are timed. A long step keeps
  every core unless one thread is ``MARGIN`` faster; a short one keeps the fewest threads within
  ``MARGIN`` of the fastest (a streaming client takes a core now and then, and a count that only ties
  on an idle machine loses while it does).
- Compiled steps (CPU only, when the engine has them): a long step runs op by op; a short one is timed
  against op by op with the chosen threads and keeps compiled steps only when they are ``COMPILE_GAIN``
  faster.
The timed sequence starts again (a fresh prefill, outside the timing) whenever it would outgrow the KV
bound, so any ``--max-kv-size`` the daemon accepts (16 and up) fits.
Costs about 60 decode steps.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import mlx.core as mx

from mlxd_engine import Engine, prefill_and_record, step_and_record
from mlxd_fast_blas import blas_in_use, explicit_blas_threads, set_blas_threads

MARGIN = 0.10
LONG_STEP_MS = 5.0  # steps this long are compute-bound (docs/benchmark_results/code_notes.md#step-tuning)
COMPILE_GAIN = 0.02
ROUNDS = 3
STEPS_PER_ROUND = 4
PROMPT_TOKENS = 64


@dataclass(frozen=True)
class StepSettings:
    blas_threads: int | None  # None: left at the library's default
    blas_detail: str  # for the log line
    compiled_detail: str


def candidate_counts() -> list[int]:
    cores = os.cpu_count() or 1
    return sorted({1, cores})


class ScratchSequence:
    """The synthetic sequence whose steps are timed, started again whenever it would outgrow the KV bound
    (``mlxd --max-kv-size 16`` leaves room for a few steps only). It neither reads nor feeds the prefix
    cache (on paged storage an entry would hold pool blocks until evicted)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        bound = engine.max_kv_size
        self.prompt_tokens = max(1, min(PROMPT_TOKENS, bound // 4))
        self.room = bound - self.prompt_tokens - 1  # steps one start takes before it is full
        vocab = max(2, engine.loaded.vocab_size)
        self.prompt = [(7 * i + 3) % vocab for i in range(self.prompt_tokens)]
        self.sequence = None
        self.steps_left = 0

    def ready(self):
        """The sequence, with room for one more step (started again, prefilled, when it had none)."""
        if self.steps_left < 1:
            self.release()
            self.sequence = self.engine.add_sequence(self.prompt, max_new_tokens=self.room, cache_prompt=False)
            while prefill_and_record(self.engine, self.sequence) is None:
                pass
            self.steps_left = self.room
        self.steps_left -= 1
        return self.sequence

    def step(self) -> None:
        step_and_record(self.engine, [self.ready()])

    def release(self) -> None:
        if self.sequence is not None:
            self.engine.release(self.sequence)
            self.sequence = None


def _best_step(scratch: ScratchSequence, steps: int) -> float:
    """Seconds of the fastest of ``steps`` decode steps of the scratch sequence."""
    best = float("inf")
    for _ in range(steps):
        sequence = scratch.ready()  # a restart (prefill) stays outside the timed step
        started = time.perf_counter()
        step_and_record(scratch.engine, [sequence])
        best = min(best, time.perf_counter() - started)
    return best


def _time_variants(scratch: ScratchSequence, variants: dict) -> dict:
    """Best step per variant (name -> function that sets it), interleaved over ``ROUNDS``."""
    best = {name: float("inf") for name in variants}
    for _ in range(ROUNDS):
        for name, apply in variants.items():
            apply()
            scratch.step()  # the first step after a switch may compile or warm a cache
            best[name] = min(best[name], _best_step(scratch, STEPS_PER_ROUND))
    return best


def _is_long(seconds: float) -> bool:
    return seconds * 1e3 >= LONG_STEP_MS


def _milliseconds(best: dict) -> str:
    return ", ".join(f"{name} {seconds * 1e3:.2f} ms" for name, seconds in best.items())


def tune_steps(engine: Engine) -> StepSettings:
    on_cpu = mx.default_device() == mx.cpu
    explicit = explicit_blas_threads()
    tune_blas = explicit is None and on_cpu and blas_in_use().startswith("openblas") and len(candidate_counts()) > 1
    tune_compile = on_cpu and engine.compiled_decode is not None
    blas_threads, blas_detail = None, "library default (no OpenBLAS on the CPU backend)"
    if explicit is not None:
        blas_threads = explicit if set_blas_threads(explicit) else None
        blas_detail = f"{explicit} (set by the environment)"
    compiled_detail = "on" if engine.compiled_decode is not None else "off"
    if not (tune_blas or tune_compile):
        return StepSettings(blas_threads, blas_detail, compiled_detail)
    scratch = ScratchSequence(engine)
    compiled = engine.compiled_decode
    try:
        scratch.step()  # warm-up: compiles the step
        if tune_blas:
            counts = candidate_counts()
            best = _time_variants(
                scratch, {f"{n} thread{'s' if n > 1 else ''}": (lambda n=n: set_blas_threads(n)) for n in counts}
            )
            times = dict(zip(counts, best.values()))
            if _is_long(min(times.values())):
                blas_threads = max(n for n in counts if times[n] <= min(times.values()) * (1 + MARGIN))
            else:
                blas_threads = min(n for n in counts if times[n] <= min(times.values()) * (1 + MARGIN))
            set_blas_threads(blas_threads)
            blas_detail = f"{blas_threads} (measured decode step: {_milliseconds(best)})"
        if tune_compile:
            engine.compiled_decode = None
            op_by_op = _best_step(scratch, STEPS_PER_ROUND)
            compiled_detail = f"off (a long step: {op_by_op * 1e3:.1f} ms op by op)"
        if tune_compile and not _is_long(op_by_op):

            def use(value):
                return lambda: setattr(engine, "compiled_decode", value)

            best = _time_variants(scratch, {"compiled": use(compiled), "op by op": use(None)})
            keep = best["compiled"] <= best["op by op"] * (1 - COMPILE_GAIN)
            engine.compiled_decode = compiled if keep else None
            compiled_detail = f"{'on' if keep else 'off'} (measured decode step: {_milliseconds(best)})"
    finally:
        scratch.release()
    return StepSettings(blas_threads, blas_detail, compiled_detail)
