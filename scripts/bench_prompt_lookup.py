"""Prompt lookup in the daemon, flag on vs off, measured side by side.

(a) plain prompt, B=1: decode tok/s with --draft-kind prompt-lookup vs without;
(b) copy prompt ("Repeat the following paragraph exactly: ..."), B=1: speedup and accepted per verify;
(c) 2, 4 and 8 concurrent requests, plain, copy and mixed (half copy, half plain requests): aggregate
    tok/s, flag on (the verify gate weighing each draft against its measured cost) vs off. A case keeps c
    requests in flight (c workers, each sending its next request when its previous one finished).
Daemons run side by side; every round runs each variant once, interleaved, in alternating order.
Median [min-max] over rounds.
A second daemon without the flag ("off, again") is measured like the others: its ratio to "off" is the
A/A spread, how far two identical daemons differ on this machine in the same rounds.

Run: .venv/bin/python scripts/bench_prompt_lookup.py [--rounds 3] [--model PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mlxd_fast_blas import ensure_fast_blas  # noqa: E402

ensure_fast_blas()  # the daemons re-exec with OpenBLAS anyway; this makes the recorded machine facts true

from bench_common import (  # noqa: E402
    ROOT,
    command_line,
    machine_facts,
    ratio_spread,
    spread,
    start_daemon,
    stop_daemon,
)
from mlxd_protocol import AsyncClient, Generate, new_request_id  # noqa: E402

PARAGRAPHS = [
    "The scheduler keeps one decode step in flight while it reads the previous one, so the model never waits "
    "for Python. When a row proposes draft tokens, the next tick runs synchronously and the proposal is checked "
    "in a single forward pass; the accepted tokens are committed and the rest are unwound.",
    "A lighthouse keeper wrote in his log every evening. He noted the direction of the wind, the colour of the "
    "sea and the ships that passed the point. Most nights were quiet, but in winter the storms came from the "
    "north and the lamp had to be watched until morning.",
    "To install the package, create a virtual environment, activate it and run the installer with the name of "
    "the project. The command downloads the dependencies, builds the extension modules and writes a small "
    "launcher script for each command into the environment's bin directory.",
    "The library keeps a cache of recently used objects. When the cache is full, the entry that has not been "
    "used for the longest time is removed first. Lookups move an entry to the front, so objects that are read "
    "often stay in memory while rarely used ones are dropped.",
]
PLAIN_PROMPTS = [
    "Write a short story about a robot who learns to paint.",
    "Explain how a bicycle works.",
    "Describe a walk through an old city at night.",
    "What makes a good teacher?",
]


def copy_prompt(i: int) -> str:
    return f"Repeat the following paragraph exactly: {PARAGRAPHS[i % len(PARAGRAPHS)]}"


def prompt_for(style: str, i: int) -> tuple[str, bool, bool]:
    """Request i of a case: (prompt, ignore_eos, cache_prompt). Plain prompts run to max tokens; copies stop at
    their end; "mixed" alternates a copy and a plain request. A case repeats its requests, so after the first
    a copy's prompt comes from the prefix cache; "copy-uncached" sends the same copies with ``cache_prompt``
    off (every request is a first one, its prompt prefilled whole)."""
    if style in ("copy", "copy-uncached") or (style == "mixed" and i % 2 == 0):
        return copy_prompt(i), False, style != "copy-uncached"
    return PLAIN_PROMPTS[i % 4], True, True


async def run_batch(endpoint: str, prompts: list[tuple[str, bool, bool]], max_tokens: int, repeat: int = 1) -> dict:
    """Send the (prompt, ignore_eos, cache_prompt) requests ``repeat`` times over.

    ``len(prompts)`` requests are kept in flight as mlx-bench does: that many workers, each sending the next request of
    the list when its previous one finished (so a row that finishes early makes room for the next request, as under a
    server's load). Wall time runs from the first request sent to the last one finished."""
    queue = [pair for _ in range(repeat) for pair in prompts]
    dones: list = [None] * len(queue)
    next_index = iter(range(len(queue)))
    async with AsyncClient(endpoint, timeout_s=600) as client:

        async def worker():
            for index in next_index:
                prompt, ignore_eos, cache_prompt = queue[index]
                replies = [
                    r
                    async for r in client.generate(
                        Generate(
                            id=new_request_id(),
                            prompt=prompt,
                            max_tokens=max_tokens,
                            ignore_eos=ignore_eos,
                            cache_prompt=cache_prompt,
                        )
                    )
                ]
                dones[index] = replies[-1]

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in prompts))
        wall = time.perf_counter() - started
    tokens = sum(d.usage["completion_tokens"] for d in dones)
    drafted = sum(d.timings.get("draft_n", 0) for d in dones)
    accepted = sum(d.timings.get("draft_n_accepted", 0) for d in dones)
    rounds = sum(d.timings.get("draft_verify_n", 0) for d in dones)
    return {
        "aggregate": tokens / wall,
        "decode": statistics.median(d.timings["predicted_per_second"] for d in dones),
        "tokens": [d.tokens for d in dones[: len(prompts)]],
        "drafted": drafted,
        "accepted": accepted,
        "rounds": rounds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument(
        "--repeat",
        type=int,
        default=5,
        help="requests per worker and measurement (c workers keep c requests in flight)",
    )
    parser.add_argument("--concurrency", default="1,2,4,8", help="concurrent requests per case (comma list)")
    parser.add_argument(
        "--styles",
        default="plain,copy,copy-uncached,mixed",
        help="prompt styles to run (plain: little copying expected; copy: prompts from the prefix "
        "cache after the first; copy-uncached: the copies prefilled whole every time; mixed: "
        "half copy, half plain)",
    )
    parser.add_argument(
        "--on-args",
        default="",
        help="more mlxd options for the daemon with prompt lookup on, e.g. --no-shared-drafts (prompt lookup "
        "alone, without drafts from earlier requests' outputs)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmark_results" / "prompt_lookup.md")
    args = parser.parse_args()
    model_args = ["-m", args.model or "embedded"]
    daemons = {
        "off": start_daemon(*model_args, "--max-batch", "8"),
        "off, again": start_daemon(*model_args, "--max-batch", "8"),
        "on": start_daemon(*model_args, "--max-batch", "8", "--draft-kind", "prompt-lookup", *args.on_args.split()),
    }
    cases = [(style, int(c)) for c in args.concurrency.split(",") for style in args.styles.split(",")]
    results: dict = {f"{style} c={c}": {name: [] for name in daemons} for style, c in cases}
    acceptance: dict = {key: {"drafted": 0, "accepted": 0, "rounds": 0} for key in results}
    mismatches = 0
    try:
        for _, endpoint in daemons.values():  # warm-up
            asyncio.run(run_batch(endpoint, [(copy_prompt(0), False, True)], 32))
        for round_number in range(args.rounds):
            for style, concurrency in cases:
                key = f"{style} c={concurrency}"
                prompts = [prompt_for(style, i) for i in range(concurrency)]
                outputs = {}
                order = list(daemons.items())
                if round_number % 2:
                    order.reverse()  # alternate the order of the targets from round to round
                for name, (_, endpoint) in order:
                    result = asyncio.run(run_batch(endpoint, prompts, args.max_tokens, args.repeat))
                    metric = result["decode"] if concurrency == 1 else result["aggregate"]
                    results[key][name].append(metric)
                    outputs[name] = result["tokens"]
                    if name == "on":
                        acceptance[key]["drafted"] += result["drafted"]
                        acceptance[key]["accepted"] += result["accepted"]
                        acceptance[key]["rounds"] += result["rounds"]
                mismatches += outputs["on"] != outputs["off"]
                print(
                    f"round {round_number + 1} {key}: "
                    + ", ".join(f"{n} {v[-1]:.1f}" for n, v in results[key].items()),
                    flush=True,
                )
        with_status = {}
        from mlxd_protocol import Client

        for name, (_, endpoint) in daemons.items():
            with Client(endpoint, timeout_s=10) as client:
                with_status[name] = client.status().totals
    finally:
        for process, endpoint in daemons.values():
            stop_daemon(process, endpoint)

    lines = [
        "# Prompt lookup in mlxd: flag on vs off",
        "",
        f"Command: `{command_line()}`",
        "",
        f"Embedded model unless stated: `{args.model or 'models/mlxd-qwen3-tiny'}`; greedy; {args.max_tokens} max "
        f"tokens; {args.rounds} interleaved rounds; median [min-max]. A case at concurrency c sends {args.repeat} x c "
        "requests through c workers (each sends its next request when the previous one finished, as mlx-bench "
        "does). B=1 rows: median decode tok/s of the requests (first token excluded); c>1 rows: aggregate output "
        "tok/s (all tokens / wall time). Plain prompts "
        "run to max tokens (EOS ignored); copy prompts stop at the end of the copy.",
        "",
    ]
    if not args.model:
        lines += [
            "The embedded model's greedy replies to plain prompts fall into repetition (see its model card), and "
            "prompt lookup drafts from the repeats: its plain rows are not the no-match case. "
            "`prompt_lookup_stories260k.md` measures plain text that copies little.",
            "",
        ]
    lines += [
        "Machine: " + ", ".join(f"{k} {v}" for k, v in machine_facts().items()),
        "",
        "| case | off | on | on/off per round | A/A: off again/off per round |",
        "|---|---|---|---|---|",
    ]
    for key, by_name in results.items():

        def per_round(name: str, by_name: dict = by_name) -> str:
            return ratio_spread([a / b for a, b in zip(by_name[name], by_name["off"])])

        lines.append(
            f"| {key} | {spread(by_name['off'])} | {spread(by_name['on'])} "
            f"| {per_round('on')} | {per_round('off, again')} |"
        )
    lines += [
        "",
        "Acceptance with the flag on, summed over rounds:",
        "",
        "| case | verify rounds | drafted | accepted | accepted / drafted | accepted per verify |",
        "|---|---|---|---|---|---|",
    ]
    for key, a in acceptance.items():
        rate = a["accepted"] / a["drafted"] if a["drafted"] else 0.0
        per_round = a["accepted"] / a["rounds"] if a["rounds"] else 0.0
        lines.append(f"| {key} | {a['rounds']} | {a['drafted']} | {a['accepted']} | {rate:.2f} | {per_round:.2f} |")
    lines += ["", "Daemon totals at the end (verify rounds, declines):", ""]
    for name, totals in with_status.items():
        lines.append(f"- {name}: " + ", ".join(f"{k}={v}" for k, v in totals.items()))
    lines += ["", f"Outputs with the flag on differed from off in {mismatches} of {args.rounds * len(cases)} cases."]
    text = "\n".join(lines) + "\n"
    args.out.write_text(text)
    args.out.with_suffix(".json").write_text(
        json.dumps({"results": results, "acceptance": acceptance}, indent=2) + "\n"
    )
    print(text)


if __name__ == "__main__":
    main()
