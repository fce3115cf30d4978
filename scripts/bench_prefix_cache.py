"""Prefix cache across requests (issue 23): multi-turn chat sessions, TTFT per turn with and without the cache.

One mlx-bench run (targets interleaved in every batch, rounds repeated), chat sessions of --turns turns:
    cache       mlx-serve-http -> mlxd A (prompt lookup off), its prefix cache on (the daemon's default budget)
    nocache     the same gateway and daemon, every request with cache_prompt: false
    cache_pl    mlx-serve-http -> mlxd B (--draft-kind prompt-lookup), cache on
    nocache_pl  the same as cache_pl with cache_prompt: false
    mlx_lm      mlx_lm.server (its own LRU prompt cache) on the float32 copy bench_reference.sh gives it
                (scripts/write_cpu_weights_copy.py: mlxd's CPU weight rule) with the same OpenBLAS preload
Sessions: turn 1 is a system message and ~1.0K SmolLM2 tokens of notes with a question (--prompt-tokens 1200:
mlx-bench estimates 1.3 tokens a word, SmolLM2's tokenizer gives ~15% fewer); each later turn adds the
150-token reply (--ignore-eos, so every reply runs to --max-tokens) and a short follow-up, so the history is
~1.5K tokens by turn 4. Concurrency 1 and 4, 4 sessions per batch, 3 rounds; baseline nocache. Written to
docs/benchmark_results/prefix_cache_smollm2/: mlx-bench's results.md / results.json / plots / server logs,
and a section appended to results.md with the acceptance figures: last-turn TTFT speedup of the cache over
no cache and over mlx_lm.server (per round: their TTFT / its TTFT), with prompt lookup off and on; aggregate
tok/s of 4 concurrent sessions; and a check that the nocache targets were really served without the cache
(cached tokens 0; blank when the server does not report them).

Run: .venv/bin/python scripts/bench_prefix_cache.py            (about 35 minutes on 2 cores, an estimate)
Smallest check: .venv/bin/python scripts/bench_prefix_cache.py --model embedded --rounds 1 --turns 2 \
    --max-tokens 8 --prompt-tokens 120 --concurrency 1 --requests 1 --out /tmp/prefix_cache_smoke
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_common import ROOT, start_daemon, stop_daemon  # noqa: E402
from mlxd_cli.bench.report import format_spread  # noqa: E402
from mlxd_cli.bench.stats import spread, ttft_speedups  # noqa: E402
from mlxd_cli.bench.targets import ServedTarget  # noqa: E402

SMOLLM2 = ROOT.parent / "shared" / "models" / "smollm2-135m-instruct-q4"
BIN = Path(sys.executable).parent
# (target, versus): the speedups the acceptance asks for, as versus's TTFT / target's TTFT per round.
COMPARISONS = (
    ("cache", "nocache"),
    ("cache_pl", "nocache_pl"),
    ("cache", "mlx_lm"),
    ("cache_pl", "mlx_lm"),
    ("cache_pl", "cache"),
)
NO_CACHE_TARGETS = ("nocache", "nocache_pl")


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(SMOLLM2), help="checkpoint for every server ('embedded' works)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--requests", type=int, default=4, help="sessions per batch (every concurrency level)")
    parser.add_argument("--max-tokens", type=int, default=150)
    parser.add_argument("--prompt-tokens", type=int, default=1200)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmark_results" / "prefix_cache_smollm2")
    return parser.parse_args()


def blas_environment() -> str:
    """The OpenBLAS variables mlxd uses on Linux CPU as NAME=value words, for mlx_lm.server ("" where none apply)."""
    found = subprocess.run([sys.executable, "-m", "mlxd_fast_blas", "--env"], capture_output=True, text=True)
    return found.stdout.strip() if found.returncode == 0 else ""


def bench_command(args: argparse.Namespace, urls: dict[str, str], mlx_lm_model: Path) -> list[str]:
    mlx_lm = f"env {blas_environment()} '{sys.executable}' -m mlx_lm server --model '{mlx_lm_model}' --port {{port}}"
    return [
        str(BIN / "mlx-bench"),
        "--target",
        f"cache={urls['off']}",
        "--target",
        f"nocache={urls['off']}",
        "--target",
        f"cache_pl={urls['on']}",
        "--target",
        f"nocache_pl={urls['on']}",
        "--serve",
        f"mlx_lm={mlx_lm}",
        "--target-model",
        "mlx_lm=default_model",
        *[part for name in NO_CACHE_TARGETS for part in ("--target-no-cache-prompt", name)],
        "--baseline",
        "nocache",
        "--prompt-style",
        "chat",
        "--turns",
        str(args.turns),
        "--concurrency",
        args.concurrency,
        "--requests",
        str(args.requests),
        "--rounds",
        str(args.rounds),
        "--max-tokens",
        str(args.max_tokens),
        "--prompt-tokens",
        str(args.prompt_tokens),
        "--ignore-eos",
        "--warmup",
        "1",
        "--seed",
        "0",
        "--temperature",
        "0",
        "--serve-timeout",
        "300",
        "--out",
        str(args.out),
    ]


def acceptance_section(results: dict, script_command: str) -> str:
    """The figures issue 23 asks for, from mlx-bench's results.json."""
    cells = {(cell["concurrency"], cell["target"]): cell for cell in results["summary"] if cell.get("turns")}
    levels = sorted({level for level, _ in cells})
    lines = [
        "",
        "## Prefix cache: acceptance figures",
        "",
        f"Script: `{script_command}`. Speedup = the other target's TTFT p50 / this target's, per round "
        "(the same sessions at the same turn), median [min-max] over rounds; above 1: this target answers "
        "sooner. The last turn is the one the acceptance names (cache vs no cache at least 3x).",
        "",
        "| c | target | vs | " + " | ".join(f"turn {turn}" for turn in _turns(cells)) + " |",
        "|---|---|---|" + "---|" * len(_turns(cells)),
    ]
    for level in levels:
        for target, versus in COMPARISONS:
            mine, other = cells.get((level, target)), cells.get((level, versus))
            if mine is None or other is None:
                continue
            by_turn = {entry["turn"]: entry for entry in ttft_speedups(mine["turns"], other["turns"])}
            texts = [
                format_spread(by_turn[turn]["ratio"], digits=2) if turn in by_turn and by_turn[turn]["ratio"] else ""
                for turn in _turns(cells)
            ]
            lines.append(f"| {level} | {target} | {versus} | " + " | ".join(texts) + " |")
    lines += [
        "",
        "Aggregate tok/s of the batch of sessions (median [min-max] over rounds):",
        "",
        "| c | " + " | ".join(name for name in _names(results)) + " |",
        "|---|" + "---|" * len(_names(results)),
    ]
    for level in levels:
        row = [
            format_spread(cell["aggregate_tok_s"]) if (cell := _cell(results, level, name)) else ""
            for name in _names(results)
        ]
        lines.append(f"| {level} | " + " | ".join(row) + " |")
    lines += ["", _no_cache_check(cells)]
    return "\n".join(lines) + "\n"


