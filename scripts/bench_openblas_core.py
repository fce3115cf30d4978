"""OpenBLAS's own kernel pick against the one mlxd asks for (``OPENBLAS_CORETYPE``), side by side.

Where the system OpenBLAS does not know this CPU it runs generic kernels, and mlxd starts its processes
with the kernels the CPU's instruction sets allow (``mlxd_fast_blas.openblas_core``). This times both
arms in fresh processes, rounds interleaved: one float32 matmul, then per model the engine as mlxd serves
it (the CPU weight rule): a prompt's prefill and the forward shapes of a decode step and a verify
(``verify_rows``, rows x query tokens, at 120 tokens of context).

Run: .venv/bin/python scripts/bench_openblas_core.py --model embedded --model ../shared/models/smollm2-135m-instruct-q4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

SHAPES = ((1, 1), (1, 9), (8, 1), (8, 9))


def measure(model: str, prompt: int, repeats: int) -> dict:
    """The child's figures (ms): one float32 matmul, and the model's prefill and forward shapes."""
    import mlx.core as mx

    from bench_common import prefilled_rows, record_rounds, serving_engine
    from mlxd_engine import verify_rows
    from mlxd_engine.loading.kernel_layers import best_ms

    a, b = mx.random.normal((512, 576)), mx.random.normal((1536, 576))
    mx.eval(a, b)
    out = {"matmul 512x576 @ 576x1536": best_ms(lambda: [a @ b.T for _ in range(5)], 5) / 5}
    loaded, engine = serving_engine(model)
    times = []
    for _ in range(3):
        started = time.perf_counter()
        (seq,) = prefilled_rows(engine, [prompt], 4096)
        times.append((time.perf_counter() - started) * 1000.0)
        engine.release(seq, keep_prefix=False)
    out[f"prefill {prompt} tokens"] = statistics.median(times)
    seqs = prefilled_rows(engine, [120] * 8, 4096)
    vocab = loaded.vocab_size
    for rows, width in SHAPES:
        group, times = seqs[:rows], []
        for _ in range(repeats + 1):  # the first warms the shape up
            drafts = [[(s.tokens[-1] + 1 + k) % vocab for k in range(width - 1)] for s in group]
            started = time.perf_counter()
            record_rounds(group, verify_rows(engine, group, drafts, [4096] * rows))
            times.append((time.perf_counter() - started) * 1000.0)
        out[f"forward {rows} x {width}"] = statistics.median(times[1:])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", default=None, help="repeatable; default: embedded")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.prompt, args.repeats)))
        return

    from bench_common import command_line, machine_facts
    from mlxd_fast_blas import find_openblas
    from mlxd_fast_blas.openblas_core import core_started_with, core_to_force, cpu_flags

    library = find_openblas()
    if library is None:
        sys.exit("no system OpenBLAS here: nothing to compare")
    own = core_started_with({"LD_PRELOAD": library})  # the library's own pick, OPENBLAS_CORETYPE unset
    chosen = core_to_force(own, cpu_flags())
    if chosen is None:
        sys.exit(f"OpenBLAS picks {own} kernels here and mlxd asks for no other: nothing to compare")
    arms = {arm: {"LD_PRELOAD": library, "OPENBLAS_CORETYPE": arm} for arm in (own, chosen)}
    models = args.model or ["embedded"]
    figures: dict = {(model, arm): [] for model in models for arm in arms}
    for round_ in range(args.rounds):
        for model in models:
            order = list(arms) if round_ % 2 == 0 else list(arms)[::-1]
            for arm in order:
                child = [sys.executable, __file__, "--child", model, "--prompt", str(args.prompt)]
                child += ["--repeats", str(args.repeats)]
                done = subprocess.run(child, capture_output=True, text=True, env={**os.environ, **arms[arm]})
                if done.returncode != 0:
                    sys.exit(f"{model} with {arm} kernels failed:\n{done.stderr[-2000:]}")
                figures[model, arm].append(json.loads(done.stdout.strip().splitlines()[-1]))
                print(f"round {round_ + 1} {model} {arm}: {figures[model, arm][-1]}", flush=True)
    lines = [
        f"# OpenBLAS kernels: the library's own pick ({own}) against the one mlxd asks for ({chosen})\n",
        f"Command: `.venv/bin/python {command_line()}`\n",
        f"Machine: {machine_facts()}\n",
        f"ms per arm, one value a round (fresh processes, rounds interleaved); ratio: {own} / {chosen} of the "
        "medians (above 1: the chosen kernels are faster). Forward shapes: `verify_rows`, rows x query tokens, "
        f"median of {args.repeats}; prefill: median of 3.\n",
    ]
    for model in models:
        lines += [f"\n## {model}\n", f"| measure | {own} ms | {chosen} ms | ratio |", "|---|---|---|---|"]
        for name in figures[model, own][0]:
            a = [f[name] for f in figures[model, own]]
            b = [f[name] for f in figures[model, chosen]]
            cells = " / ".join(f"{v:.2f}" for v in a), " / ".join(f"{v:.2f}" for v in b)
            lines.append(f"| {name} | {cells[0]} | {cells[1]} | {statistics.median(a) / statistics.median(b):.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    from mlxd_fast_blas import ensure_fast_blas

    if "--child" not in sys.argv:
        ensure_fast_blas()
    main()
