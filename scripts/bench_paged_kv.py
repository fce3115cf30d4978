"""Step and verify cost on paged vs contiguous KV storage at 1K-8K tokens of context.

For each context length, a sequence holds that many tokens; each timed op is repeated and its median
taken: a 1-token step, and an 8-draft verify (9 tokens) followed by unwinding it. Backends alternate
within every repetition (contiguous, paged, contiguous, ...). Also: B=1 decode tok/s on each backend,
and how many concurrent 4K-token sequences fit in the same KV memory.

Run: .venv/bin/python scripts/bench_paged_kv.py [--model PATH] [--reps 15]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mlxd_fast_blas import ensure_fast_blas  # noqa: E402

ensure_fast_blas()

import mlx.core as mx  # noqa: E402

from bench_common import ROOT, command_line, machine_facts  # noqa: E402
from mlxd_engine import Engine, load, prefill_and_record, read_and_record, step_and_record  # noqa: E402
from mlxd_engine.cache_layout import kv_bytes_per_token  # noqa: E402

CONTEXTS = [1024, 2048, 4096, 8192]


def prepared(loaded, backend: str, context: int, rng: random.Random):
    engine = Engine(
        loaded,
        max_sequences=1,
        max_kv_size=context + 64,
        storage=backend,
        kv_block_size=64,
        kv_pool_tokens=context + 128,
    )
    seq = engine.add_sequence([rng.randrange(3, loaded.vocab_size) for _ in range(context)], max_new_tokens=32)
    while prefill_and_record(engine, seq, 1024) is None:
        pass
    return engine, seq


def time_step(engine, seq) -> float:
    started = time.perf_counter()
    step_and_record(engine, [seq])
    elapsed = time.perf_counter() - started
    # keep the context length fixed: drop the token this step added
    seq.kv.committed -= 1
    seq.tokens.pop()
    if engine.storage.kind == "paged":
        engine.storage.unwind(seq.kv, 0)
    return elapsed


def time_verify(engine, seq, k: int = 8) -> float:
    started = time.perf_counter()
    logits = engine.verify(seq, [seq.tokens[-1]] + [5] * k)
    mx.eval(logits)
    elapsed = time.perf_counter() - started
    engine.unwind_appends(seq, k + 1)
    return elapsed


def decode_rate(loaded, backend: str, n: int = 200) -> float:
    engine = Engine(loaded, max_sequences=1, storage=backend, kv_pool_tokens=4096)
    seq = engine.add_sequence(loaded.tokenizer.encode("The Python standard library"), max_new_tokens=n + 8)
    prefill_and_record(engine, seq)
    handle = engine.submit_step([seq])
    started = time.perf_counter()
    for _ in range(n):
        next_handle = engine.submit_step([seq], lookahead=handle)
        read_and_record(engine, handle)
        handle = next_handle
    read_and_record(engine, handle)
    return n / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmark_results" / "paged_kv.md")
    args = parser.parse_args()
    loaded = load(args.model)
    rng = random.Random(0)
    rows = []
    for context in CONTEXTS:
        setups = {backend: prepared(loaded, backend, context, rng) for backend in ("contiguous", "paged")}
        for engine, seq in setups.values():  # warm-up
            time_step(engine, seq)
            time_verify(engine, seq)
        samples = {(b, op): [] for b in setups for op in ("step", "verify")}
        for _ in range(args.reps):
            for backend, (engine, seq) in setups.items():
                samples[(backend, "step")].append(time_step(engine, seq))
                samples[(backend, "verify")].append(time_verify(engine, seq))
        med = {key: statistics.median(v) * 1000 for key, v in samples.items()}
        rows.append({"context": context, **{f"{b}_{op}_ms": round(v, 3) for (b, op), v in med.items()}})
        print(rows[-1], flush=True)
    rates = {"contiguous": [], "paged": []}
    for _ in range(args.rounds):
        for backend in rates:
            rates[backend].append(decode_rate(loaded, backend))
    per_token = kv_bytes_per_token(loaded)
    budget = 1 << 30
    lines = [
        "# Paged vs contiguous KV storage: step and verify cost",
        "",
        f"Command: `{command_line()}`",
        "",
        f"Model: `{loaded.path}`. Median of {args.reps} repetitions per cell, backends alternating; step = one "
        "token, verify = current token + 8 drafts (9 tokens) then unwound. Block size 64.",
        "",
        "Machine: " + ", ".join(f"{k} {v}" for k, v in machine_facts().items()),
        "",
        "| context | step contiguous ms | step paged ms | paged/contiguous | verify(8) contiguous ms "
        "| verify(8) paged ms | paged/contiguous | verify/step paged |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['context']} | {r['contiguous_step_ms']:.2f} | {r['paged_step_ms']:.2f} | "
            f"{r['paged_step_ms'] / r['contiguous_step_ms']:.2f} | {r['contiguous_verify_ms']:.2f} | "
            f"{r['paged_verify_ms']:.2f} | {r['paged_verify_ms'] / r['contiguous_verify_ms']:.2f} | "
            f"{r['paged_verify_ms'] / r['paged_step_ms']:.2f} |"
        )
    lines += [
        "",
        f"B=1 decode tok/s (200 tokens after a short prompt, {args.rounds} alternating rounds, median [min-max]): "
        f"contiguous {statistics.median(rates['contiguous']):.1f} "
        f"[{min(rates['contiguous']):.1f}-{max(rates['contiguous']):.1f}], "
        f"paged {statistics.median(rates['paged']):.1f} [{min(rates['paged']):.1f}-{max(rates['paged']):.1f}].",
        "",
        f"Capacity: {per_token} bytes of K/V per token for this model; in 1 GiB of KV memory:",
        "",
        "| workload | contiguous | paged (block 64) |",
        "|---|---|---|",
        f"| concurrent 4K-token sequences | {budget // (4096 * per_token)} (slots x capacity 4096) | "
        f"{budget // (64 * per_token) // 64} (64 blocks each) |",
        f"| 4K-token sequences beside one 8K-token sequence | {budget // (8192 * per_token) - 1} (every slot grows "
        f"to 8192) | {(budget // (64 * per_token) - 128) // 64} |",
        f"| 4K-token sequences when --max-kv-size is 8192 and slots are sized for it up front | "
        f"{budget // (8192 * per_token)} | {budget // (64 * per_token) // 64} |",
    ]
    text = "\n".join(lines) + "\n"
    args.out.write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps({"rows": rows, "decode_rates": rates}, indent=2) + "\n")
    print(text)


if __name__ == "__main__":
    main()
