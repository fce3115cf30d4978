"""Verify layouts side by side: one padded forward for every row vs a verify forward beside a batched step.

For B decoding rows of which V propose a draft of D tokens, in one process on the loaded model (as mlxd
serves it: the CPU weight rule, step tuning), interleaved over rounds:
- plain:  one batched step over B rows (the tick without verify),
- beside: one verify forward over the V rows (1 + D tokens each) and one step over the other B - V,
- padded: one forward over all B rows, each padded to 1 + D tokens (the plain rows feed one real token).
Each timing is a whole round as the scheduler runs it (verify_rows: forward, acceptance, unwind).
Printed per shape: medians [min-max] in ms, padded/beside per round (below 1: padding is cheaper), and
what the forward cost model (calibrated as mlxd does at start-up) predicts for both.

Run: .venv/bin/python scripts/bench_verify_layout.py --model embedded --rounds 7
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mlxd_fast_blas import ensure_fast_blas  # noqa: E402

ensure_fast_blas()

from bench_common import machine_facts, prefilled_rows, ratio_spread, record_rounds, serving_engine, spread  # noqa: E402
from mlxd_engine import calibrate_forward_cost, step_and_record, verify_rows  # noqa: E402

SHAPES = [(2, 1), (4, 1), (4, 2), (8, 1), (8, 4)]  # (rows, proposing rows)


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--draft", type=int, default=8)
    parser.add_argument("--context", type=int, default=256)
    args = parser.parse_args()
    loaded, engine = serving_engine(args.model)
    calibrate_forward_cost(engine)
    vocab = loaded.vocab_size
    seqs = prefilled_rows(engine, [args.context] * 8, 4096)
    draft = [[(s.tokens[-1] + 1 + k) % vocab for k in range(args.draft)] for s in seqs]  # drafts that fail

    def plain(rows):
        step_and_record(engine, seqs[:rows])

    def beside(rows, proposing):
        record_rounds(seqs[:proposing], verify_rows(engine, seqs[:proposing], draft[:proposing], [4096] * proposing))
        if rows > proposing:
            step_and_record(engine, seqs[proposing:rows])

    def padded(rows, proposing):
        record_rounds(
            seqs[:rows], verify_rows(engine, seqs[:rows], draft[:proposing] + [[]] * (rows - proposing), [4096] * rows)
        )

    results = {shape: {"plain": [], "beside": [], "padded": []} for shape in SHAPES}
    for shape in SHAPES:  # warm-up
        beside(*shape), padded(*shape), plain(shape[0])
    for _ in range(args.rounds):
        for shape in SHAPES:
            rows, proposing = shape
            results[shape]["plain"].append(timed(lambda rows=rows: plain(rows)))
            results[shape]["beside"].append(timed(lambda rows=rows, proposing=proposing: beside(rows, proposing)))
            results[shape]["padded"].append(timed(lambda rows=rows, proposing=proposing: padded(rows, proposing)))
    cost = engine.forward_cost
    facts = machine_facts()
    print(
        f"model {args.model}; context {args.context}, drafts of {args.draft} (rejected); {args.rounds} rounds; "
        f"{facts.get('cpu', '')}"
    )
    print(f"forward cost model after the run: {cost.summary()}")
    print(
        f"{'rows':>4} {'verify':>6} {'plain ms':>18} {'beside ms':>18} {'padded ms':>18} {'padded/beside':>18}"
        f" {'model beside':>12} {'model padded':>12}"
    )
    for shape in SHAPES:
        rows, proposing = shape
        r = results[shape]
        ratios = [p / b for p, b in zip(r["padded"], r["beside"])]
        context = args.context + 2
        model_beside = cost.estimate(proposing, 1 + args.draft, context) + (
            cost.estimate(rows - proposing, 1, context) if rows > proposing else 0.0
        )
        model_padded = cost.estimate(rows, 1 + args.draft, context)
        print(
            f"{rows:>4} {proposing:>6} {spread(r['plain']):>18} {spread(r['beside']):>18} {spread(r['padded']):>18}"
            f" {ratio_spread(ratios):>18} {model_beside:>12.2f} {model_padded:>12.2f}"
        )


if __name__ == "__main__":
    main()
