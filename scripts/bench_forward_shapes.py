"""What one verify round costs by shape: rows x query tokens, timed in-process on the loaded model.

For each (rows, width) shape: the median ms of ``verify_rows`` (forward, acceptance, unwind) over rows at
``--context`` tokens with drafts that fail, and what the forward cost model's line (calibrated as mlxd
does at start-up, no serving timings yet) says of it. Shapes off the line are what the model's per-shape
timings are for (docs/benchmark_results/code_notes.md#forward-shapes).

Run: .venv/bin/python scripts/bench_forward_shapes.py --model ../shared/models/smollm2-135m-instruct-q4
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
from mlxd_engine import calibrate_forward_cost, verify_rows  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--context", type=int, default=120)
    parser.add_argument("--rows", default="1,4,8")
    parser.add_argument("--widths", default="1,3,5,9")
    parser.add_argument(
        "--spread",
        type=int,
        default=0,
        help="row i starts at context + spread x i (rows at different positions, as when serving)",
    )
    parser.add_argument("--kv-dtype", default="float32", choices=["float32", "float16"], help="as mlxd --kv-dtype")
    args = parser.parse_args()
    loaded, engine = serving_engine(args.model, kv_dtype=args.kv_dtype)
    calibrate_forward_cost(engine)
    shapes = [(int(r), int(w)) for r in args.rows.split(",") for w in args.widths.split(",")]
    # before any shape is timed; at the mean context of the rows each shape runs (row i: context + spread x i)
    line = {(r, w): engine.forward_cost.estimate(r, w, args.context + args.spread * (r - 1) / 2) for r, w in shapes}
    seqs = prefilled_rows(engine, [args.context + args.spread * i for i in range(8)], 4096)
    vocab = loaded.vocab_size
    print(
        f"Machine: {machine_facts()}\nModel: {args.model}; context {args.context} (+ {args.spread} x row); "
        f"median of {args.repeats}\n"
    )
    print("| rows x width | verify_rows ms | the line's estimate | measured / line |\n|---|---|---|---|")
    for rows, width in shapes:
        group = seqs[:rows]
        times = []
        for _ in range(args.repeats + 1):  # the first warms the shape up
            drafts = [[(s.tokens[-1] + 1 + k) % vocab for k in range(width - 1)] for s in group]
            started = time.perf_counter()
            record_rounds(group, verify_rows(engine, group, drafts, [4096] * rows))
            times.append((time.perf_counter() - started) * 1000.0)
        ms = statistics.median(times[1:])
        print(f"| {rows} x {width} | {ms:.1f} | {line[rows, width]:.1f} | {ms / line[rows, width]:.2f} |", flush=True)
    print(f"\n(each round keeps one token per row: the first row ends at {seqs[0].kv.written} tokens of context)")


if __name__ == "__main__":
    main()
