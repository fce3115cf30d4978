"""The verify gate in hindsight: what it expected of each proposal, what it did with it, and what the draft
would have had accepted, verified or not.

Runs the daemon's core in this process (``mlxd_daemon.local``, prompt lookup on, the shared store on unless
``--no-shared``) and sends mlx-bench's prompts of one ``--style`` as chat requests, greedy, ``--concurrency``
at a time (their streams interleaved, so the scheduler batches them as a server's), after one unmeasured
batch. Every proposal the gate weighs is recorded with the row's output length when it was made; once the
requests are done, the draft is compared with the greedy output that followed it (greedy output is the same
whatever the gate does), giving the draft tokens it would have had accepted. Prints, per draft source, gate
verdict, rows in the tick and whether a step was in flight: proposals, mean draft length, mean tokens the
governor expected accepted, and mean tokens the draft agrees with (whole, and cut to the verify's width).
A gate that expects more than its verified drafts give is optimistic; declined drafts that would have given
more than expected are what a more trusting gate could have had.

Run: .venv/bin/python scripts/trace_gate_hindsight.py --model ../shared/models/smollm2-135m-instruct-q4
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mlxd_fast_blas import ensure_fast_blas  # noqa: E402

ensure_fast_blas()

import mlxd_scheduler.prompt_lookup_arm as arm  # noqa: E402
from bench_common import chat_batch  # noqa: E402
from mlxd_cli.bench.prompts import PromptBook  # noqa: E402
from mlxd_daemon.local import local_client  # noqa: E402
from mlxd_protocol.serving_defaults import MAX_BATCH  # noqa: E402

RECORDS: list[dict] = []
_PROPOSED: dict = {}  # the tick's proposals: state -> (output length, draft, source)


def _recording_propose(stock):
    def propose(self, drafting):
        proposals = stock(self, drafting)
        _PROPOSED.clear()
        for state, draft in proposals[0].items():
            _PROPOSED[state] = (len(state.seq.output), list(draft), state.drafter.outstanding_source)
        return proposals

    return propose


def _recording_plan(stock):
    def plan_tick(views, pipelined, steps, costs):
        plan = stock(views, pipelined, steps, costs)
        verified = set(plan.verify)
        for view in views:
            if view.draft and view.key in _PROPOSED:
                at, draft, source = _PROPOSED[view.key]
                cut = plan.width - 1 if plan.width and view.key in verified else len(draft)
                RECORDS.append(
                    {
                        "state": view.key,
                        "at": at,
                        "draft": draft,
                        "cut": cut,
                        "source": source,
                        "expected": view.expected,
                        "verified": view.key in verified,
                        "rows": len(views),
                        "in_flight": pipelined,
                    }
                )
        return plan

    return plan_tick


def agreeing(draft: list[int], output: list[int]) -> int:
    """How many of the draft's first tokens equal the output's: what a verify would accept."""
    n = 0
    for proposed, actual in zip(draft, output, strict=False):
        if proposed != actual:
            break
        n += 1
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--style", default="extract")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--no-shared", action="store_true", help="prompt lookup alone, no shared store")
    args = parser.parse_args()
    arm.PromptLookupArm._propose = _recording_propose(arm.PromptLookupArm._propose)
    arm.plan_tick = _recording_plan(arm.plan_tick)
    book = PromptBook(0, 200)
    c = args.concurrency
    totals: dict[str, float] = defaultdict(float)
    with local_client(model=args.model, draft_kind="prompt-lookup", max_batch=max(c, MAX_BATCH)) as client:

        def send(texts: list[str]) -> tuple[float, list[dict]]:
            return chat_batch(client, texts, args.max_tokens, lookup=True, shared_drafts=not args.no_shared)

        send([book.prompt(args.style, "warmup", c, i) for i in range(c)])
        RECORDS.clear()
        for batch in range(args.batches):
            seconds, timings = send([book.prompt(args.style, "0", c, batch * c + i) for i in range(c)])
            totals["seconds"] += seconds
            for one in timings:
                totals["tokens"] += one["predicted_n"]
                totals["accepted"] += one.get("draft_n_accepted", 0)
                totals["drafted"] += one.get("draft_n", 0)
    print(
        f"Model: {args.model}; style {args.style}, c = {c}, {args.batches} batches; "
        f"{totals['tokens'] / totals['seconds']:.1f} tok/s, accepted / drafted {totals['accepted']:.0f} / "
        f"{totals['drafted']:.0f}\n"
    )
    groups: dict[tuple, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for record in RECORDS:
        output = record["state"].seq.output[record["at"] :]
        key = (
            record["source"],
            "verified" if record["verified"] else "declined",
            record["rows"],
            "in flight" if record["in_flight"] else "synchronous",
        )
        group = groups[key]
        group["n"] += 1
        group["draft"] += len(record["draft"])
        group["expected"] += record["expected"]
        group["whole"] += agreeing(record["draft"], output)
        group["cut"] += agreeing(record["draft"][: record["cut"]], output)
    print("| source | gate | rows | step in flight | proposals | mean draft | mean expected | would accept | cut |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key in sorted(groups, key=str):
        group = groups[key]
        n = group["n"]
        print(
            f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {n:.0f} | {group['draft'] / n:.1f} | "
            f"{group['expected'] / n:.2f} | {group['whole'] / n:.2f} | {group['cut'] / n:.2f} |"
        )


if __name__ == "__main__":
    main()
