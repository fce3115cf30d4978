"""B=1 greedy decode speed: mlxd + mlx-generate vs bare loops (model forwards; the engine's forward) vs mlx_lm.generate.

Each round runs every variant once, in turn (interleaved), on the same model and prompt, for the same
number of tokens (end-of-sequence ignored everywhere). Reports decode tok/s (first token excluded)
as median [min-max] over rounds and per-round ratios; then aggregate tok/s at several concurrencies.

Run: .venv/bin/python scripts/bench_decode.py [--model PATH] [--rounds 5] [--max-tokens 256]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mlxd_fast_blas import ensure_fast_blas  # noqa: E402

ensure_fast_blas()

import mlx.core as mx  # noqa: E402

from bench_common import (  # noqa: E402
    ROOT,
    command_line,
    machine_facts,
    ratio_spread,
    spread,
    start_daemon,
    stop_daemon,
)

PROMPT = (
    "The Python standard library contains built-in modules that provide access to system functionality "
    "such as file I/O that would otherwise be inaccessible to Python programmers, as well as modules"
)


def bare_loop(model, prompt: list[int], n: int) -> float:
    """The limit: model forwards with mlx-lm's KV cache, argmax, one step kept in flight."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    y = mx.argmax(model(mx.array([prompt]), cache=cache)[:, -1], axis=-1)
    mx.eval(y)
    started = time.perf_counter()
    for _ in range(n - 1):
        next_y = mx.argmax(model(y[:, None], cache=cache)[:, -1], axis=-1)
        mx.async_eval(next_y)
        y.item()
        y = next_y
    y.item()
    return (n - 1) / (time.perf_counter() - started)


def engine_forward_loop(loaded, prompt: list[int], n: int) -> float:
    """The limit of the daemon's own step: the engine's forward (on the CPU its compiled one-token step over
    slot storage) in a bare loop, argmax, one step kept in flight; no sampler chain, no scheduler."""
    from mlxd_engine import Engine, prefill_and_record

    engine = Engine(loaded, max_sequences=1)
    seq = engine.add_sequence(prompt)
    y = mx.array([prefill_and_record(engine, seq).token])
    started = time.perf_counter()
    for _ in range(n - 1):
        next_y = mx.argmax(engine._forward([seq], y[:, None])[:, -1], axis=-1)
        mx.async_eval(next_y)
        y.item()
        engine.commit_appends(seq, 1)
        y = next_y
    y.item()
    elapsed = time.perf_counter() - started
    engine.release(seq)
    return (n - 1) / elapsed


def mlx_lm_generate(model, tokenizer, prompt: list[int], n: int, eos: frozenset[int]) -> float:
    from mlx_lm import stream_generate

    ids = mx.array(sorted(eos))

    def no_eos(tokens, logits):
        return logits.at[:, ids].add(-1e9)

    last = None
    for response in stream_generate(model, tokenizer, prompt, max_tokens=n, logits_processors=[no_eos]):
        last = response
    assert last.generation_tokens == n, last.generation_tokens
    return last.generation_tps


def mlxd_request(endpoint: str, prompt: str, n: int) -> float:
    """mlxd's decode tok/s for the request mlx-generate sends, through the same client (plus ignore_eos)."""
    from mlxd_protocol import Client, Generate, new_request_id

    with Client(endpoint, timeout_s=300) as client:
        done = list(
            client.generate(Generate(id=new_request_id(), prompt=prompt, chat=False, max_tokens=n, ignore_eos=True))
        )[-1]
    assert done.timings["predicted_n"] == n, done.timings
    return done.timings["predicted_per_second"]


