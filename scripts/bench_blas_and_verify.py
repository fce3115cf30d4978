"""BLAS speed and the embedded model's step vs 8-token verify cost, with and without OpenBLAS.

The parent process runs itself twice as a child: once with MLXD_FAST_BLAS=0 (MLX's bundled BLAS) and
once with OpenBLAS preloaded, alternating over rounds, and prints a table of medians.
Measured in each child: float32 matmul GFLOP/s at 1024 and 2048; the model's 1-token step and
9-token (current + 8 drafts) verify forward at a 256-token context, in milliseconds.

Run: .venv/bin/python scripts/bench_blas_and_verify.py [--model PATH] [--rounds 3]
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

ROOT = Path(__file__).resolve().parent.parent


def child(model: str | None) -> dict:
    import mlx.core as mx

    from mlxd_engine import Engine, load, prefill_and_record, step_and_record
    from mlxd_fast_blas import blas_in_use

    result = {"blas": blas_in_use()}
    for n in (1024, 2048):
        a, b = mx.random.normal((n, n)), mx.random.normal((n, n))
        mx.eval(a @ b)
        reps = 3 if "bundled" in result["blas"] else 10
        started = time.perf_counter()
        for _ in range(reps):
            mx.eval(a @ b)
        result[f"gflops_{n}"] = 2 * n**3 * reps / (time.perf_counter() - started) / 1e9
    loaded = load(model)
    engine = Engine(loaded, max_sequences=1)
    seq = engine.add_sequence(list(range(3, 259)), max_new_tokens=64)
    prefill_and_record(engine, seq)
    steps, verifies = [], []
    for _ in range(30):
        started = time.perf_counter()
        mx.eval(engine.verify(seq, [seq.tokens[-1]] + [7] * 8))
        verifies.append(time.perf_counter() - started)
        engine.unwind_appends(seq, 9)
        started = time.perf_counter()
        step_and_record(engine, [seq])
        steps.append(time.perf_counter() - started)
        seq.kv.committed -= 1
        seq.tokens.pop()
    result["step_ms"] = statistics.median(steps[5:]) * 1000
    result["verify8_ms"] = statistics.median(verifies[5:]) * 1000
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmark_results" / "blas_and_verify.md")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.model)))
        return
    runs: dict[str, list[dict]] = {"bundled": [], "openblas": []}
    for _ in range(args.rounds):
        for name, env in (("bundled", {"MLXD_FAST_BLAS": "0", "LD_PRELOAD": ""}), ("openblas", {})):
            command = [sys.executable, __file__, "--child"] + (["--model", args.model] if args.model else [])
            if name == "openblas":
                from mlxd_fast_blas import preload_value

                env = {"LD_PRELOAD": preload_value() or ""}
            out = subprocess.run(command, capture_output=True, text=True, check=True, env={**os.environ, **env})
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(name, runs[name][-1], flush=True)
    lines = [
        "# BLAS on Linux CPU, and step vs verify cost of the embedded model",
        "",
        f"Command: `.venv/bin/python scripts/bench_blas_and_verify.py {' '.join(sys.argv[1:])}`".rstrip(),
        "",
        f"Medians of {args.rounds} alternating child processes; step/verify at a 256-token context, "
        "median of 25 timed forwards each, through the engine (which on the CPU fuses RMSNorm and RoPE and "
        "runs a lone row's step and verify forward as one compiled graph).",
        "",
        "| BLAS | matmul 1024 GFLOP/s | matmul 2048 GFLOP/s | step ms | verify (9 tokens) ms | verify/step |",
        "|---|---|---|---|---|---|",
    ]
    for results in runs.values():
        med = {
            k: statistics.median(r[k] for r in results) for k in ("gflops_1024", "gflops_2048", "step_ms", "verify8_ms")
        }
        lines.append(
            f"| {results[0]['blas'].split(' (')[0]} | {med['gflops_1024']:.1f} | {med['gflops_2048']:.1f} | "
            f"{med['step_ms']:.2f} | {med['verify8_ms']:.2f} | {med['verify8_ms'] / med['step_ms']:.2f} |"
        )
    text = "\n".join(lines) + "\n"
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
