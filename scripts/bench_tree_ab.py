"""Two checkouts of mlxd side by side: B=1 greedy decode tok/s through the engine, A/B and A/A per round.

For a change that must not slow decode: each round runs a child process per variant, in turn (A, B, A
again), each importing mlxd from its own checkout (PYTHONPATH), loading ``--model`` as mlxd serves it
(the CPU weight rule, step tuning), prefilling the same prompt and timing ``--tokens`` greedy steps of
the single-sequence plain loop (first token excluded). Printed: each variant's median [min-max] tok/s
and the medians of the per-round B/A and A2/A ratios (the A/A column is the noise floor).

Run: .venv/bin/python scripts/bench_tree_ab.py --a /tmp/old --b . --model embedded --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mlxd_fast_blas import ensure_fast_blas  # noqa: E402

ensure_fast_blas()

PROMPT = (
    "The Python standard library contains built-in modules that provide access to system functionality "
    "such as file I/O that would otherwise be inaccessible to Python programmers, as well as modules"
)

CHILD = r"""
import json, sys
from mlxd_daemon.model_setup import load_for_serving
from mlxd_daemon.options import DaemonOptions
from mlxd_daemon.step_tuning import tune_steps
from mlxd_engine import Engine
from mlxd_scheduler.single_sequence import generate_plain
model, tokens = sys.argv[1], int(sys.argv[2])
loaded = load_for_serving(DaemonOptions(model=model, max_batch=1))
engine = Engine(loaded, max_sequences=1)
tune_steps(engine)  # the step settings mlxd would measure and use
prompt = loaded.tokenizer.encode(sys.argv[3]) if loaded.tokenizer else list(range(1, 60))
generate_plain(engine, prompt, 8)  # warm-up
result = generate_plain(engine, prompt, tokens)
print(json.dumps({"tok_s": (len(result.tokens) - 1) / result.decode_seconds}))
"""


def run(tree: str, model: str, tokens: int) -> float:
    root = Path(tree).resolve()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(root / p) for p in ("packages", "daemon", "cli")))
    out = subprocess.run(
        [sys.executable, "-c", CHILD, model, str(tokens), PROMPT], env=env, check=True, capture_output=True, text=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])["tok_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", required=True, help="the reference checkout")
    parser.add_argument("--b", required=True, help="the changed checkout")
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    results: dict[str, list[float]] = {"A": [], "B": [], "A2": []}
    for i in range(args.rounds):
        for name, tree in (("A", args.a), ("B", args.b), ("A2", args.a)):
            results[name].append(run(tree, args.model, args.tokens))
        print(f"round {i + 1}: " + "  ".join(f"{k} {v[-1]:.1f}" for k, v in results.items()), flush=True)
    for name, values in results.items():
        print(f"{name:3} {statistics.median(values):8.1f} tok/s [{min(values):.1f}-{max(values):.1f}]")
    b_a = [b / a for a, b in zip(results["A"], results["B"])]
    a_a = [a2 / a for a, a2 in zip(results["A"], results["A2"])]
    print(
        f"B/A median {statistics.median(b_a):.3f} [{min(b_a):.3f}-{max(b_a):.3f}]   "
        f"A2/A median {statistics.median(a_a):.3f} [{min(a_a):.3f}-{max(a_a):.3f}]"
    )


if __name__ == "__main__":
    main()
