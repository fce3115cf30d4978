"""Contiguous storage and the prefix cache: what copying a cached prefix into a new slot costs.

A hit on contiguous storage copies the entry's K/V into the new sequence's slot (``write_prefix``); the
alternative, adopting (the new sequence taking over the finished one's slot with its K/V in place), would
save only that copy, and could serve each entry once. Measured here on ``--model`` as mlxd serves it:
for each prefix length, interleaved over rounds, the cold prefill of the prefix (what a hit saves) and the
copy of a cached prefix into a fresh slot (what adopting would save on top), both forced to finish
(``mx.eval``). Printed: medians [min-max] in ms and the copy as a share of the prefill it replaces.

Run: .venv/bin/python scripts/bench_prefix_copy.py --model ../shared/models/smollm2-135m-instruct-q4 --rounds 5
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

import mlx.core as mx  # noqa: E402

from bench_common import machine_facts, serving_engine, spread  # noqa: E402
from mlxd_engine import SamplingParams, prefill_and_record  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--lengths", default="512,1536")
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    loaded, engine = serving_engine(args.model, rows=2, max_kv=max(lengths) + 64)
    vocab = loaded.vocab_size
    storage = engine.storage
    results = {n: {"prefill": [], "copy": []} for n in lengths}
    for _ in range(args.rounds):
        for n in lengths:
            prompt = [(11 * i + 5) % vocab for i in range(n + 1)]
            seq = engine.add_sequence(prompt, SamplingParams(), 2, cache_prompt=False)
            started = time.perf_counter()
            prefill_and_record(engine, seq, n)  # the prefix only: the chunk a hit does not forward
            mx.eval(storage.arrays())
            results[n]["prefill"].append((time.perf_counter() - started) * 1000.0)
            snapshot = storage.read_prefix(seq.kv, n)
            mx.eval([a for layer in snapshot for a in layer])
            engine.release(seq, keep_prefix=False)
            target = engine.add_sequence(prompt, SamplingParams(), 2, cache_prompt=False)
            started = time.perf_counter()
            storage.write_prefix(target.kv, snapshot, n)
            mx.eval(storage.arrays())
            results[n]["copy"].append((time.perf_counter() - started) * 1000.0)
            engine.release(target, keep_prefix=False)
    facts = machine_facts()
    print(f"model {args.model}; {args.rounds} rounds; {facts['cores']} cores, mlx {facts['mlx']}, blas {facts['blas']}")
    print(f"{'prefix':>7} {'cold prefill ms':>22} {'copy into a slot ms':>22} {'copy / prefill':>15}")
    for n in lengths:
        r = results[n]
        share = statistics.median(c / p for c, p in zip(r["copy"], r["prefill"]))
        print(f"{n:>7} {spread(r['prefill']):>22} {spread(r['copy']):>22} {share:>14.1%}")


if __name__ == "__main__":
    main()
