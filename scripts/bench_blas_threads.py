"""The daemon's BLAS thread count: measured at start-up (the default) vs the old fixed rule, per model.

For each model two daemons run side by side: "old rule" with ``MLXD_BLAS_THREADS`` set to one thread fewer
than the machine has (the rule before the count was measured), and "measured" with no variable (the daemon
times decode steps at start-up and logs its choice, quoted below). Every round streams, for each daemon
in alternating order, one B=1 request (decode tok/s as the daemon reports it) and 4 concurrent requests
(aggregate tok/s at the client), all greedy, end-of-sequence ignored, chunks streamed to this process.

Run: .venv/bin/python scripts/bench_blas_threads.py --rounds 5 --max-tokens 64
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mlxd_fast_blas import ensure_fast_blas  # noqa: E402

ensure_fast_blas()  # the daemons re-exec with OpenBLAS anyway; this makes the recorded machine facts true

from bench_common import ROOT, command_line, machine_facts, ratio_spread, spread  # noqa: E402
from mlxd_protocol import AsyncClient, Client, Generate, new_request_id  # noqa: E402

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
MODELS = {
    "embedded (mlxd-qwen3-tiny)": "embedded",
    "SmolLM2-135M-Instruct q4": "../shared/models/smollm2-135m-instruct-q4",
}


def start(model: str, env: dict) -> tuple[subprocess.Popen, str, Path]:
    directory = Path(tempfile.mkdtemp(prefix="mlxd-b-", dir="/tmp"))
    directory.chmod(0o700)
    endpoint = f"ipc://{directory}/d.sock"
    log = directory / "mlxd.log"
    with open(log, "w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "mlxd_daemon", "-m", model, "--endpoint", endpoint, "--log-level", "info"],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env={**os.environ, **env},
        )
    if not process.stdout.readline().startswith("mlxd ready"):
        process.kill()
        raise RuntimeError(f"daemon did not start: {log.read_text()[-2000:]}")
    return process, endpoint, directory


def stop(process: subprocess.Popen, endpoint: str, directory: Path) -> str:
    with Client(endpoint, timeout_s=10) as client:
        client.shutdown()
    process.wait(timeout=30)
    found = re.search(r"blas_threads=(.*?) fused_cpu_layers", (directory / "mlxd.log").read_text())
    shutil.rmtree(directory, ignore_errors=True)
    return found.group(1) if found else "?"


async def streamed(endpoint: str, n: int, concurrency: int) -> float:
    async with AsyncClient(endpoint, timeout_s=600) as client:

        async def one():
            request = Generate(id=new_request_id(), prompt=PROMPT, max_tokens=n, ignore_eos=True, stream=True)
            return [reply async for reply in client.generate(request)][-1]

        started = time.perf_counter()
        dones = await asyncio.gather(*(one() for _ in range(concurrency)))
        wall = time.perf_counter() - started
    if concurrency == 1:
        return dones[0].timings["predicted_per_second"]
    return sum(d.usage["completion_tokens"] for d in dones) / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmark_results" / "blas_threads.md")
    args = parser.parse_args()
    old_rule = {"MLXD_BLAS_THREADS": str(max(1, (os.cpu_count() or 1) - 1))}
    lines = [
        "# BLAS threads: measured at start-up vs one thread fewer than the machine has",
        "",
        f"Command: `.venv/bin/python {command_line()}`",
        "",
        "Machine: " + ", ".join(f"{k} {v}" for k, v in machine_facts().items()),
        "",
        f"{args.rounds} interleaved rounds of {args.max_tokens} tokens; B=1: the daemon's decode tok/s; c=4: aggregate "
        "tok/s at the client; every request streams its chunks to this process; median [min-max], ratios per round.",
        "",
    ]
    for label, model in MODELS.items():
        if model != "embedded" and not Path(model).is_dir():
            continue
        daemons = {"old rule": start(model, old_rule), "measured": start(model, {})}
        results = {(name, c): [] for name in daemons for c in (1, 4)}
        try:
            for _, endpoint, _ in daemons.values():
                asyncio.run(streamed(endpoint, 8, 1))  # warm-up
            for round_number in range(args.rounds):
                order = list(daemons.items())[:: -1 if round_number % 2 else 1]
                for concurrency in (1, 4):
                    for name, (_, endpoint, _) in order:
                        results[(name, concurrency)].append(
                            asyncio.run(streamed(endpoint, args.max_tokens, concurrency))
                        )
                print(
                    label,
                    round_number + 1,
                    {f"{n} c={c}": round(v[-1], 1) for (n, c), v in results.items()},
                    flush=True,
                )
        finally:
            choices = {name: stop(*parts) for name, parts in daemons.items()}
        lines += [
            f"## {label}",
            "",
            f"Old rule: {choices['old rule']}. Measured: {choices['measured']}.",
            "",
            "| | old rule tok/s | measured tok/s | measured / old rule |",
            "|---|---|---|---|",
        ]
        for concurrency in (1, 4):
            old, new = results[("old rule", concurrency)], results[("measured", concurrency)]
            lines.append(
                f"| {'B=1' if concurrency == 1 else 'c=4'} | {spread(old)} | {spread(new)} | "
                f"{ratio_spread([b / a for a, b in zip(old, new)])} |"
            )
        lines.append("")
    text = "\n".join(lines)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
