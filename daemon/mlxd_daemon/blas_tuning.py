"""The daemon's BLAS thread count, chosen by timing the loaded model's decode steps at start-up.

Why: on 2 cores one OpenBLAS thread (one core left for the clients a server streams to) was fastest for
the embedded tiny model, whose steps are too small to split, but costs a 135M-parameter model about a
quarter of its speed. So the count is measured, not assumed (docs/benchmark_results/blas_threads.md).

Contract: ``choose_blas_threads(engine)`` returns ``(threads, detail)`` and leaves OpenBLAS set to
``threads``. ``MLXD_BLAS_THREADS`` (or ``OPENBLAS_NUM_THREADS``) is taken as given. Without OpenBLAS, or
off the CPU backend, it changes nothing (``threads`` None). Otherwise it times a lone row's decode
steps with each candidate count (one, and every core), interleaved over a few rounds, and keeps the
fewest threads whose best step is within ``MARGIN`` of the fastest: a streaming client takes a core now
and then, and a count that only ties on an idle machine loses while it does. Costs about 40 steps.
"""

from __future__ import annotations

import os
import time

import mlx.core as mx

from mlxd_engine import Engine
from mlxd_fast_blas import blas_in_use, explicit_blas_threads, set_blas_threads

MARGIN = 0.10
ROUNDS = 3
STEPS_PER_ROUND = 4
PROMPT_TOKENS = 64


def candidate_counts() -> list[int]:
    cores = os.cpu_count() or 1
    return sorted({1, cores})


def _time_steps(engine: Engine, sequence, steps: int) -> float:
    """Seconds of the fastest of ``steps`` decode steps of ``sequence``."""
    best = float("inf")
    for _ in range(steps):
        started = time.perf_counter()
        engine.step([sequence])
        best = min(best, time.perf_counter() - started)
    return best


def choose_blas_threads(engine: Engine) -> tuple[int | None, str]:
    explicit = explicit_blas_threads()
    if explicit is not None:
        return (explicit if set_blas_threads(explicit) else None), f"{explicit} (set by the environment)"
    if mx.default_device() != mx.cpu or not blas_in_use().startswith("openblas"):
        return None, "library default (no OpenBLAS on the CPU backend)"
    counts = candidate_counts()
    if len(counts) == 1:
        set_blas_threads(counts[0])
        return counts[0], "1 (one core)"
    vocab = max(2, engine.loaded.vocab_size)
    prompt = [(7 * i + 3) % vocab for i in range(PROMPT_TOKENS)]
    sequence = engine.add_sequence(prompt, max_new_tokens=ROUNDS * len(counts) * STEPS_PER_ROUND + 4)
    try:
        engine.prefill(sequence)
        engine.step([sequence])  # warm-up: compiles the step
        best = {count: float("inf") for count in counts}
        for _ in range(ROUNDS):
            for count in counts:
                set_blas_threads(count)
                best[count] = min(best[count], _time_steps(engine, sequence, STEPS_PER_ROUND))
    finally:
        engine.release(sequence)
    fastest = min(best.values())
    chosen = min(count for count in counts if best[count] <= fastest * (1 + MARGIN))
    set_blas_threads(chosen)
    timings = ", ".join(f"{count} thread{'s' if count > 1 else ''} {best[count] * 1e3:.2f} ms" for count in counts)
    return chosen, f"{chosen} (measured decode step: {timings})"
