"""Prompt lookup on recurrent state, measured: what a verify round costs when its drafts are only partly accepted.

Recurrent state cannot be moved back by a counter; mlxd restores the state the verify forward read and
forwards the kept tokens again (``row_storage.py``). This measures, through the engine at B=1 and a
200-token context, on the architecture matrix's tiny random models (tests/engine/architectures.py) and, for
comparison, on full-attention models:
- ``step``: one plain decode step;
- ``full``: a 9-token verify (current + 8 drafts) whose drafts are all accepted (no replay);
- ``partial a``: the same verify with ``a`` drafts accepted, then the unwind (restore + replay of a + 1 tokens).
Printed per model: medians in ms and each round's cost in plain steps, and the break-even acceptance: the
fewest accepted drafts for which a round's a + 1 tokens cost less than a + 1 plain steps. Kinds alternate
inside every repetition, so load drifts hit all alike.

Run: .venv/bin/python scripts/bench_recurrent_unwind.py --reps 30
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))
from mlxd_fast_blas import ensure_fast_blas  # noqa: E402

ensure_fast_blas()

CONTEXT, DRAFT = 200, 8
MODELS = ["qwen3_5", "qwen3_next", "lfm2", "granitemoehybrid", "mamba2", "falcon_h1", "llama", "gemma3_text"]
ACCEPTS = (0, 2, 4)


def measure(name: str, reps: int) -> dict[str, float]:
    import mlx.core as mx
    from tests.engine.architectures import build, loaded, prompt

    from mlxd_engine import Engine, prefill_and_record, step_and_record

    engine = Engine(loaded(name, model=build(name, seed=3)), max_sequences=1)
    seq = engine.add_sequence(prompt(CONTEXT, 0), max_new_tokens=4096)
    prefill_and_record(engine, seq)

    def step():
        step_and_record(engine, [seq])

    def verify(accepted: int):
        def run():
            drafts = [int(t) for t in mx.random.randint(1, 100, (DRAFT,)).tolist()]
            logits = engine.verify(seq, [seq.tokens[-1]] + drafts)
            mx.eval(logits)
            kept = drafts[:accepted]
            seq.record(kept + [drafts[accepted] if accepted < DRAFT else 1])
            engine.commit_appends(seq, accepted + 1)
            engine.unwind_appends(seq, DRAFT - accepted)
            mx.eval(engine.storage.arrays())

        return run

    kinds = {"step": step, "full": verify(DRAFT), **{f"partial {a}": verify(a) for a in ACCEPTS}}
    for run in kinds.values():  # warm-up
        run()
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    for _ in range(reps):
        for kind, run in kinds.items():
            started = time.perf_counter()
            run()
            mx.eval(engine.storage.arrays())
            times[kind].append(time.perf_counter() - started)
        if seq.kv.written > 3000:  # stay well inside the context
            engine.release(seq)
            seq = engine.add_sequence(prompt(CONTEXT, 0), max_new_tokens=4096)
            prefill_and_record(engine, seq)
    return {kind: statistics.median(values) * 1000 for kind, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--models", nargs="*", default=MODELS)
    args = parser.parse_args()
    print(
        f"B=1, context {CONTEXT}, verify of 1 + {DRAFT} tokens, medians of {args.reps} repetitions "
        "(ms; x = in plain steps)"
    )
    print(
        f"{'model':18} {'step':>7} {'full':>13} "
        + " ".join(f"{'partial ' + str(a):>15}" for a in ACCEPTS)
        + "  break-even"
    )
    for name in args.models:
        ms = measure(name, args.reps)
        step = ms["step"]
        cells = [f"{ms['full']:6.2f} {ms['full'] / step:4.1f}x"]
        cells += [f"{ms[f'partial {a}']:8.2f} {ms[f'partial {a}'] / step:4.1f}x" for a in ACCEPTS]
        # round cost with a accepted, interpolated between the measured points; a + 1 tokens come out
        points = sorted((a, ms[f"partial {a}"]) for a in ACCEPTS)
        even = next((a for a in range(DRAFT + 1) if _cost(points, a) < (a + 1) * step), None)
        print(
            f"{name:18} {step:7.2f} " + " ".join(f"{c:>15}" for c in cells) + f"  {even if even is not None else '>8'}"
        )


def _cost(points: list[tuple[int, float]], a: int) -> float:
    for (a0, c0), (a1, c1) in zip(points, points[1:]):
        if a <= a1:
            return c0 + (c1 - c0) * (a - a0) / (a1 - a0)
    (a0, c0), (a1, c1) = points[-2:]
    return c1 + (c1 - c0) * (a - a1) / (a1 - a0)


if __name__ == "__main__":
    main()
