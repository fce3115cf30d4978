"""Two gateways in front of one daemon, side by side: a client's decode rate and each gateway's CPU a token.

Starts a daemon (``--model``) and two ``mlx-serve-http --daemon`` processes: "this" runs the checkout's code,
"other" runs the code on ``--other-pythonpath`` (a worktree of another commit: its ``packages``, ``daemon`` and
``cli`` folders). Each round sends one greedy streamed chat reply of ``--max-tokens`` tokens through each, the
order reversed every other round, and reads each gateway's CPU time from /proc around it. Prints each round,
the medians and the per-round ratio this / other (code_notes.md#stream-chunks).

Run: .venv/bin/python scripts/ab_gateways.py --model ../shared/models/smollm2-135m-instruct-q4 \
    --other-pythonpath W/packages:W/daemon:W/cli
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mlxd_fast_blas import ensure_fast_blas  # noqa: E402

ensure_fast_blas()

import httpx  # noqa: E402

from bench_common import start_daemon, start_gateway, stop_daemon  # noqa: E402
from bench_serving_layers import streamed_reply  # noqa: E402


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--other-pythonpath", required=True)
    parser.add_argument("--max-tokens", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    daemon, endpoint = start_daemon("--model", args.model)
    gateways: dict[str, tuple[subprocess.Popen, str]] = {}
    try:
        gateways["this"] = start_gateway(endpoint)
        gateways["other"] = start_gateway(endpoint, pythonpath=args.other_pythonpath)
        rates: dict[str, list[float]] = {name: [] for name in gateways}
        cpu_ms: dict[str, list[float]] = {name: [] for name in gateways}
        with httpx.Client(timeout=600) as http:
            for _, url in gateways.values():
                streamed_reply(http, url, args.max_tokens)  # warm-up, not counted
            print(f"Model: {args.model}; {args.max_tokens} tokens a reply, {args.rounds} rounds\n")
            print("| round | this tok/s | other tok/s | this CPU ms a token | other CPU ms a token |")
            print("|---|---|---|---|---|")
            for round_ in range(args.rounds):
                for name in list(gateways) if round_ % 2 == 0 else list(gateways)[::-1]:
                    process, url = gateways[name]
                    before = cpu_s(process.pid)
                    rate, chunks = streamed_reply(http, url, args.max_tokens)
                    rates[name].append(rate)
                    cpu_ms[name].append(1000 * (cpu_s(process.pid) - before) / chunks)
                print(
                    f"| {round_ + 1} | {rates['this'][-1]:.1f} | {rates['other'][-1]:.1f} "
                    f"| {cpu_ms['this'][-1]:.3f} | {cpu_ms['other'][-1]:.3f} |",
                    flush=True,
                )
        ratios = [this / other for this, other in zip(rates["this"], rates["other"])]
        print()
        for name in gateways:
            rate, cpu = statistics.median(rates[name]), statistics.median(cpu_ms[name])
            print(f"{name}: median {rate:.1f} tok/s, CPU {cpu:.3f} ms a token")
        print(f"this / other per round: {statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]")
    finally:
        for process, _ in gateways.values():
            process.terminate()
            process.wait()
        stop_daemon(daemon, endpoint)


if __name__ == "__main__":
    main()
