"""Reports of mlx-bench: the results dict, the rich table, results.md, results.json and PNG plots.

Contract:
    * ``build_results`` turns a ``RunRecord`` into one JSON-ready dict: the exact command line, the
      machine (``machine_facts``), the configuration, the targets, the order batches ran in, the
      per-cell summary (style x concurrency x target: medians and min-max over rounds), the ratios of
      aggregate tok/s vs the baseline per round, every batch with all its raw request samples, and the
      warm-up samples. Every other function here reads only that dict, so a saved results.json can be
      re-rendered.
    * ``machine_facts`` never imports mlx: the MLX version comes from package metadata, BLAS from
      ``mlxd_fast_blas.preload_value()`` ("n/a" when none applies).
    * ``write_outputs(results, out_dir)`` writes results.json, results.md and, with matplotlib (``plots``:
      imported there only, with the Agg backend), throughput.png (aggregate tok/s vs concurrency per target, one
      panel per prompt style, min-max error bars) and speedup.png (each target vs the baseline; only
      with two targets or more); with chat sessions also ttft_per_turn.png (TTFT p50 per turn, one panel
      per concurrency level, min-max error bars).
    * Chat sessions: ``turn_rows`` / ``turn_table`` and a results.md section give, per concurrency x
      target x turn, TTFT p50 (median [min-max] over rounds) and p95, the TTFT speedup vs the baseline
      per round (baseline TTFT / target TTFT; above 1: faster than the baseline), the median prompt tokens
      and the median cached tokens the server reported (blank: not reported).
    * Blank cells mean "not reported" (e.g. no draft counts from a server without the timings extension).
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import sys
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from .plots import write_plots
from .prompts import chat_history_tokens
from .stats import ratio_rows, summarize_cells


def machine_facts() -> dict[str, Any]:
    """What the run ran on, without importing mlx.

    Returns:
        ``cpu`` (model name), ``cores``, ``memory``, ``mlx`` (version or "not installed"), ``blas``
        (the OpenBLAS preload value or "n/a"), ``python``, ``platform``, ``scheduling`` (``scheduling_policy``).
    """
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware")):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import psutil

        memory = f"{psutil.virtual_memory().total / 2**30:.1f} GiB"
    except ImportError:
        memory = "unknown"
    try:
        mlx_version = importlib.metadata.version("mlx")
    except importlib.metadata.PackageNotFoundError:
        mlx_version = "not installed"
    try:
        from mlxd_fast_blas import preload_value

        blas = preload_value() or "n/a"
    except ImportError:
        blas = "n/a"
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory": memory,
        "mlx": mlx_version,
        "blas": blas,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "scheduling": scheduling_policy(),
    }


# Linux's real-time policies, by the numbers os.sched_getscheduler returns
_REALTIME_POLICIES = {getattr(os, name, -1): label for name, label in (("SCHED_FIFO", "fifo"), ("SCHED_RR", "rr"))}


def scheduling_policy() -> str:
    """How this process (and the servers it starts, which inherit it) is scheduled: "normal", or a real-time
    policy and priority such as "fifo 1" (``chrt -f 1``). Under a real-time policy a server whose threads spin
    between ops keeps its HTTP thread and the client from running until a generation ends, so its TTFT and ITL
    read as one burst (docs/benchmark_results/code_notes.md#stream-chunks); aggregate tok/s is not affected.
    "n/a" where the platform cannot say."""
    try:
        policy = os.sched_getscheduler(0)
        priority = os.sched_getparam(0).sched_priority
    except (AttributeError, OSError):
        return "n/a"
    label = _REALTIME_POLICIES.get(policy)
    return f"{label} {priority}" if label else "normal"


def command_line(argv: list[str] | None = None) -> str:
    """The command line as typed, program name shortened to its file name.

    Args:
        argv: Defaults to ``sys.argv``.

    Returns:
        A shell-quoted command line (``python -m mlxd_cli.bench.main ...`` when run that way).
    """
    argv = list(sys.argv if argv is None else argv)
    if not argv:
        return "mlx-bench"
    program = Path(argv[0])
    if program.name == "main.py" and program.parent.name == "bench":
        return shlex.join(["python", "-m", "mlxd_cli.bench.main", *argv[1:]])
    return shlex.join([program.name, *argv[1:]])


def build_results(run: Any, config: Any, baseline: str, command: str, machine: dict[str, Any]) -> dict[str, Any]:
    """Everything about a run as one JSON-ready dict (see the module docstring).

    Args:
        run: The ``RunRecord``.
        config: The ``BenchConfig``.
        baseline: Name of the target the ratios divide by.
        command: The command line.
        machine: ``machine_facts()``.

    Returns:
        The results dict.
    """
    names = [target["name"] for target in run.targets]
    cells = summarize_cells(run.batches, names)
    return {
        "format": "mlx-bench results 2",  # 2: warm-up requests of every prompt style
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": command,
        "machine": machine,
        "config": dataclasses.asdict(config),
        "targets": run.targets,
        "baseline": baseline,
        "order": [list(entry) for entry in run.order],
        "summary": cells,
        "ratios": ratio_rows(cells, baseline),
        "batches": [dataclasses.asdict(batch) for batch in run.batches],
        "warmup_samples": [dataclasses.asdict(sample) for sample in run.warmup_samples],
    }


# ---- formatting ------------------------------------------------------------------------------------


def format_spread(spread: dict | None, digits: int = 1, scale: float = 1.0) -> str:
    """``median [min-max]``, or "" for None.

    Args:
        spread: ``stats.spread`` output.
        digits: Decimals.
        scale: Multiplier (1000 for seconds to ms).

    Returns:
        The text.
    """
    if not spread:
        return ""
    values = [spread[key] * scale for key in ("median", "min", "max")]
    return f"{values[0]:.{digits}f} [{values[1]:.{digits}f}-{values[2]:.{digits}f}]"


def _median(spread: dict | None, scale: float = 1.0, digits: int = 1) -> str:
    return "" if not spread else f"{spread['median'] * scale:.{digits}f}"


def _pair(cell: dict, low: str, high: str, scale: float, digits: int) -> str:
    first, second = _median(cell[low], scale, digits), _median(cell[high], scale, digits)
    return f"{first} / {second}" if first or second else ""


def _acceptance(cell: dict) -> str:
    if cell.get("drafted") is None:
        return ""
    text = f"{cell.get('accepted') or 0}/{cell['drafted']}"
    if cell.get("accepted_per_verify"):
        text += f" ({cell['accepted_per_verify']['median']:.2f}/verify)"
    return text


def _ratio_lookup(results: dict) -> dict[tuple, dict]:
    return {(row["style"], row["concurrency"], row["target"]): row for row in results["ratios"]}


def summary_rows(results: dict) -> list[list[str]]:
    """The main table's rows as text.

    Args:
        results: ``build_results`` output.

    Returns:
        One list of cells per style x concurrency x target, matching ``SUMMARY_HEADERS``.
    """
    ratios = _ratio_lookup(results)
    rows = []
    for cell in results["summary"]:
        ratio = ratios.get((cell["style"], cell["concurrency"], cell["target"]))
        versus = "1 (baseline)" if cell["target"] == results["baseline"] else ""
        rows.append(
            [
                cell["style"],
                str(cell["concurrency"]),
                cell["target"],
                format_spread(cell["aggregate_tok_s"]),
                format_spread(ratio["ratio"], digits=2) if ratio else versus,
                format_spread(cell["decode_tok_s"]),
                _pair(cell, "ttft_p50_s", "ttft_p95_s", 1000.0, 0),
                _pair(cell, "itl_p50_s", "itl_p95_s", 1000.0, 1),
                _pair(cell, "latency_p50_s", "latency_p95_s", 1.0, 2),
                f"{cell['errors'] or 0}/{cell['requests'] or 0}",
                _acceptance(cell),
            ]
        )
    return rows


SUMMARY_HEADERS = [
    "style",
    "c",
    "target",
    "aggregate tok/s",
    "vs baseline",
    "decode tok/s",
    "TTFT p50/p95 ms",
    "ITL p50/p95 ms",
    "latency p50/p95 s",
    "errors",
    "accepted/drafted",
]


TURN_HEADERS = [
    "style",
    "c",
    "target",
    "turn",
    "TTFT p50 ms",
    "TTFT p95 ms",
    "TTFT speedup vs baseline",
    "prompt tokens",
    "cached tokens",
    "errors",
]


def _whole(spread: dict | None) -> str:
    return "" if not spread else f"{spread['median']:.0f}"


def turn_rows(results: dict) -> list[list[str]]:
    """The per-turn table's rows (chat sessions only), matching ``TURN_HEADERS``.

    Args:
        results: ``build_results`` output.

    Returns:
        One list of cells per style x concurrency x target x turn; empty without chat sessions.
    """
    speedups = {
        key: {entry["turn"]: entry for entry in row.get("turns", [])} for key, row in _ratio_lookup(results).items()
    }
    rows = []
    for cell in results["summary"]:
        key = (cell["style"], cell["concurrency"], cell["target"])
        for entry in cell.get("turns") or []:
            speedup = speedups.get(key, {}).get(entry["turn"])
            versus = "1 (baseline)" if cell["target"] == results["baseline"] else ""
            rows.append(
                [
                    cell["style"],
                    str(cell["concurrency"]),
                    cell["target"],
                    str(entry["turn"]),
                    format_spread(entry["ttft_p50_s"], digits=0, scale=1000.0),
                    _median(entry["ttft_p95_s"], 1000.0, 0),
                    format_spread(speedup["ratio"], digits=2) if speedup and speedup["ratio"] else versus,
                    _whole(entry["prompt_tokens_p50"]),
                    _whole(entry["cached_tokens_p50"]),
                    f"{entry['errors']}/{entry['requests']}",
                ]
            )
    return rows


def turn_table(results: dict) -> Table | None:
    """TTFT per turn of the chat sessions, or None when the run had none.

    Args:
        results: ``build_results`` output.

    Returns:
        A ``rich.table.Table`` or None.
    """
    rows = turn_rows(results)
    if not rows:
        return None
    table = Table(
        title=Text(
            f"chat sessions, per turn: median [min-max] over {results['config']['rounds']} "
            f"rounds; speedup = {results['baseline']} TTFT / target TTFT"
        )
    )
    for header in TURN_HEADERS:
        table.add_column(header, justify="left" if header in ("style", "target") else "right")
    previous = None
    for row in rows:
        if previous is not None and row[:3] != previous:
            table.add_section()
        previous = row[:3]
        table.add_row(*(Text(cell) for cell in row))
    return table


def rich_table(results: dict) -> Table:
    """The end-of-run table.

    Args:
        results: ``build_results`` output.

    Returns:
        A ``rich.table.Table``.
    """
    table = Table(
        title=Text(
            f"mlx-bench: median [min-max] over {results['config']['rounds']} rounds; baseline {results['baseline']}"
        )
    )
    for header in SUMMARY_HEADERS:
        table.add_column(header, justify="left" if header in ("style", "target") else "right")
    previous = None
    for row in summary_rows(results):
        if previous is not None and row[:2] != previous:
            table.add_section()
        previous = row[:2]
        table.add_row(*(Text(cell) for cell in row))  # literal text: no rich markup
    return table


def _markdown_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    def escape(text: str) -> str:
        return str(text).replace("|", "\\|")

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(escape(cell) for cell in row) + " |" for row in rows]
    return lines


def markdown(results: dict, plots: list[str] | tuple[str, ...] = ()) -> str:
    """results.md: command, machine, settings, the main table, then the ratio tables and the plots.

    Args:
        results: ``build_results`` output.
        plots: File names of plots beside results.md, linked at the end.

    Returns:
        Markdown text.
    """
    config = results["config"]
    per_batch = (
        f"{config['duration_s']:g} s per batch"
        if config.get("duration_s") is not None
        else f"{config['requests'] or '2 x concurrency'} requests per batch"
    )
    lines = [
        "# mlx-bench results",
        "",
        f"Command: `{results['command']}`",
        "",
        "Machine: " + ", ".join(f"{key} {value}" for key, value in results["machine"].items()),
        "",
        f"Settings: {config['rounds']} rounds (targets interleaved in each), {per_batch}, "
        f"{config['warmup']} warm-up request(s) per target{_warmup_scope(results)}, max tokens {config['max_tokens']}, "
        f"prompt ~{config['prompt_tokens']} tokens, temperature {config['temperature']:g}, seed {config['seed']}, "
        f"{'chat' if config['chat'] else 'completions'} endpoint, ignore_eos {config['ignore_eos']}. "
        f"Created {results['created']}.",
        "",
        *_chat_settings(config),
        "Targets:",
        "",
    ]
    for target in results["targets"]:
        where = target.get("command") or target.get("url") or target.get("endpoint")
        lines.append(f"- **{target['name']}** ({target['kind']}): `{where}`; model `{target.get('model')}`")
    lines += [
        "",
        "Aggregate tok/s = completion tokens of a batch / its wall time; decode tok/s = per request "
        "(tokens - 1) / (last - first token time), median of the batch; TTFT, ITL (gaps between streamed "
        "chunks) and latency are p50 / p95 of each batch; every figure is the median [min-max] over rounds "
        "(p50/p95 columns: medians). Errors: failed / sent. accepted/drafted: draft tokens summed over "
        "rounds, from the server's timings (blank when not reported).",
        "",
    ]
    lines += _markdown_table(SUMMARY_HEADERS, summary_rows(results))
    if results["ratios"]:
        lines += [
            "",
            f"## Aggregate tok/s relative to {results['baseline']}",
            "",
            "Ratio of each round's aggregate tok/s to the baseline's in the same round; median [min-max] over rounds.",
            "",
        ]
        rows = [
            [
                row["style"],
                str(row["concurrency"]),
                row["target"],
                format_spread(row["ratio"], digits=3),
                ", ".join("" if value is None else f"{value:.3f}" for value in row["per_round"]),
            ]
            for row in results["ratios"]
        ]
        lines += _markdown_table(["style", "c", "target", f"/ {results['baseline']}", "per round"], rows)
    rows = turn_rows(results)
    if rows:
        lines += [
            "",
            "## Chat sessions: TTFT per turn",
            "",
            "Each session is one worker's turns, one after the other; turn t resends the whole history. "
            "TTFT p50 of each batch's turn t, median [min-max] over rounds (p95: median); speedup = "
            f"{results['baseline']}'s TTFT p50 / the target's, per round, median [min-max]; prompt and "
            "cached tokens: medians as the server reported them (cached: "
            "usage.prompt_tokens_details.cached_tokens, usage.cached_tokens or timings.cache_n; blank "
            "when not reported). Aggregate tok/s of the chat rows above is the whole batch of sessions.",
            "",
        ]
        lines += _markdown_table(TURN_HEADERS, rows)
    if plots:
        lines += [""] + [f"![{Path(name).stem}]({name})" for name in plots]
    return "\n".join(lines) + "\n"


def _warmup_scope(results: dict) -> str:
    """Format 1 runs warmed up with their first prompt style only."""
    return " (first prompt style only)" if results.get("format") == "mlx-bench results 1" else " and prompt style"


def _chat_settings(config: dict) -> list[str]:
    if "chat" not in config["styles"]:
        return []
    turns = config.get("turns", 4)
    estimate = chat_history_tokens(config["prompt_tokens"], config["max_tokens"], turns)
    return [
        f"Chat sessions: {turns} turns each; {config['requests'] or '2 x concurrency'} sessions per batch "
        f"unless timed; history at turn {turns} about {estimate} tokens when every reply is "
        f"{config['max_tokens']} tokens long (prompt tokens per turn below are what servers reported).",
        "",
    ]


def write_outputs(results: dict, out_dir: Path) -> list[Path]:
    """Write results.json, results.md and the plots.

    Args:
        results: ``build_results`` output.
        out_dir: Destination directory (created when missing).

    Returns:
        The files written.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "results.json"
    json_path.write_text(json.dumps(results, indent=1) + "\n")
    plots = write_plots(results, out_dir)
    markdown_path = out_dir / "results.md"
    markdown_path.write_text(markdown(results, [plot.name for plot in plots]))
    return [json_path, markdown_path, *plots]
