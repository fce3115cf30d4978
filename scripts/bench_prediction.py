"""Predicted outputs, measured: a code-edit request with the original code as OpenAI's ``prediction``.

One in-process daemon core (``mlxd_daemon.local``: the daemon's whole request path, no socket) on
``--model``; each round runs, in turn: plain decode (prompt lookup off), prompt lookup without a
prediction, and prompt lookup with the original function as prediction. Greedy, the same prompt and
``--max-tokens`` every time (end-of-sequence honoured). Printed per variant: median [min-max] decode
tok/s (the daemon's timings), accepted / drafted tokens and, for the prediction, accepted / rejected
prediction tokens; per-round ratios to plain decode; whether every reply equals the plain one.

Run: .venv/bin/python scripts/bench_prediction.py --model ../shared/models/smollm2-135m-instruct-q4 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mlxd_fast_blas import ensure_fast_blas  # noqa: E402

ensure_fast_blas()

CODE = '''def order_total(items, tax_rate=0.2, discount=None):
    """The price of an order: items are (name, unit_price, quantity) tuples."""
    total = 0.0
    for name, unit_price, quantity in items:
        if quantity <= 0:
            raise ValueError(f"{name}: quantity must be positive")
        total += unit_price * quantity
    if discount is not None:
        total -= min(discount, total)
    total *= 1.0 + tax_rate
    return round(total, 2)
'''
ASK = (
    "Change the default tax_rate of this Python function from 0.2 to 0.25. Reply with the whole function "
    "and nothing else.\n\n```python\n" + CODE + "```"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=160)
    args = parser.parse_args()

    from mlxd_daemon.local import local_client
    from mlxd_daemon.options import DaemonOptions
    from mlxd_protocol import Done, Generate, Sampling, Speculative, new_request_id

    variants = {
        "plain": dict(speculative=Speculative(kind="none")),
        "lookup": dict(speculative=Speculative(kind="prompt-lookup")),
        "prediction": dict(speculative=Speculative(kind="prompt-lookup"), prediction="```python\n" + CODE + "```"),
    }
    results: dict[str, list[Done]] = {name: [] for name in variants}
    with local_client(DaemonOptions(model=args.model, max_batch=1)) as client:
        for _ in range(args.rounds + 1):  # the first round warms up and is not counted
            for name, fields in variants.items():
                message = Generate(
                    id=new_request_id(),
                    messages=[{"role": "user", "content": ASK}],
                    max_tokens=args.max_tokens,
                    sampling=Sampling(temperature=0.0),
                    cache_prompt=False,
                    **fields,
                )
                *_, done = list(client.generate(message))
                results[name].append(done)
    results = {name: dones[1:] for name, dones in results.items()}
    speed = {name: [d.timings.get("predicted_per_second", 0.0) for d in dones] for name, dones in results.items()}
    same = all(d.tokens == p.tokens for dones in results.values() for d, p in zip(dones, results["plain"]))
    print(f"model {args.model}, {args.rounds} rounds, max_tokens {args.max_tokens}; replies equal plain: {same}")
    for name, dones in results.items():
        values = speed[name]
        ratios = [v / p for v, p in zip(values, speed["plain"]) if p]
        drafted = sum(d.timings.get("draft_n", 0) for d in dones)
        accepted = sum(d.timings.get("draft_n_accepted", 0) for d in dones)
        line = (
            f"{name:11} {statistics.median(values):7.1f} tok/s [{min(values):.1f}-{max(values):.1f}]  "
            f"vs plain {statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]  "
            f"drafts accepted {accepted}/{drafted}  tokens {len(dones[0].tokens)}"
        )
        if name == "prediction":
            line += (
                f"  prediction accepted {dones[0].usage.get('accepted_prediction_tokens')}"
                f" / rejected {dones[0].usage.get('rejected_prediction_tokens')}"
            )
        print(line)


if __name__ == "__main__":
    main()
