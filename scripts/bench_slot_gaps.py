"""Batched steps over rows whose slots have gaps, read as joined runs of adjacent slots vs gathered.

A row that finishes leaves its slot empty until a new request takes it, and rows verified beside the
others split a batch into two sets of slots: either way a forward's rows are not adjacent. Contiguous
storage then reads them as the runs of adjacent slots, sliced and joined (``RowPlan.slot_runs``), where it
used to gather every row from the strided buffer. In one process on the loaded model (as mlxd serves it),
interleaved over rounds, each timing the median of ``--steps`` synchronous steps:
- 8 adjacent rows, 7 adjacent rows (the baseline a gap is measured against), rows at different positions,
- 7 rows with one gap (slot 3 empty), 6 rows with two gaps (slots 2 and 5 empty),
each with the runs read ("runs") and with the gather ("gather"). Printed: median [min-max] ms per step
and, per shape, gather/runs per round (above 1: the runs are faster).

Run: .venv/bin/python scripts/bench_slot_gaps.py --model embedded --rounds 7
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mlxd_fast_blas import ensure_fast_blas  # noqa: E402

ensure_fast_blas()

from bench_common import command_line, machine_facts, prefilled_rows, ratio_spread, serving_engine, spread  # noqa: E402
from mlxd_engine import step_and_record  # noqa: E402
from mlxd_engine.storage.kv_storage import RowPlan  # noqa: E402

SHAPES = {
    "8 adjacent": list(range(8)),
    "7 adjacent": list(range(7)),
    "7, one gap": [0, 1, 2, 4, 5, 6, 7],
    "6, two gaps": [0, 1, 3, 4, 6, 7],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--context", type=int, default=256)
    args = parser.parse_args()
    _, engine = serving_engine(args.model)
    # rows at different positions, as under load (a batch whose rows all start at one position writes its
    # appends as one slice, which no gap allows)
    seqs = prefilled_rows(engine, [args.context + 7 * row for row in range(8)], 4096)
    runs = RowPlan.slot_runs

    def step_ms(slots: list[int], read: str) -> float:
        RowPlan.slot_runs = runs if read == "runs" else (lambda plan: None)
        rows = [seqs[slot] for slot in slots]
        times = []
        for _ in range(args.steps):
            started = time.perf_counter()
            step_and_record(engine, rows)
            times.append((time.perf_counter() - started) * 1000.0)
        return statistics.median(times)

    results = {(shape, read): [] for shape in SHAPES for read in ("runs", "gather")}
    for slots in SHAPES.values():  # warm-up
        step_ms(slots, "runs"), step_ms(slots, "gather")
    for number in range(args.rounds):
        for shape, slots in SHAPES.items():
            for read in ("runs", "gather") if number % 2 == 0 else ("gather", "runs"):
                results[shape, read].append(step_ms(slots, read))
    RowPlan.slot_runs = runs
    facts = machine_facts()
    print(f"$ {command_line()}")
    print(
        f"model {args.model}; contexts {args.context} + 7 x row (+ the steps taken); "
        f"{args.rounds} rounds of {args.steps} steps; "
        f"{facts.get('cpu', '')}"
    )
    print(f"{'rows':>12} {'runs ms':>18} {'gather ms':>18} {'gather/runs':>20}")
    for shape in SHAPES:
        by_runs, by_gather = results[shape, "runs"], results[shape, "gather"]
        print(
            f"{shape:>12} {spread(by_runs):>18} {spread(by_gather):>18}"
            f" {ratio_spread([g / r for g, r in zip(by_gather, by_runs)]):>20}"
        )


if __name__ == "__main__":
    main()
