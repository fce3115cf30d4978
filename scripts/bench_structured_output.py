"""Structured output (issue 24): what the grammar mask costs, and constrained vs free decode in the daemon.

(a) mask cost per token, in this process: llguidance's mask for each position of a reference JSON reply
    (SmolLM2's tokenizer by default), and the mask applied to the logits, in ms per token;
(b) decode tok/s, constrained (response JSON schema) vs free, at B=1 and with 8 concurrent requests;
(c) JSON extraction ("return these fields as JSON", values copied from the prompt), constrained, with
    prompt lookup on vs off: tok/s, and drafts accepted.
One daemon serves every variant (speculation is chosen per request); every round runs each variant once,
interleaved, in alternating order. Median [min-max] over rounds; ratios per round.

Run: .venv/bin/python scripts/bench_structured_output.py [--model PATH] [--rounds 3] [--tokens 128]
Smallest check: --model embedded --rounds 1 --tokens 16
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

ensure_fast_blas()

from bench_common import (  # noqa: E402
    ROOT,
    command_line,
    machine_facts,
    ratio_spread,
    spread,
    start_daemon,
    stop_daemon,
)
from mlxd_protocol import AsyncClient, Constraint, Generate, Speculative, new_request_id  # noqa: E402

SMOLLM2 = ROOT.parent / "shared" / "models" / "smollm2-135m-instruct-q4"
# long enough to run to --tokens: a list of records
LIST_SCHEMA = {
    "type": "object",
    "required": ["people"],
    "properties": {
        "people": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "city", "age"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "maxLength": 30},
                    "city": {"type": "string", "maxLength": 30},
                    "age": {"type": "integer", "minimum": 0, "maximum": 120},
                },
            },
        }
    },
}
RECORDS = [
    ("Alice Smith", "Paris", 34),
    ("Bob Jones", "Berlin", 51),
    ("Chen Wei", "Shanghai", 27),
    ("Dana Levi", "Haifa", 45),
    ("Emil Novak", "Prague", 38),
    ("Fatima Zahra", "Rabat", 29),
]
EXTRACTION_TEXT = "Return these fields as JSON, a list of people with name, city and age: " + "; ".join(
    f"name {name}, city {city}, age {age}" for name, city, age in RECORDS
)
FREE_PROMPT = "Write a short story about a robot who learns to paint."


def reference_reply() -> str:
    return json.dumps({"people": [{"name": n, "city": c, "age": a} for n, c, a in RECORDS]})


def mask_cost(model: str) -> dict:
    """(a): ms per token for the mask alone and for mask + apply, walking the reference reply."""
    import mlx.core as mx

    from mlxd_engine import EMBEDDED_ALIASES, compile_grammar, embedded_model_path, load

    loaded = load(embedded_model_path() if model in EMBEDDED_ALIASES else model)
    grammar = compile_grammar(loaded, "json_schema", json.dumps(LIST_SCHEMA))
    tokens = loaded.tokenizer.encode(reference_reply(), add_special_tokens=False)
    stage = grammar.start()
    output: list[int] = []
    stage.follow(output, 0)
    logits = mx.zeros((1, loaded.vocab_size))
    mask_ms, apply_ms = [], []
    for token in tokens:
        started = time.perf_counter()
        mask = stage.allowed_mask()
        mask_ms.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        mx.eval(mx.where(mask, logits, -mx.inf))
        apply_ms.append((time.perf_counter() - started) * 1000)
        output.append(token)
    return {
        "tokens": len(tokens),
        "mask_ms_median": statistics.median(mask_ms),
        "mask_ms_mean": statistics.mean(mask_ms),
        "mask_ms_max": max(mask_ms),
        "apply_ms_median": statistics.median(apply_ms),
    }


def request(text: str, tokens: int, constrained: bool, speculative: str = "none") -> Generate:
    constraint = Constraint(kind="json_schema", text=json.dumps(LIST_SCHEMA)) if constrained else None
    return Generate(
        id=new_request_id(),
        messages=[{"role": "user", "content": text}],
        max_tokens=tokens,
        stream=False,
        constraint=constraint,
        speculative=Speculative(kind=speculative),
    )


async def run_batch(endpoint: str, requests: list[Generate]) -> dict:
    async with AsyncClient(endpoint, timeout_s=600) as client:

        async def one(message: Generate):
            return [reply async for reply in client.generate(message)][-1]

        started = time.perf_counter()
        dones = await asyncio.gather(*(one(message) for message in requests))
        wall = time.perf_counter() - started
    completion = sum(done.usage["completion_tokens"] for done in dones)
    return {
        "aggregate_tok_s": completion / wall,
        "decode_tok_s": statistics.median(done.timings["predicted_per_second"] for done in dones),
        "accepted": sum(done.timings.get("draft_n_accepted", 0) for done in dones),
        "drafted": sum(done.timings.get("draft_n", 0) for done in dones),
    }


def variants(tokens: int) -> dict[str, list[Generate]]:
    return {
        "free B=1": [request(FREE_PROMPT, tokens, False)],
        "constrained B=1": [request(EXTRACTION_TEXT, tokens, True)],
        "free c=8": [request(FREE_PROMPT, tokens, False) for _ in range(8)],
        "constrained c=8": [request(EXTRACTION_TEXT, tokens, True) for _ in range(8)],
        "extraction, lookup off": [request(EXTRACTION_TEXT, tokens, True, "none")],
        "extraction, lookup on": [request(EXTRACTION_TEXT, tokens, True, "prompt-lookup")],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(SMOLLM2) if SMOLLM2.is_dir() else "embedded")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, default=None, help="also write the report (markdown) here")
    args = parser.parse_args()

    mask = mask_cost(args.model)
    process, endpoint = start_daemon("-m", args.model, "--max-batch", "8")
    results: dict[str, list[dict]] = {name: [] for name in variants(args.tokens)}
    try:
        asyncio.run(run_batch(endpoint, [request(FREE_PROMPT, 8, False)]))  # warm-up: compiles, caches
        for round_index in range(args.rounds):
            names = list(results)
            for name in names if round_index % 2 == 0 else reversed(names):
                results[name].append(asyncio.run(run_batch(endpoint, variants(args.tokens)[name])))
    finally:
        stop_daemon(process, endpoint)

    lines = [
        "# Structured output: mask cost and constrained vs free decode",
        "",
        f"`{command_line()}`",
        "",
        f"machine: {json.dumps(machine_facts())}",
        "",
        f"(a) mask per token over a {mask['tokens']}-token reference reply: median {mask['mask_ms_median']:.3f} ms, "
        f"mean {mask['mask_ms_mean']:.3f} ms, max {mask['mask_ms_max']:.3f} ms; applying it: median "
        f"{mask['apply_ms_median']:.3f} ms",
        "",
        "| variant | decode tok/s per request | aggregate tok/s | drafts accepted / drafted |",
        "|---|---|---|---|",
    ]
    for name, rounds in results.items():
        lines.append(
            f"| {name} | {spread([r['decode_tok_s'] for r in rounds])} | "
            f"{spread([r['aggregate_tok_s'] for r in rounds])} | "
            f"{sum(r['accepted'] for r in rounds)} / {sum(r['drafted'] for r in rounds)} |"
        )
    lines += ["", "| ratio (per round) | median [min-max] |", "|---|---|"]
    for label, over, under, key in [
        ("constrained / free, B=1", "constrained B=1", "free B=1", "decode_tok_s"),
        ("constrained / free, c=8 aggregate", "constrained c=8", "free c=8", "aggregate_tok_s"),
        ("extraction lookup on / off", "extraction, lookup on", "extraction, lookup off", "decode_tok_s"),
    ]:
        ratios = [a[key] / b[key] for a, b in zip(results[over], results[under]) if b[key]]
        lines.append(f"| {label} | {ratio_spread(ratios)} |")
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        args.out.write_text(report)


if __name__ == "__main__":
    main()
