"""Shared draft store on against prompt lookup alone (or prompt lookup against none), batch by batch in one
process.

Runs the daemon's core in this process (``mlxd_daemon.local``: the same scheduler, options and start-up
calibration as ``mlxd``, prompt lookup on, up to ``MAX_BATCH`` rows decoded together as a server does) and
sends mlx-bench's prompts of each ``--styles`` style as chat requests, greedy, ``--concurrency`` at a time
(their ``generate`` streams interleaved, so the scheduler batches them as it batches a server's): each batch
twice in a row, once with the shared store (``shared_drafts``) and once without, the order alternating from
batch to batch, prefix cache off, after one unmeasured batch of each style on each side (as mlx-bench warms
up). The store holds only the outputs of the requests sent with it, as a server of its own would.
Batches of the same prompts side by side keep this VM's drift out of the ratio that an HTTP run shows
with a wide spread. Prints, per style, the draft tokens accepted / drafted and the
tok/s of each side over all batches, and their ratio. ``--compare lookup`` sends each batch with prompt
lookup alone and with no speculation instead: the on/off ratio the prompt-lookup goals name.

Run: .venv/bin/python scripts/ab_shared_drafts.py --model ../shared/models/smollm2-135m-instruct-q4 [--concurrency 4]
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mlxd_fast_blas import ensure_fast_blas  # noqa: E402

ensure_fast_blas()

from bench_common import chat_batch  # noqa: E402
from mlxd_cli.bench.prompts import PromptBook  # noqa: E402
from mlxd_daemon.local import local_client  # noqa: E402
from mlxd_protocol.serving_defaults import MAX_BATCH  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--styles", default="plain,copy,extract,agent")
    parser.add_argument("--prompts", type=int, default=16, help="batches of each style")
    parser.add_argument("--concurrency", type=int, default=1, help="requests a batch")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--compare",
        choices=("store", "lookup"),
        default="store",
        help="store: shared store on against prompt lookup alone; lookup: prompt lookup against no speculation",
    )
    args = parser.parse_args()
    styles = args.styles.split(",")
    book = PromptBook(args.seed, 200)
    totals: dict[tuple[str, bool], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    max_batch = max(args.concurrency, MAX_BATCH)
    with local_client(model=args.model, draft_kind="prompt-lookup", max_batch=max_batch) as client:

        def send(texts: list[str], on: bool) -> tuple[float, list[dict]]:
            """The batch at once; ``on`` is the side under test: the shared store, or with ``--compare lookup``
            prompt lookup itself."""
            store = args.compare == "store"
            return chat_batch(client, texts, args.max_tokens, lookup=on or store, shared_drafts=on and store)

        c = args.concurrency
        for style in styles:  # warm-up, not counted: each style once, so its first batch finds the store warm
            for on in (True, False):
                send([book.prompt(style, "warmup", c, i) for i in range(c)], on)
        for batch in range(args.prompts):
            for style in styles:
                texts = [book.prompt(style, "0", c, batch * c + i) for i in range(c)]  # as mlx-bench numbers them
                for on in (True, False) if batch % 2 == 0 else (False, True):
                    seconds, timings = send(texts, on)
                    total = totals[style, on]
                    total["seconds"] += seconds
                    for one in timings:
                        total["tokens"] += one["predicted_n"]
                        total["drafted"] += one.get("draft_n", 0)
                        total["accepted"] += one.get("draft_n_accepted", 0)
    print(f"Model: {args.model}; {args.prompts} batches a style, {args.max_tokens} tokens, c = {c}\n")
    sides = ("store on", "lookup alone") if args.compare == "store" else ("lookup on", "lookup off")
    print(f"| style | {sides[0]}: accepted/drafted, tok/s | {sides[1]}: accepted/drafted, tok/s | on / off |")
    print("|---|---|---|---|")
    for style in styles:
        on, alone = totals[style, True], totals[style, False]
        rate_on, rate_alone = on["tokens"] / on["seconds"], alone["tokens"] / alone["seconds"]
        print(
            f"| {style} | {on['accepted']:.0f}/{on['drafted']:.0f}, {rate_on:.1f} | "
            f"{alone['accepted']:.0f}/{alone['drafted']:.0f}, {rate_alone:.1f} | {rate_on / rate_alone:.3f} |"
        )


if __name__ == "__main__":
    main()