def mlx_generate_process(endpoint: str, prompt: str, n: int) -> float:
    """The real tool, as a user runs it (includes its process start-up in nothing: tok/s is the daemon's)."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlxd_cli.generate",
            "--endpoint",
            endpoint,
            "--no-autostart",
            "--no-chat",
            "--max-tokens",
            str(n),
            "--ignore-eos",
            "--json",
            prompt,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(out.stdout)["timings"]["predicted_per_second"]


async def aggregate(endpoint: str, prompt: str, n: int, concurrency: int) -> float:
    from mlxd_protocol import AsyncClient, Generate, new_request_id

    async with AsyncClient(endpoint, timeout_s=600) as client:

        async def one():
            replies = [
                r
                async for r in client.generate(
                    Generate(id=new_request_id(), prompt=prompt, chat=False, max_tokens=n, ignore_eos=True)
                )
            ]
            return replies[-1].usage["completion_tokens"]

        started = time.perf_counter()
        tokens = await asyncio.gather(*(one() for _ in range(concurrency)))
        return sum(tokens) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--concurrency", default="1,4,8")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmark_results" / "decode_b1.md")
    args = parser.parse_args()

    from mlxd_engine import load
    from mlxd_engine.cpu_fusion import fuse_cpu_layers, fusion_wanted
    from mlxd_engine.fused_blocks import blocks_wanted, fuse_blocks

    loaded = load(args.model)  # stock layers: the bare loop and mlx_lm.generate
    fused = load(args.model)  # a second copy with the layers the daemon's engine fuses (on the CPU)
    fused_count = fuse_cpu_layers(fused.model) if fusion_wanted() else 0
    fused_blocks = fuse_blocks(fused.model) if fusion_wanted() and blocks_wanted() else 0
    model_args = ["-m", args.model or "embedded"]
    prompt_ids = loaded.tokenizer.encode(PROMPT)
    pipelined = start_daemon(*model_args)
    one_step = start_daemon(*model_args, "--decode-steps", "1")
    unpipelined = start_daemon(*model_args, "--no-lookahead")
    names = (
        "bare loop",
        "bare loop, fused layers",
        "engine forward loop",
        "mlx_lm.generate",
        "mlxd (mlx-generate)",
        "mlxd pipelined",
        "mlxd pipelined, 1 step per tick",
        "mlxd unpipelined",
    )
    results: dict[str, list[float]] = {k: [] for k in names}
    levels = [int(c) for c in args.concurrency.split(",")]
    aggregate_results: dict[int, list[float]] = {c: [] for c in levels}
    try:
        # warm-up: compile paths, fill caches
        bare_loop(loaded.model, prompt_ids, 16)
        bare_loop(fused.model, prompt_ids, 16)
        engine_forward_loop(fused, prompt_ids, 16)
        mlx_lm_generate(loaded.model, loaded.tokenizer, prompt_ids, 16, loaded.eos_token_ids)
        for _, endpoint in (pipelined, one_step, unpipelined):
            mlxd_request(endpoint, PROMPT, 16)
        for round_number in range(args.rounds):
            results["bare loop"].append(bare_loop(loaded.model, prompt_ids, args.max_tokens))
            results["bare loop, fused layers"].append(bare_loop(fused.model, prompt_ids, args.max_tokens))
            results["engine forward loop"].append(engine_forward_loop(fused, prompt_ids, args.max_tokens))
            results["mlx_lm.generate"].append(
                mlx_lm_generate(loaded.model, loaded.tokenizer, prompt_ids, args.max_tokens, loaded.eos_token_ids)
            )
            results["mlxd (mlx-generate)"].append(mlx_generate_process(pipelined[1], PROMPT, args.max_tokens))
            results["mlxd pipelined"].append(mlxd_request(pipelined[1], PROMPT, args.max_tokens))
            results["mlxd pipelined, 1 step per tick"].append(mlxd_request(one_step[1], PROMPT, args.max_tokens))
            results["mlxd unpipelined"].append(mlxd_request(unpipelined[1], PROMPT, args.max_tokens))
            for level in levels:
                aggregate_results[level].append(asyncio.run(aggregate(pipelined[1], PROMPT, args.max_tokens, level)))
            print(
                f"round {round_number + 1}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in results.items() if v),
                flush=True,
            )
    finally:
        stop_daemon(*pipelined)
        stop_daemon(*one_step)
        stop_daemon(*unpipelined)
    results["fastest bare loop"] = [max(a, b) for a, b in zip(results["bare loop"], results["bare loop, fused layers"])]

    def ratios(a: str, b: str) -> list[float]:
        return [x / y for x, y in zip(results[a], results[b])]

    lines = [
        "# B=1 greedy decode: mlxd vs the bare loop vs mlx_lm.generate",
        "",
        f"Command: `{command_line()}`",
        "",
        f"Model: `{loaded.path}`; {args.max_tokens} tokens per run (end-of-sequence ignored); {args.rounds} "
        "interleaved rounds; decode tok/s excludes the first token; median [min-max]. mlxd streams chunks to the "
        'client (coalesced, --stream-interval-ms 5); mlx-generate --json asks for no stream. "pipelined" is the '
        'daemon\'s default (ticks chain up to --decode-steps 8 steps in steady decode); "1 step per tick" is '
        '--decode-steps 1; "unpipelined" is --no-lookahead. Every model here is loaded with the CPU weight rule '
        f"({loaded.weights}). The loops in this process run the library's BLAS threads; each daemon chooses its own "
        "count by timing decode steps at start-up and whether a lone row's step runs compiled "
        "(daemon/mlxd_daemon/step_tuning.py). "
        f"On the CPU the daemon's engine fuses the model's RMSNorm and RoPE layers ({fused_count} modules here; "
        f"packages/mlxd_engine/cpu_fusion.py) and runs llama-style layers as two ops ({fused_blocks} layers here; "
        "packages/mlxd_engine/fused_blocks.py); the bare loop and mlx_lm.generate run the stock layers, and the "
        '"fused layers" bare loop runs the same fused layers as the daemon; "fastest bare loop" is the faster '
        'of the two in each round. The "engine forward loop" is the '
        "daemon's own forward in a bare loop: on the CPU the engine runs a lone row's decode step as one "
        "compiled graph "
        "(packages/mlxd_engine/compiled_decode.py), so it is the "
        "limit for the daemon's step, and the model-forward loops are the limit the model sets without it.",
        "",
        "Machine: " + ", ".join(f"{k} {v}" for k, v in machine_facts().items()),
        "",
        "| variant | decode tok/s |",
        "|---|---|",
    ]
    lines += [f"| {name} | {spread(values)} |" for name, values in results.items()]
    lines += [
        "",
        "| ratio (per round) | median [min-max] |",
        "|---|---|",
        f"| mlxd pipelined / fastest bare loop | {ratio_spread(ratios('mlxd pipelined', 'fastest bare loop'))} |",
        "| mlxd (mlx-generate) / fastest bare loop "
        f"| {ratio_spread(ratios('mlxd (mlx-generate)', 'fastest bare loop'))} |",
        f"| mlxd pipelined / mlx_lm.generate | {ratio_spread(ratios('mlxd pipelined', 'mlx_lm.generate'))} |",
        f"| mlxd (mlx-generate) / mlx_lm.generate | {ratio_spread(ratios('mlxd (mlx-generate)', 'mlx_lm.generate'))} |",
        f"| mlxd pipelined / engine forward loop | {ratio_spread(ratios('mlxd pipelined', 'engine forward loop'))} |",
        "| engine forward loop / bare loop, fused layers "
        f"| {ratio_spread(ratios('engine forward loop', 'bare loop, fused layers'))} |",
        f"| mlxd pipelined / mlxd unpipelined | {ratio_spread(ratios('mlxd pipelined', 'mlxd unpipelined'))} |",
        "| mlxd pipelined / mlxd pipelined, 1 step per tick "
        f"| {ratio_spread(ratios('mlxd pipelined', 'mlxd pipelined, 1 step per tick'))} |",
        "",
        "Aggregate output tok/s, concurrent requests to one pipelined mlxd (same prompt, same length):",
        "",
        "| concurrency | aggregate tok/s |",
        "|---|---|",
    ]
    lines += [f"| {level} | {spread(values)} |" for level, values in aggregate_results.items()]
    text = "\n".join(lines) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    args.out.with_suffix(".json").write_text(
        json.dumps(
            {
                "results": results,
                "aggregate": aggregate_results,
                "median": {k: statistics.median(v) for k, v in results.items() if v},
            },
            indent=2,
        )
        + "\n"
    )
    print(text)


if __name__ == "__main__":
    main()
