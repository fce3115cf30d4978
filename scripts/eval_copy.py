"""Copy accuracy of a checkpoint on held-out paragraphs (the corpus split of the training script).

For each of N held-out paragraphs of 60-200 tokens, the model gets "Repeat the following paragraph
exactly: <paragraph>" (through its chat template, and raw) and replies greedily. Two scores over all
reference tokens:
- positional: reply token i equals reference token i;
- aligned: reference tokens found, in order, in the reply (longest matching blocks; a skipped or
  inserted token costs one token, not the rest of the paragraph).
The reference is the paragraph's tokens as they stand in the prompt, which is what a copy reproduces.
Then the plain prompts (no copy asked): how many replies (chat template, 60 tokens) read as text by
``plausible_reply``, greedy and with llama-server's default sampler (seeded).

Run: .venv/bin/python scripts/eval_copy.py [--model models/mlxd-qwen3-tiny] [--count 20]
"""

from __future__ import annotations

import argparse
import difflib
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mlxd_fast_blas import ensure_fast_blas  # noqa: E402

ensure_fast_blas()

from embedded_model_data import PLAIN_PROMPTS, build_corpus, known_words, plausible_reply  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(ROOT / "models" / "mlxd-qwen3-tiny"))
    parser.add_argument("--count", type=int, default=20, help="how many held-out paragraphs (0: all that fit)")
    parser.add_argument("--show", type=int, default=1, help="print this many replies")
    args = parser.parse_args()
    from mlxd_engine import Engine, SamplingParams, load
    from mlxd_scheduler import generate_plain

    loaded = load(args.model)
    tokenizer = loaded.tokenizer
    corpus = build_corpus()
    fitting = [p for p in corpus.heldout_prose if 60 <= len(tokenizer.encode(p)) <= 200]
    random.Random(4321).shuffle(fitting)
    paragraphs = fitting[: args.count or None]
    engine = Engine(loaded, max_sequences=1)
    # greedy, and llama-server's default sampler (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05), seeded
    plain_samplers = {
        "greedy": SamplingParams(),
        "sampled": SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=0),
    }
    scores = {}
    for frame in ("chat", "raw"):
        positional = aligned = total = perfect = 0
        for i, paragraph in enumerate(paragraphs):
            user = f"Repeat the following paragraph exactly: {paragraph}"
            if frame == "chat":
                prompt = tokenizer.apply_chat_template([{"role": "user", "content": user}], add_generation_prompt=True)
            else:
                prompt = tokenizer.encode(user + "\n\n")
            in_prompt = tokenizer.encode(" " + paragraph)  # the paragraph's tokens as they stand in the prompt
            plain = tokenizer.encode(paragraph)
            reply = generate_plain(engine, prompt, len(in_prompt) + 8).tokens
            reference = in_prompt if reply[:1] == in_prompt[:1] else plain
            positional += sum(a == b for a, b in zip(reply, reference))
            matcher = difflib.SequenceMatcher(a=reference, b=reply, autojunk=False)
            aligned += sum(block.size for block in matcher.get_matching_blocks())
            total += len(reference)
            perfect += reply == reference
            if i < args.show:
                print(f"--- {frame} reference:\n{paragraph}\n--- reply:\n{tokenizer.decode(reply)}\n")
        scores[frame] = {
            "positional": round(positional / total, 4),
            "aligned": round(aligned / total, 4),
            "paragraphs_exact": perfect,
            "tokens": total,
        }
    vocabulary = known_words(corpus)
    plain_ids = [
        tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
        for prompt in PLAIN_PROMPTS
    ]
    for name, params in plain_samplers.items():
        plausible = 0
        for i, (prompt, ids) in enumerate(zip(PLAIN_PROMPTS, plain_ids)):
            reply = tokenizer.decode(generate_plain(engine, ids, 60, params).tokens)
            ok, why = plausible_reply(prompt, reply, vocabulary)
            plausible += ok
            if i < args.show:
                print(f"--- plain prompt ({name}): {prompt}\n--- reply ({'plausible' if ok else why}):\n{reply}\n")
        scores[f"plain_prompts_{name}"] = {"plausible": plausible, "of": len(PLAIN_PROMPTS)}
    print(json.dumps({"paragraphs": len(paragraphs), **scores}, indent=2))


if __name__ == "__main__":
    main()
