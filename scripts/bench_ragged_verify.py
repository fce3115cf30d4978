"""Verify forwards of rows with drafts of different lengths: padded (every row computed up to the widest)
against ragged (each row's real tokens only, ``mlxd_engine/ragged.py``), timed side by side in one process.

For each case (rows and each row's draft length; 0: a plain row riding along), ``verify_rows`` over rows
prefilled to different contexts, the engine's ``ragged_verify`` off and on in turn, two rounds in
alternating order; prints the median ms of each side (mean of the rounds) and their ratio.

Run: .venv/bin/python scripts/bench_ragged_verify.py --model ../shared/models/smollm2-135m-instruct-q4
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

from bench_common import machine_facts, prefilled_rows, record_rounds, serving_engine  # noqa: E402
from mlxd_engine import verify_rows  # noqa: E402

CASES = [
    [2, 0, 0, 0],
    [5, 0, 0, 0],
    [8, 0, 0, 0],
    [8, 8, 0, 0],
    [8, 8, 8, 0],
    [8, 0, 0, 0, 0, 0, 0, 0],
    [5, 5, 3, 0, 0, 0, 0, 0],
    [8, 8, 8, 8, 0, 0, 0, 0],
    [0, 0, 0, 0],  # nothing to skip: the two sides run the same forward
    [8] * 8,
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--context", type=int, default=120)
    args = parser.parse_args()
    loaded, engine = serving_engine(args.model)
    if not engine.ragged_verify:
        sys.exit("this engine computes padding as any token (no CPU kernel layers, or MLXD_RAGGED_VERIFY=0)")
    seqs = prefilled_rows(engine, [args.context + 7 * i for i in range(8)], 4096)
    vocab = loaded.vocab_size

    def timed(drafts: list[int], ragged: bool) -> float:
        engine.ragged_verify = ragged
        group, times = seqs[: len(drafts)], []
        for _ in range(args.repeats + 1):  # the first warms the shape up
            proposals = [[(s.tokens[-1] + 1 + k) % vocab for k in range(n)] for s, n in zip(group, drafts)]
            started = time.perf_counter()
            record_rounds(group, verify_rows(engine, group, proposals, [4096] * len(group)))
            times.append((time.perf_counter() - started) * 1000.0)
        return statistics.median(times[1:])

    print(f"Machine: {machine_facts()}")
    print(f"Model: {args.model}; context {args.context} + 7 x row; median of {args.repeats}\n")
    print("| rows | drafts | padded ms | ragged ms | padded / ragged |\n|---|---|---|---|---|")
    for drafts in CASES:
        sides: dict[bool, list[float]] = {False: [], True: []}
        for order in ((False, True), (True, False)):
            for ragged in order:
                sides[ragged].append(timed(drafts, ragged))
        padded, ragged_ms = statistics.mean(sides[False]), statistics.mean(sides[True])
        print(f"| {len(drafts)} | {drafts} | {padded:.1f} | {ragged_ms:.1f} | {padded / ragged_ms:.2f} |", flush=True)
    engine.ragged_verify = True


if __name__ == "__main__":
    main()
