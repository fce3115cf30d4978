"""Shared draft store on against prompt lookup alone, request by request in one process, at c = 1.

Runs the daemon's core in this process (``mlxd_daemon.local``: the same scheduler, options and start-up
calibration as ``mlxd``, prompt lookup on) and sends mlx-bench's prompts of each ``--styles`` style as chat
requests, greedy: each prompt twice in a row, once with the shared store (``shared_drafts``) and once
without, the order alternating from prompt to prompt, prefix cache off. The store holds only the outputs of
the requests sent with it, as a server of its own would. Pairs of the same prompt side by side keep this
VM's drift out of the ratio that an HTTP run at c = 1 shows with a wide spread. Prints, per style, the draft
tokens accepted / drafted and the tok/s of each side over all prompts, and their ratio.

Run: .venv/bin/python scripts/ab_shared_drafts.py --model ../shared/models/smollm2-135m-instruct-q4
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mlxd_fast_blas import ensure_fast_blas  # noqa: E402

ensure_fast_blas()

from mlxd_cli.bench.prompts import PromptBook  # noqa: E402
from mlxd_daemon.local import local_client  # noqa: E402
from mlxd_protocol import Generate, Sampling, Speculative, new_request_id  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--styles", default="plain,copy,extract,agent")
    parser.add_argument("--prompts", type=int, default=16, help="prompts of each style")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    styles = args.styles.split(",")
    book = PromptBook(args.seed, 200)
    totals: dict[tuple[str, bool], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    with local_client(model=args.model, draft_kind="prompt-lookup", max_batch=1) as client:

        def send(text: str, shared: bool) -> tuple[float, dict]:
            request = Generate(
                new_request_id(),
                messages=[{"role": "user", "content": text}],
                max_tokens=args.max_tokens,
                sampling=Sampling(),
                speculative=Speculative("prompt-lookup"),
                shared_drafts=shared,
                cache_prompt=False,
            )
            started = time.perf_counter()
            done = list(client.generate(request))[-1]
            return time.perf_counter() - started, done.timings

        for shared in (True, False):  # warm-up, not counted
            send(book.prompt("plain", "warmup", 1, 0), shared)
        for index in range(args.prompts):
            for style in styles:
                text = book.prompt(style, "0", 1, index)
                for shared in (True, False) if index % 2 == 0 else (False, True):
                    seconds, timings = send(text, shared)
                    total = totals[style, shared]
                    total["seconds"] += seconds
                    total["tokens"] += timings["predicted_n"]
                    total["drafted"] += timings.get("draft_n", 0)
                    total["accepted"] += timings.get("draft_n_accepted", 0)
    print(f"Model: {args.model}; {args.prompts} prompts a style, {args.max_tokens} tokens, c = 1\n")
    print("| style | store on: accepted/drafted, tok/s | lookup alone: accepted/drafted, tok/s | on / alone |")
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
