"""The per-step cost of coordinating ranks: mlxd as one process vs mlxd over N ranks on this machine.

Every variant is a daemon started once (one process; a group of ``--ranks`` ranks over the ring backend on
127.0.0.1, tensor and/or pipeline parallel, where the model has the mode). Each round runs every variant
in turn (interleaved) at B=1 (one request) and at c=4 (four requests at once), greedy, ``--max-tokens``
each with end-of-sequence ignored, prompt lookup off (plain decode: one step, so one plan broadcast,
per token). Reports decode tok/s as median [min-max] over rounds and the coordination cost per step:
ms per step of the group minus ms per step of the one process (at c=4 a step decodes 4 rows).

On one 2-core machine the ranks share the cores, so a group is slower here: the figure that carries to
real hardware (one machine per rank) is the overhead per step in ms, not the ratio.

Run: .venv/bin/python scripts/bench_distributed.py [--model embedded] [--ranks 2] [--modes tensor,pipeline]
     [--rounds 3] [--max-tokens 128] [--out docs/benchmark_results/distributed.md]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mlxd_fast_blas import ensure_fast_blas  # noqa: E402

ensure_fast_blas()

from bench_common import command_line, machine_facts, spread, start_daemon, stop_daemon  # noqa: E402
from mlxd_protocol import Client, Generate, Speculative  # noqa: E402

PROMPT = (
    "The Python standard library contains built-in modules that provide access to system functionality "
    "such as file I/O that would otherwise be inaccessible to Python programmers, as well as modules"
)


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def start_group(ranks: int, mode: str, args: list[str]) -> tuple[list[subprocess.Popen], str, Path]:
    """``ranks`` mlxd ranks on loopback (as ``mlx.launch --backend ring`` starts them); rank 0's endpoint."""
    directory = Path(tempfile.mkdtemp(prefix="mlxd-g-", dir="/tmp"))
    directory.chmod(0o700)
    hostfile = directory / "hosts.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{port}"] for port in _free_ports(ranks)]))
    endpoint = f"ipc://{directory}/d.sock"
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mlxd_daemon",
                "--endpoint",
                endpoint,
                "--log-level",
                "warning",
                "--distributed",
                mode,
                *args,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ, MLX_RANK=str(rank), MLX_HOSTFILE=str(hostfile)),
        )
        for rank in range(ranks)
    ]
    line = processes[0].stdout.readline()
    if not line.startswith("mlxd ready"):
        for p in processes:
            p.kill()
        message = processes[0].stderr.read().strip().splitlines()
        raise RuntimeError(message[-1] if message else f"rank 0 did not start: {line!r}")
    return processes, endpoint, directory


def stop_group(processes: list[subprocess.Popen], endpoint: str, directory: Path) -> None:
    try:
        with Client(endpoint, timeout_s=5) as client:
            client.shutdown()
        for p in processes:
            p.wait(timeout=30)
    except Exception:  # noqa: BLE001
        for p in processes:
            p.kill()
    shutil.rmtree(directory, ignore_errors=True)


def _one(endpoint: str, max_tokens: int) -> tuple[int, float]:
    """(decoded tokens after the first, decode seconds) of one greedy request."""
    request = Generate(
        id=uuid.uuid4().hex,
        prompt=PROMPT,
        max_tokens=max_tokens,
        stream=False,
        ignore_eos=True,
        speculative=Speculative(kind="none"),
    )
    with Client(endpoint, timeout_s=600) as client:
        (done,) = list(client.generate(request))
    return done.timings["predicted_n"] - 1, done.timings["predicted_ms"] / 1000.0


def measure(endpoint: str, concurrency: int, max_tokens: int) -> float:
    """Aggregate decode tok/s of ``concurrency`` requests sent at once (wall time of the slowest)."""
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(_one(endpoint, max_tokens))) for _ in range(concurrency)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if concurrency == 1:
        tokens, seconds = results[0]
        return tokens / seconds
    return sum(tokens for tokens, _ in results) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument(
        "--modes", default="tensor,pipeline", help="the modes to try (a mode the model lacks is skipped)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--out", default=None, help="write the report (markdown) here as well")
    opts = parser.parse_args()
    os.environ.setdefault("MLXD_BLAS_THREADS", "1")  # ranks share the cores: one BLAS thread each
    args = ["-m", opts.model, "--max-kv-size", str(max(1024, 2 * opts.max_tokens + 256))]
    concurrencies = (1, 4)

    daemons: dict[str, tuple] = {}
    skipped: list[str] = []
    process, endpoint = start_daemon(*args)
    daemons["one process"] = ("one", process, endpoint)
    for mode in [m for m in opts.modes.split(",") if m]:
        try:
            processes, group_endpoint, directory = start_group(opts.ranks, mode, args)
        except RuntimeError as error:
            skipped.append(f"{mode}: {error}")
            continue
        daemons[f"{opts.ranks} ranks, {mode}"] = ("group", processes, group_endpoint, directory)

    speeds = {(name, c): [] for name in daemons for c in concurrencies}
    try:
        for entry in daemons.values():  # warm-up: first requests compile kernels
            measure(entry[2], 1, 8)
        for round_index in range(opts.rounds):
            for c in concurrencies:
                for name, entry in daemons.items():
                    speeds[(name, c)].append(measure(entry[2], c, opts.max_tokens))
            print(f"round {round_index + 1}/{opts.rounds} done", file=sys.stderr)
    finally:
        for entry in daemons.values():
            if entry[0] == "one":
                stop_daemon(entry[1], entry[2])
            else:
                stop_group(*entry[1:])

    lines = [
        "# mlxd over mx.distributed on one machine: coordination cost per step",
        "",
        f"Command: `{command_line()}`",
        "",
        "Machine: " + ", ".join(f"{k} {v}" for k, v in machine_facts().items()),
        "",
        f"Model {opts.model}; greedy, {opts.max_tokens} tokens per request (EOS ignored), prompt lookup off; "
        f"{opts.rounds} interleaved rounds; median [min-max]. Overhead: ms per decode step of the group minus "
        "that of one process (a step at c=4 decodes 4 rows).",
        "",
        "| variant | B=1 tok/s | c=4 tok/s | B=1 overhead ms/step | c=4 overhead ms/step |",
        "|---|---|---|---|---|",
    ]
    base = {c: statistics.median(speeds[("one process", c)]) for c in concurrencies}
    for name in daemons:
        row = [name] + [spread(speeds[(name, c)]) for c in concurrencies]
        for c in concurrencies:
            median = statistics.median(speeds[(name, c)])
            row.append("-" if name == "one process" else f"{1000.0 * c / median - 1000.0 * c / base[c]:.2f}")
        lines.append("| " + " | ".join(row) + " |")
    for note in skipped:
        lines.append(f"\nNot run: {note}")
    report = "\n".join(lines) + "\n"
    print(report)
    if opts.out:
        Path(opts.out).write_text(report)


if __name__ == "__main__":
    main()
