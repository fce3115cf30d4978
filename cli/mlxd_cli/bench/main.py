"""``mlx-bench``: serving benchmark of mlxd and other OpenAI-compatible servers, side by side in one run.

    mlx-bench --target NAME=http://HOST:PORT | --target NAME=daemon:ENDPOINT | --serve NAME='CMD {port}' ...
              [--baseline NAME] [--concurrency 1,4,8] [--requests N | --duration S] [--rounds R]
              [--prompt-style plain,copy,chat,extract,agent] [--turns N] [--prompt-tokens N] [--max-tokens N]
              [--warmup N] [--seed S] [--temperature T] [--chat/--no-chat] [--ignore-eos] [--api-key KEY] [--model NAME]
              [--target-model NAME=MODEL] [--no-cache-prompt] [--target-no-cache-prompt NAME]
              [--serve-timeout S] [--request-timeout S] [--out DIR]

Targets run in this order: every ``--target`` as given, then every ``--serve`` as given; ratios are
against ``--baseline`` (default: the first). Each round runs, for each concurrency level and prompt
style, one batch on each target in turn. Progress goes to stderr, the table to stdout; ``--out DIR``
writes results.json (with every request sample), results.md and PNG plots. Exit status: 0 after a run
(failed requests are counted, not fatal), 1 when a target cannot be reached or started, 130 on Ctrl-C.

``--prompt-style chat`` runs multi-turn sessions (``--turns``, default 4): each "request" of a batch is a
session whose turns resend the whole history (system message, the notes, every reply and question so far);
a second table shows TTFT per turn, prompt and cached tokens. Turn 1 is about ``--prompt-tokens`` tokens
and each later turn adds up to ``--max-tokens`` + ~20; ``--prompt-tokens 1000 --max-tokens 150
--ignore-eos`` gives about 1.5K estimated tokens of history at turn 4 (SmolLM2 counts ~15% fewer:
use 1200). ``--no-cache-prompt`` sends ``cache_prompt: false`` (llama-server's and mlxd's switch for
their prompt cache) with every request; ``--target-no-cache-prompt NAME`` with that target's only, so one
server can be measured with and without its cache in one run (two ``--target`` names on the same URL).

``--prompt-style extract`` and ``agent`` are workloads where drafting from earlier requests pays (mlxd's
shared draft store): every request returns a record as JSON in one shape no prompt shows, or makes a coding
agent's next tool call, repeating calls earlier sessions made (``bench/task_prompts.py``).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from .prompts import PROMPT_STYLES, PromptBook
from .report import build_results, command_line, machine_facts, rich_table, turn_table, write_outputs
from .runner import BatchRecord, BenchConfig, ProgressHooks, run_benchmark
from .targets import ServedTarget, TargetUnavailable, parse_target


def _comma_list(values: tuple[str, ...] | str) -> list[str]:
    items = [values] if isinstance(values, str) else list(values)
    return [part.strip() for item in items for part in item.split(",") if part.strip()]


def _parse_concurrency(ctx, param, value: str) -> list[int]:
    try:
        levels = [int(part) for part in _comma_list(value)]
    except ValueError:
        raise click.BadParameter(f"expected a comma list of integers, got {value!r}") from None
    if not levels or min(levels) < 1:
        raise click.BadParameter("concurrency levels must be >= 1")
    return list(dict.fromkeys(levels))


def _parse_styles(ctx, param, value: tuple[str, ...]) -> list[str]:
    styles = list(dict.fromkeys(_comma_list(value) or ["plain"]))
    unknown = [style for style in styles if style not in PROMPT_STYLES]
    if unknown:
        raise click.BadParameter(f"unknown style(s) {', '.join(unknown)}; choose from {', '.join(PROMPT_STYLES)}")
    return styles


def _split_named(spec: str, option: str) -> tuple[str, str]:
    name, sep, value = spec.partition("=")
    if not sep or not name.strip() or not value.strip():
        raise click.UsageError(f"{option} expects NAME=VALUE, got {spec!r}")
    return name.strip(), value.strip()


def build_targets(
    target_specs, serve_specs, api_key, model, target_model_specs=(), no_cache_prompt=False, no_cache_prompt_names=()
) -> list:
    """Targets from the command line: ``--target`` ones in order, then ``--serve`` ones.

    Args:
        target_specs: ``NAME=URL`` / ``NAME=daemon:ENDPOINT`` strings.
        serve_specs: ``NAME=COMMAND`` strings (COMMAND holds ``{port}``).
        api_key: For HTTP targets.
        model: The ``model`` field for HTTP targets.
        target_model_specs: ``NAME=MODEL`` strings: the ``model`` field for one target, overriding ``model``.
        no_cache_prompt: Send ``cache_prompt: false`` with every target's requests.
        no_cache_prompt_names: Targets that send ``cache_prompt: false`` (the others send nothing).

    Returns:
        Target objects (served ones not started yet).

    Raises:
        click.UsageError: A malformed spec, a duplicate name, or no target at all.
    """
    models = dict(_split_named(spec, "--target-model") for spec in target_model_specs)
    targets = []
    for spec in target_specs:
        name, value = _split_named(spec, "--target")
        try:
            targets.append(parse_target(name, value, api_key, models.get(name, model)))
        except ValueError as error:
            raise click.UsageError(str(error)) from None
    for spec in serve_specs:
        name, command = _split_named(spec, "--serve")
        if "{port}" not in command:
            raise click.UsageError(f"--serve {name}: the command must contain {{port}}")
        targets.append(ServedTarget(name, command, api_key, models.get(name, model)))
    names = [target.name for target in targets]
    unknown = sorted(set(models) - set(names))
    if unknown:
        raise click.UsageError(f"--target-model names no target: {', '.join(unknown)}")
    unknown = sorted(set(no_cache_prompt_names) - set(names))
    if unknown:
        raise click.UsageError(f"--target-no-cache-prompt names no target: {', '.join(unknown)}")
    for target in targets:
        if no_cache_prompt or target.name in no_cache_prompt_names:
            target.cache_prompt = False
    if not targets:
        raise click.UsageError("give at least one --target or --serve")
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise click.UsageError(f"target names must be unique: {', '.join(duplicates)}")
    return targets


class RichProgress(ProgressHooks):
    """Live display: one bar for all batches, one for the running batch, a line per finished batch."""

    def __init__(self, progress: Progress, total_batches: int) -> None:
        self.progress = progress
        self.overall = progress.add_task("batches", total=total_batches)
        self.current = progress.add_task("starting", total=None)
        self.label = ""

    def batch_started(self, label: str, requests: int | None) -> None:
        self.label = label
        self.progress.reset(self.current, total=requests, description=label)

    def request_finished(self, sample) -> None:
        self.progress.advance(self.current)

    def batch_finished(self, batch: BatchRecord | None) -> None:
        if batch is None:
            return
        self.progress.advance(self.overall)
        summary = batch.summary
        aggregate = summary["aggregate_tok_s"]
        ttft = summary["ttft_p50_s"]
        self.progress.console.print(
            f"{self.label}: {'-' if aggregate is None else f'{aggregate:.1f}'} tok/s, "
            f"TTFT p50 {'-' if ttft is None else f'{ttft * 1000:.0f}'} ms, "
            f"errors {summary['errors']}/{summary['requests']}",
            highlight=False,
        )


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--target",
    "target_specs",
    multiple=True,
    metavar="NAME=URL|NAME=daemon:ENDPOINT",
    help="an OpenAI-compatible base URL, or an mlxd endpoint (repeatable)",
)
@click.option(
    "--serve",
    "serve_specs",
    multiple=True,
    metavar="NAME=COMMAND",
    help="start this server for the run; {port} in COMMAND becomes a free loopback port (repeatable)",
)
@click.option("--baseline", default=None, help="target the ratios divide by (default: the first)")
@click.option(
    "--concurrency",
    "concurrencies",
    default="1,4,8",
    show_default=True,
    callback=_parse_concurrency,
    help="comma list of concurrency levels",
)
@click.option(
    "--requests",
    default=None,
    type=click.IntRange(1),
    help="requests per batch (per concurrency level, style, target and round) [default: 2 x concurrency]",
)
@click.option(
    "--duration",
    default=None,
    type=click.FloatRange(0, min_open=True),
    help="seconds per batch instead of a request count",
)
@click.option("--max-tokens", default=128, show_default=True, type=click.IntRange(1))
@click.option(
    "--prompt-tokens",
    default=200,
    show_default=True,
    type=click.IntRange(1),
    help="approximate length of the synthetic paragraph, in tokens",
)
@click.option(
    "--prompt-style",
    "styles",
    multiple=True,
    callback=_parse_styles,
    help="plain, copy, chat (multi-turn sessions), extract (records as JSON of one shape) or agent (steps of "
    "a coding agent's loop); repeatable or a comma list [default: plain]",
)
@click.option(
    "--turns",
    default=4,
    show_default=True,
    type=click.IntRange(1),
    help="chat style: turns per session (each resends the history plus the last reply)",
)
@click.option("--rounds", default=3, show_default=True, type=click.IntRange(1))
@click.option(
    "--warmup",
    default=1,
    show_default=True,
    type=click.IntRange(0),
    help="unmeasured requests per target and prompt style",
)
@click.option("--seed", default=0, show_default=True, type=click.IntRange(0), help="prompts and sampling seed")
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(0))
@click.option(
    "--chat/--no-chat",
    default=True,
    show_default=True,
    help="/v1/chat/completions, or /v1/completions with the raw prompt",
)
@click.option("--ignore-eos", is_flag=True, help="ask servers to generate max-tokens tokens (ignore_eos)")
@click.option("--api-key", default=None, envvar="MLX_BENCH_API_KEY", help="Bearer token for HTTP targets")
@click.option("--model", default=None, help="the model field to send (default: the first id of /v1/models)")
@click.option(
    "--target-model",
    "target_model_specs",
    multiple=True,
    metavar="NAME=MODEL",
    help="the model field for one target (repeatable); e.g. mlx_lm.server lists its HF cache "
    "before its --model, so give it NAME=default_model",
)
@click.option(
    "--no-cache-prompt",
    is_flag=True,
    help="send cache_prompt: false (skip the server's prompt cache: llama-server, mlxd) with every request",
)
@click.option(
    "--target-no-cache-prompt",
    "no_cache_prompt_names",
    multiple=True,
    metavar="NAME",
    help="send cache_prompt: false with this target's requests only (repeatable)",
)
@click.option(
    "--serve-timeout",
    default=300.0,
    show_default=True,
    type=click.FloatRange(0, min_open=True),
    help="seconds to wait for a --serve server to answer /v1/models",
)
@click.option(
    "--request-timeout",
    default=600.0,
    show_default=True,
    type=click.FloatRange(0, min_open=True),
    help="seconds before a request counts as a timeout error",
)
@click.option(
    "--out",
    default=None,
    type=click.Path(file_okay=False, path_type=Path),
    help="write results.json, results.md and PNG plots here",
)
def main(
    target_specs,
    serve_specs,
    baseline,
    concurrencies,
    requests,
    duration,
    max_tokens,
    prompt_tokens,
    styles,
    turns,
    rounds,
    warmup,
    seed,
    temperature,
    chat,
    ignore_eos,
    api_key,
    model,
    target_model_specs,
    no_cache_prompt,
    no_cache_prompt_names,
    serve_timeout,
    request_timeout,
    out,
):
    """Benchmark serving targets side by side, interleaved over rounds."""
    if requests is not None and duration is not None:
        raise click.UsageError("give --requests or --duration, not both")
    if "chat" in styles and not chat:
        raise click.UsageError("--prompt-style chat sends messages: it needs the chat endpoint, not --no-chat")
    targets = build_targets(
        target_specs, serve_specs, api_key, model, target_model_specs, no_cache_prompt, no_cache_prompt_names
    )
    names = [target.name for target in targets]
    baseline = baseline or names[0]
    if baseline not in names:
        raise click.UsageError(f"--baseline {baseline!r} is not a target ({', '.join(names)})")
    config = BenchConfig(
        concurrencies=concurrencies,
        styles=styles,
        rounds=rounds,
        requests=requests,
        duration_s=duration,
        max_tokens=max_tokens,
        prompt_tokens=prompt_tokens,
        warmup=warmup,
        seed=seed,
        temperature=temperature,
        chat=chat,
        ignore_eos=ignore_eos,
        request_timeout_s=request_timeout,
        turns=turns,
    )
    command = command_line()
    err = Console(stderr=True)
    served = [target for target in targets if isinstance(target, ServedTarget)]
    try:
        if served:
            log_dir = out or Path(tempfile.mkdtemp(prefix="mlx-bench-"))
            log_dir.mkdir(parents=True, exist_ok=True)
            for target in served:
                err.print(f"starting {target.name}: {target.command_template}", highlight=False)
                target.start(log_dir, serve_timeout)
                err.print(f"{target.name} ready at {target.url} (log {target.log_path})", highlight=False)
        total_batches = rounds * len(concurrencies) * len(styles) * len(targets)
        with Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err,
        ) as progress:
            run = asyncio.run(
                run_benchmark(targets, config, PromptBook(seed, prompt_tokens), RichProgress(progress, total_batches))
            )
    except TargetUnavailable as error:
        click.echo(f"mlx-bench: {error}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo("mlx-bench: interrupted", err=True)
        sys.exit(130)
    finally:
        for target in served:
            target.stop()
    results = build_results(run, config, baseline, command, machine_facts())
    console = Console()
    if not console.is_terminal:
        console.width = max(console.width, 200)  # piped into a file: the whole table, unwrapped
    console.print(rich_table(results))
    per_turn = turn_table(results)
    if per_turn is not None:
        console.print(per_turn)
    if out is not None:
        for path in write_outputs(results, out):
            err.print(f"wrote {path}", highlight=False)


if __name__ == "__main__":
    main()
