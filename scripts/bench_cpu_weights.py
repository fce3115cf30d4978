"""The CPU weight rule, measured: a model's decode step, 9-token verify and B=1 decode speed per weight form.

Forms (``MLXD_CPU_WEIGHTS``): ``stored`` (the checkpoint as stored: float16 scales and norms), ``quantized``
(float32, quantized layers kept quantized with float32 scales, MLX's own kernel), ``kernel`` (the same on mlxd's CPU
quantized-matmul kernel, mlxd_qmatmul), ``dequantized`` (float32 throughout: the
default where it fits the memory budget). Each form runs in its own child process, the forms alternating
over rounds; every child uses the library's BLAS threads. Measured in each child, through the engine, at a
200-token context: the median 1-token step and 9-token (current + 8 drafts) verify forward, and greedy
decode tok/s over ``--tokens`` steps. The stored form is so slow on the CPU that it runs 2 forwards of each
kind, 3 decode steps and one round only.

Run: .venv/bin/python scripts/bench_cpu_weights.py --model ../shared/models/smollm2-135m-instruct-q4 --rounds 3
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
from mlxd_fast_blas import ensure_fast_blas  # noqa: E402

ensure_fast_blas()

ROOT = Path(__file__).resolve().parent.parent
CONTEXT = 200
STORED_CONTEXT = 16  # the stored form's quantized float16 prefill costs seconds per token here


def child(model: str, form: str, tokens: int) -> dict:
    import mlx.core as mx

    from mlxd_engine import Engine, load, prefill_and_record, step_and_record

    loaded = load(model)
    engine = Engine(loaded, max_sequences=1)
    context = STORED_CONTEXT if form == "stored" else CONTEXT
    seq = engine.add_sequence([(7 * i + 3) % loaded.vocab_size for i in range(context)], max_new_tokens=tokens + 32)
    prefill_and_record(engine, seq)
    reps = 2 if form == "stored" else 12
    steps, verifies = [], []
    if form != "stored":  # warm-up (compiles the step); the stored form's forwards take seconds anyway
        step_and_record(engine, [seq])
        mx.eval(engine.verify(seq, [seq.tokens[-1]] + [7] * 8))
        engine.unwind_appends(seq, 9)
    for _ in range(reps):
        started = time.perf_counter()
        mx.eval(engine.verify(seq, [seq.tokens[-1]] + [7] * 8))
        verifies.append(time.perf_counter() - started)
        engine.unwind_appends(seq, 9)
        started = time.perf_counter()
        step_and_record(engine, [seq])
        steps.append(time.perf_counter() - started)
    n = 3 if form == "stored" else tokens
    started = time.perf_counter()
    for _ in range(n):
        step_and_record(engine, [seq])
    decode = n / (time.perf_counter() - started)
    return {
        "weights": loaded.weights,
        "step_ms": statistics.median(steps) * 1e3,
        "verify9_ms": statistics.median(verifies) * 1e3,
        "tok_s": decode,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="../shared/models/smollm2-135m-instruct-q4")
    parser.add_argument("--forms", default="stored,quantized,kernel,dequantized")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmark_results" / "cpu_weights.md")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.model, args.child, args.tokens)))
        return
    forms = args.forms.split(",")
    runs: dict[str, list[dict]] = {form: [] for form in forms}
    for round_number in range(args.rounds):
        for form in forms:
            if form == "stored" and round_number > 0:
                continue
            command = [sys.executable, __file__, "--child", form, "--model", args.model, "--tokens", str(args.tokens)]
            out = subprocess.run(
                command, capture_output=True, text=True, check=True, env={**os.environ, "MLXD_CPU_WEIGHTS": form}
            )
            runs[form].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(form, runs[form][-1], flush=True)
    from bench_common import command_line, machine_facts

    facts = machine_facts()
    lines = [
        f"# The CPU weight rule on {Path(args.model).name}",
        "",
        f"Command: `.venv/bin/python {command_line()}`",
        "",
        f"Machine: {facts['cpu']}, {facts['cores']} cores, {facts['memory']}; MLX {facts['mlx']} ({facts['device']}); "
        f"BLAS {facts['blas'].split(' (')[0]}, its default thread count.",
        "",
        f"Medians over {args.rounds} alternating child processes (the stored form: one); per child, median of the "
        f"timed forwards at a {CONTEXT}-token context through the engine, and greedy decode over {args.tokens} steps "
        f"(stored: a {STORED_CONTEXT}-token context, 2 forwards each, 3 decode steps).",
        "",
        "| weights (`MLXD_CPU_WEIGHTS`) | what the rule did | step ms | verify (9 tokens) ms | verify/step "
        "| decode tok/s |",
        "|---|---|---|---|---|---|",
    ]
    for form, results in runs.items():
        med = {k: statistics.median(r[k] for r in results) for k in ("step_ms", "verify9_ms", "tok_s")}
        lines.append(
            f"| {form} | {results[0]['weights']} | {med['step_ms']:.1f} | {med['verify9_ms']:.1f} | "
            f"{med['verify9_ms'] / med['step_ms']:.2f} | {med['tok_s']:.2f} |"
        )
    text = "\n".join(lines) + "\n"
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
