"""Drafting policies replayed offline: the real drafter over recorded greedy replies, priced by a one-row cost model.

Greedy output does not depend on what is drafted, so one recording of each request's prompt and reply (token ids)
tells what any draft would have had accepted. ``record`` runs the daemon's core in this process
(``mlxd_daemon.local``, speculation off) and sends mlx-bench's prompts of each ``--styles`` style as chat requests,
greedy, one at a time, writing their prompt and reply ids to ``--out``. ``replay`` then walks each reply with
``mlxd_drafters.PromptLookupDrafter`` (the shared store as the scheduler feeds it: each finished request's tokens
added in order, the first ``--warmup`` requests of a style feeding it uncounted) and prices each tick:

- a plain step costs 1; a verify round of k draft tokens costs ``1 + overhead + per_token x k``
  (``--per-token``: what a draft token costs beside a step, 0.16-0.25 of a one-row step on SmolLM2 q4 here, more
  per row with more rows; ``--overhead``: what a verify round costs beyond a plain step whatever its draft, where a
  synchronous round stands in for a pipelined step: docs/benchmark_results/code_notes.md#replayed-drafts);
- the gate follows the scheduler's for one row: a draft is cut to the k (or declined) with the most expected
  tokens per cost, (1 + p + ... + p^k) / (1 + overhead + per_token x k), p the drafter's
  ``acceptance_estimate()``, which must beat the plain step by ``VERIFY_MARGIN``; a declined draft is retracted
  (and scored, as the scheduler's are).

It prints, per style, tokens per unit cost with prompt lookup alone and with the store (and with each
``--store-option`` variant), the draft tokens accepted / verified, and the ratio store / lookup alone. It leaves
out several rows and a tick's real costs beyond this model, so its ratios (with ``--overhead 0`` an upper bound
on what a policy gives served) rank policies; served runs measure them.

Run:
  .venv/bin/python scripts/replay_drafts.py record --model ../shared/models/smollm2-135m-instruct-q4 --out r.json
  .venv/bin/python scripts/replay_drafts.py replay r.json --per-token 0.2 --store-option min_probability=0.5
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from mlxd_drafters import PromptLookupConfig, PromptLookupDrafter, SharedDraftStores, SharedStoreConfig
from mlxd_fast_blas import ensure_fast_blas
from mlxd_scheduler.tick_plan import VERIFY_MARGIN


def record(args: argparse.Namespace) -> None:
    from mlxd_cli.bench.prompts import PromptBook
    from mlxd_daemon.local import local_client
    from mlxd_protocol import Chunk, Generate, Sampling, Speculative, new_request_id

    book = PromptBook(args.seed, 200)
    recorded = []
    with local_client(model=args.model) as client:
        for style in args.styles.split(","):
            for i in range(args.requests):
                messages = [{"role": "user", "content": book.prompt(style, "0", 1, i)}]
                reply: list[int] = []
                request = Generate(
                    new_request_id(),
                    messages=messages,
                    max_tokens=args.max_tokens,
                    sampling=Sampling(),
                    speculative=Speculative("none"),
                    cache_prompt=False,
                )
                for message in client.generate(request):
                    if isinstance(message, Chunk):
                        reply += message.tokens
                recorded.append({"style": style, "prompt": client.tokenize(messages=messages), "output": reply})
    Path(args.out).write_text(json.dumps({"model": args.model, "max_tokens": args.max_tokens, "requests": recorded}))
    print(f"{len(recorded)} requests written to {args.out}")


@dataclasses.dataclass
class Replayed:
    tokens: int = 0
    cost: float = 0.0
    drafted: int = 0
    accepted: int = 0

    @property
    def rate(self) -> float:
        return self.tokens / self.cost if self.cost else 0.0


def gate_width(p: float, draft: int, per_token: float, overhead: float) -> int:
    """The draft tokens a one-row gate verifies (0: declined): the k with the most expected tokens per cost."""
    best_k, best = 0, VERIFY_MARGIN  # a plain step: 1 token for a cost of 1, times the margin
    for k in range(1, draft + 1):
        expected = k if p >= 1.0 else p * (1.0 - p**k) / (1.0 - p)
        value = (1.0 + expected) / (1.0 + overhead + per_token * k)
        if value > best:
            best_k, best = k, value
    return best_k


def replay_style(
    requests: list[dict], store: SharedStoreConfig | None, per_token: float, overhead: float, warmup: int
) -> Replayed:
    stores = SharedDraftStores(store) if store is not None else None
    total = Replayed()
    for n, request in enumerate(requests):
        drafter = PromptLookupDrafter(PromptLookupConfig(), shared=stores.store(None) if stores is not None else None)
        drafter.prime(request["prompt"])
        output, position, one = request["output"], 0, Replayed()
        while position < len(output):
            room = len(output) - position - 1  # the last token is the model's own
            proposal = drafter.draft_block()[:room]
            width = gate_width(drafter.acceptance_estimate(), len(proposal), per_token, overhead) if proposal else 0
            if width == 0:
                drafter.retract_draft()
                drafter.observe(output[position : position + 1])
                one.cost += 1.0
                position += 1
                continue
            accepted = 0
            while accepted < width and proposal[accepted] == output[position + accepted]:
                accepted += 1
            drafter.accept_verified_tokens(width, accepted)
            drafter.observe(output[position : position + accepted + 1])
            one.cost += 1.0 + overhead + per_token * width
            one.drafted += width
            one.accepted += accepted
            position += accepted + 1
        if n >= warmup:
            total.tokens += len(output)
            total.cost += one.cost
            total.drafted += one.drafted
            total.accepted += one.accepted
        if stores is not None:
            stores.add(None, request["prompt"], output)
    return total


def store_variant(option: str) -> tuple[str, SharedStoreConfig]:
    fields = {}
    for pair in option.split(","):
        key, value = pair.split("=")
        kind = type(getattr(SharedStoreConfig(), key))
        fields[key] = value.lower() in ("1", "true", "yes") if kind is bool else kind(value)
    return option, SharedStoreConfig(**fields)


def replay(args: argparse.Namespace) -> None:
    recorded = json.loads(Path(args.recording).read_text())
    variants = [("store", SharedStoreConfig())] + [store_variant(option) for option in args.store_option]
    styles = sorted({r["style"] for r in recorded["requests"]}, key=[r["style"] for r in recorded["requests"]].index)
    print(
        f"Recording: {args.recording} ({recorded['model']}); a verify round costs {1 + args.overhead:g} steps and "
        f"{args.per_token:g} a draft token\n"
    )
    print("| style | store | lookup alone: tok/cost (acc/ver) | with store: tok/cost (acc/ver) | store / alone |")
    print("|---|---|---|---|---|")
    for style in styles:
        requests = [r for r in recorded["requests"] if r["style"] == style][: args.requests or None]
        alone = replay_style(requests, None, args.per_token, args.overhead, args.warmup)
        for name, config in variants:
            on = replay_style(requests, config, args.per_token, args.overhead, args.warmup)
            print(
                f"| {style} | {name} | {alone.rate:.3f} ({alone.accepted}/{alone.drafted}) | "
                f"{on.rate:.3f} ({on.accepted}/{on.drafted}) | {on.rate / alone.rate:.3f} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    rec = commands.add_parser("record", help="greedy replies of mlx-bench's prompts, as token ids")
    rec.add_argument("--model", default="embedded")
    rec.add_argument("--styles", default="extract,agent,plain,copy")
    rec.add_argument("--requests", type=int, default=40, help="requests of each style")
    rec.add_argument("--max-tokens", type=int, default=64)
    rec.add_argument("--seed", type=int, default=0)
    rec.add_argument("--out", required=True)
    rep = commands.add_parser("replay", help="the drafter over a recording, priced by the one-row cost model")
    rep.add_argument("recording")
    rep.add_argument("--per-token", type=float, default=0.2, help="a draft token's cost beside a step (0.2)")
    rep.add_argument(
        "--overhead", type=float, default=0.0, help="a verify round's fixed cost beyond a plain step, in steps (0)"
    )
    rep.add_argument("--requests", type=int, default=0, help="the first N requests of each style (0: all)")
    rep.add_argument("--warmup", type=int, default=4, help="requests of each style that feed the store uncounted")
    rep.add_argument(
        "--store-option",
        action="append",
        default=[],
        help="a store variant to replay beside the default: SharedStoreConfig fields, e.g. min_probability=0.5",
    )
    args = parser.parse_args()
    record(args) if args.command == "record" else replay(args)


if __name__ == "__main__":
    ensure_fast_blas()  # re-executes this script with OpenBLAS preloaded (record runs the model)
    main()