def _turns(cells: dict) -> list[int]:
    return sorted({entry["turn"] for cell in cells.values() for entry in cell["turns"]})


def _names(results: dict) -> list[str]:
    return [target["name"] for target in results["targets"]]


def _cell(results: dict, level: int, name: str) -> dict | None:
    return next((cell for cell in results["summary"] if (cell["concurrency"], cell["target"]) == (level, name)), None)


def _no_cache_check(cells: dict) -> str:
    """Whether the cache_prompt: false targets were served without the cache, from the cached tokens they report."""
    reported = [
        spread_
        for (level, name), cell in cells.items()
        if name in NO_CACHE_TARGETS
        for entry in cell["turns"]
        if (spread_ := entry["cached_tokens_p50"]) is not None
    ]
    if not reported:
        return (
            "Check of cache_prompt: false: the mlxd targets reported no cached-token count, so it could not be "
            "checked from the responses."
        )
    worst = spread(value["max"] for value in reported)["max"]
    if worst > 0:
        return (
            f"WARNING: a cache_prompt: false target reported up to {worst:.0f} cached prompt tokens (median per "
            "batch): the gateway or daemon did not honour cache_prompt: false, so nocache is not a cold baseline."
        )
    return "Check of cache_prompt: false: the nocache targets reported 0 cached prompt tokens at every turn."


def main() -> int:
    args = parse_arguments()
    args.out.mkdir(parents=True, exist_ok=True)
    model = args.model
    scratch = Path(tempfile.mkdtemp(prefix="mlxd-prefix-cache-", dir="/tmp"))
    daemons, gateways = [], []
    try:
        subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "write_cpu_weights_copy.py"), model, str(scratch / "model")],
            check=True,
        )
        urls = {}
        for key, draft_kind in (("off", "none"), ("on", "prompt-lookup")):
            process, endpoint = start_daemon("-m", model, "--draft-kind", draft_kind)
            daemons.append((process, endpoint))
            serve_http = f"'{BIN / 'mlx-serve-http'}' --daemon '{endpoint}' --port {{port}}"
            gateway = ServedTarget(f"gateway-{key}", serve_http)  # its log: OUT/serve-gateway-KEY.log
            gateway.start(args.out, 300.0)
            gateways.append(gateway)
            urls[key] = gateway.url
            print(f"mlxd ({draft_kind}) at {endpoint}, mlx-serve-http at {gateway.url}", file=sys.stderr)
        command = bench_command(args, urls, scratch / "model")
        print(" ".join(command), file=sys.stderr)
        finished = subprocess.run(command)
        if finished.returncode != 0:
            return finished.returncode
    finally:
        for gateway in gateways:
            gateway.stop()
        for process, endpoint in daemons:
            stop_daemon(process, endpoint)
        shutil.rmtree(scratch, ignore_errors=True)
    results = json.loads((args.out / "results.json").read_text())
    section = acceptance_section(results, " ".join(["scripts/bench_prefix_cache.py", *sys.argv[1:]]))
    with open(args.out / "results.md", "a") as markdown:
        markdown.write(section)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
