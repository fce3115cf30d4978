"""How MLX hands a graph's ops to its CPU stream, and what that costs the thread that submits a decode step.

(a) ``mx.async_eval`` of a chain of N float32 adds on a [1, 576] array: when the call returns and when the
    chain is done. Where the call returns only when a few ops are left, the submitting thread hands over
    the ops one by one as earlier ones finish (a wake-up an op), and the work a caller does after it
    overlaps only the graph's last ops.
(b) The ops of one decode step's graph (one row, up to the sampled token), counted by kind.
(c) A loop of the engine's pipelined one-row decode steps (``submit_step`` with the step before as its
    lookahead, as the scheduler runs them): per step, the wall time, the submitting thread's CPU time
    (``time.thread_time``) and the whole process's CPU time, each round from a fresh prompt.

Run: chrt -f 1 .venv/bin/python scripts/bench_eval_handoffs.py --model ../shared/models/smollm2-135m-instruct-q4
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mlxd_fast_blas import ensure_fast_blas  # noqa: E402

ensure_fast_blas()

import mlx.core as mx  # noqa: E402

from bench_common import machine_facts, prefilled_rows, serving_engine  # noqa: E402


def chain_handoffs(lengths: list[int], repeats: int = 5) -> None:
    x = mx.ones((1, 576))
    mx.eval(x)
    print("| ops in the chain | async_eval returned after (us) | chain done after (us) |\n|---|---|---|")
    for n in lengths:
        best = (float("inf"), float("inf"))
        for _ in range(repeats):
            y = x
            for _ in range(n):
                y = y + 1.0
            started = time.perf_counter()
            mx.async_eval(y)
            returned = time.perf_counter() - started
            mx.eval(y)
            best = min(best, (returned, time.perf_counter() - started), key=lambda pair: pair[1])
        print(f"| {n} | {best[0] * 1e6:.0f} | {best[1] * 1e6:.0f} |")


def step_ops(engine, context: int) -> None:
    """The ops of one decode step's graph (the engine's forward and the argmax), counted from
    ``mx.export_to_dot``: built, counted, then evaluated and dropped with the row."""
    rows = prefilled_rows(engine, [context], context + 16)
    graph = mx.argmax(engine._forward(rows, mx.array([[rows[0].tokens[-1]]]))[:, -1, :], axis=-1)
    with tempfile.NamedTemporaryFile("w+", suffix=".dot") as dot:
        mx.export_to_dot(dot.name, graph)
        kinds = collections.Counter(re.findall(r'label\s*=\s*"([A-Za-z_0-9]+)"', dot.read()))
    mx.eval(graph)
    for row in rows:
        engine.release(row, keep_prefix=False)
    ops = sum(kinds.values())
    print(f"\nOps in one decode step: {ops}: " + ", ".join(f"{n} {kind}" for kind, n in kinds.most_common()))


def decode_steps(engine, context: int, steps: int, rounds: int) -> None:
    print("\n| round | step ms | submitting thread's CPU ms a step | process CPU ms a step |\n|---|---|---|---|")
    for round_ in range(rounds):
        rows = prefilled_rows(engine, [context], context + steps + 16)
        handle = engine.submit_step(rows)
        wall, thread, process = time.perf_counter(), time.thread_time(), time.process_time()
        for _ in range(steps):
            ahead = engine.submit_step(rows, lookahead=handle)
            for row, emitted in zip(rows, engine.read_step(handle)):
                row.record([emitted.token])
            handle = ahead
        for row, emitted in zip(rows, engine.read_step(handle)):
            row.record([emitted.token])
        wall, thread, process = (
            (time.perf_counter() - wall) * 1000 / steps,
            (time.thread_time() - thread) * 1000 / steps,
            (time.process_time() - process) * 1000 / steps,
        )
        print(f"| {round_ + 1} | {wall:.2f} | {thread:.2f} | {process:.2f} |", flush=True)
        for row in rows:
            engine.release(row, keep_prefix=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"Machine: {machine_facts()}\n")
    chain_handoffs([5, 10, 20, 100, 760])
    _, engine = serving_engine(args.model)
    step_ops(engine, args.context)
    print(f"\nModel: {args.model}; one row from {args.context} tokens of context, {args.steps} steps a round")
    decode_steps(engine, args.context, args.steps, args.rounds)


if __name__ == "__main__":
    main()
