"""Engine demo: greedy reply of the embedded model to a copy prompt, plain decode vs the verify round.

Prints both continuations, their token counts and decode speed, and exits non-zero if they differ.
Run: make demo   (or .venv/bin/python scripts/demo.py [--model PATH] [--prompt TEXT])
"""

from __future__ import annotations

import argparse
import sys

from mlxd_fast_blas import blas_in_use, ensure_fast_blas

COPY_PROMPT = (
    "Repeat the following paragraph exactly: The scheduler keeps one decode step in flight while it reads "
    "the previous one, so the accelerator never waits for Python. When a row proposes draft tokens, the "
    "next tick runs synchronously and the proposal is checked in a single forward pass."
)


def main() -> int:
    ensure_fast_blas()
    from mlxd_engine import Engine, load
    from mlxd_scheduler import generate_plain, generate_with_prompt_lookup

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=None, help="mlx-lm checkpoint (default: the embedded model)")
    parser.add_argument("--prompt", default=COPY_PROMPT)
    parser.add_argument("--max-tokens", type=int, default=120)
    args = parser.parse_args()

    loaded = load(args.model)
    print(f"model: {loaded.path} ({loaded.model_type}, {loaded.n_layers} layers); BLAS: {blas_in_use()}")
    if loaded.tokenizer.has_chat_template:
        messages = [{"role": "user", "content": args.prompt}]
        prompt = loaded.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    else:
        prompt = loaded.tokenizer.encode(args.prompt)
    engine = Engine(loaded, max_sequences=1)
    generate_plain(engine, prompt, 8)  # warm-up
    plain = generate_plain(engine, prompt, args.max_tokens)
    lookup = generate_with_prompt_lookup(engine, prompt, args.max_tokens)
    for name, result in (("plain decode", plain), ("prompt lookup", lookup)):
        speed = len(result.tokens) / result.decode_seconds if result.decode_seconds else 0.0
        print(f"\n== {name}: {len(result.tokens)} tokens, {speed:.0f} tok/s, finish={result.finish_reason}")
        if result.verify_rounds:
            print(f"   verify rounds {result.verify_rounds}, drafted {result.drafted}, accepted {result.accepted}")
        print(loaded.tokenizer.decode(result.tokens))
    same = plain.tokens == lookup.tokens
    print(f"\nidentical: {'yes' if same else 'NO'} ({len(plain.tokens)} vs {len(lookup.tokens)} tokens)")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
