"""Trace the verify gate: its inputs and its plan at every decision, for one prompt sent several times.

Runs the daemon's core in this process (``mlxd_daemon.local``: the same scheduler, options and start-up
calibration as ``mlxd``) and sends the prompt ``--runs`` times, greedy, with prompt lookup on; the runs
after the first find the prompt in the prefix cache. For each run: drafted / accepted tokens, the prompt
tokens prefilled and cached, tok/s, and the gate's decisions (``--decisions``: every one; else only the
declined ones and the first three). A decision shows the proposing row's draft length, the tokens its
governor expects accepted and its per-token acceptance, the priced plain step and verify forward, the
measured tick overheads, and the plan. ``--spike-ms`` adds that many ms to the first synchronous tick's
measured overhead (a one-off slow tick), to see how the gate recovers.

Run: .venv/bin/python scripts/trace_verify_gate.py [--model embedded] [--runs 3] [--spike-ms 10]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mlxd_fast_blas import ensure_fast_blas  # noqa: E402

ensure_fast_blas()

import mlxd_scheduler.prompt_lookup_arm as arm  # noqa: E402
from bench_prompt_lookup import PARAGRAPHS  # noqa: E402
from mlxd_daemon.local import local_client  # noqa: E402
from mlxd_protocol import Generate, Sampling, Speculative, new_request_id  # noqa: E402


def traced_plan_tick(log: list[dict]):
    stock = arm.plan_tick

    def plan_tick(views, pipelined, steps, costs):
        plan = stock(views, pipelined, steps, costs)
        proposing = [v for v in views if v.draft]
        if proposing:
            row = proposing[0]
            log.append(
                {
                    "pipelined": pipelined,
                    "rows": len(views),
                    "draft": row.draft,
                    "expected": round(row.expected, 2),
                    "p": round(row.acceptance, 2),
                    "plain_ms": _round(costs.plain(len(views), row.context, steps)),
                    "verify_ms": _round(costs.forward(1, 1 + row.draft, row.context)),
                    "sync_overhead_ms": round(costs.sync_overhead_ms, 3),
                    "plain_overhead_ms": round(costs.plain_overhead_ms, 3),
                    "plan": str(plan.mode),
                    "verified": len(plan.verify),
                    "width": plan.width,
                }
            )
        return plan

    arm.plan_tick = plan_tick


def spike_first_sync_tick(spike_ms: float) -> None:
    stock = arm.TickOverheads.observe
    spiked = []

    def observe(self, kind, wall_ms, forward_ms):
        if kind == "sync" and not spiked:
            spiked.append(True)
            wall_ms += spike_ms
        return stock(self, kind, wall_ms, forward_ms)

    arm.TickOverheads.observe = observe  # type: ignore[method-assign]


def _round(value):
    return None if value is None else round(value, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--prompt", default=None, help="default: the copy prompt of scripts/bench_prompt_lookup.py")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--spike-ms", type=float, default=0.0)
    parser.add_argument("--decisions", action="store_true", help="print every decision")
    args = parser.parse_args()
    log: list[dict] = []
    traced_plan_tick(log)
    if args.spike_ms:
        spike_first_sync_tick(args.spike_ms)
    prompt = args.prompt or f"Repeat the following paragraph exactly: {PARAGRAPHS[0]}"
    with local_client(model=args.model, draft_kind="prompt-lookup", max_batch=1) as client:
        for run in range(args.runs):
            log.clear()
            started = time.perf_counter()
            request = Generate(
                new_request_id(),
                prompt=prompt,
                max_tokens=args.max_tokens,
                sampling=Sampling(),
                speculative=Speculative("prompt-lookup"),
            )
            done = list(client.generate(request))[-1]
            timings = done.timings
            print(
                f"run {run}: drafted {timings.get('draft_n', 0)} accepted {timings.get('draft_n_accepted', 0)}; "
                f"prompt {timings['prompt_n']} prefilled, {timings.get('cache_n', 0)} cached; "
                f"{timings['predicted_n']} tokens at {timings['predicted_per_second']:.0f} tok/s "
                f"({time.perf_counter() - started:.2f} s); {len(log)} decisions, "
                f"{sum(1 for d in log if d['verified'])} verified"
            )
            shown = log if args.decisions else [d for d in log if not d["verified"]] + log[:3]
            for decision in shown:
                print("   ", decision)


if __name__ == "__main__":
    main()
