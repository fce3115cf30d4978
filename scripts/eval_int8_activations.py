"""What the opt-in int8-activation kernel (MLXD_CPU_WEIGHTS=kernel-int8) changes in a model's output.

Loads the model twice through the CPU weight rule: ``kernel`` (the float kernel: greedy output equal to the
float32 path, tests/daemon/test_smollm2_reference.py) and ``kernel-int8``. Then:
- perplexity of both on a text (teacher forced, 16-token chunks through a KV cache, so every product runs on
  the kernel as in decode), and how often their top-1 tokens agree there;
- greedy continuations of chat prompts (the project's copy and plain prompts and a few others): identical or
  not, the first differing position, and there the float model's logit gap between its token and the int8
  model's (a near-tie when small).
Writes a markdown table (``--out``). Nothing here is timed.

Run: .venv/bin/python scripts/eval_int8_activations.py --model ../shared/models/smollm2-135m-instruct-q4
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "cli"))
sys.path.insert(0, str(Path(__file__).parent))

from mlxd_fast_blas import ensure_fast_blas  # noqa: E402

ensure_fast_blas()

CHUNK = 16


def load_form(model: str, choice: str):
    from mlx_lm import load

    from mlxd_engine.loading.cpu_weights import apply_cpu_weight_rule

    module, tokenizer = load(model)
    form = apply_cpu_weight_rule(module, choice=choice)
    return module, tokenizer, form


def token_logprobs(module, tokens: list[int]):
    """Log-probabilities of each next token and the top-1 prediction at each position."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(module)
    logprobs, top1 = [], []
    for start in range(0, len(tokens) - 1, CHUNK):
        chunk = tokens[start : start + CHUNK]
        logits = module(mx.array(chunk)[None], cache=cache)[0].astype(mx.float32)
        scores = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        following = tokens[start + 1 : start + 1 + len(chunk)]
        picked = scores[mx.arange(len(following)), mx.array(following)]
        mx.eval(picked)
        logprobs += picked.tolist()
        top1 += mx.argmax(logits[: len(following)], axis=-1).tolist()
    return logprobs, top1


def greedy(module, prompt: list[int], tokens: int):
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_sampler

    out, logits = [], []
    for token, logprobs in generate_step(mx.array(prompt), module, max_tokens=tokens, sampler=make_sampler(0.0)):
        out.append(int(token))
        logits.append(logprobs)
    return out, logits


def prompts() -> list[str]:
    from mlxd_cli.bench.prompts import first_sentence, make_paragraph, style_prompt

    texts = [style_prompt("copy", make_paragraph(seed, "int8", 120)) for seed in range(3)]
    texts += [style_prompt("plain", make_paragraph(seed, "int8", 120)) for seed in range(3)]
    texts += [
        "Explain how a bicycle works.",
        "Once upon a time",
        "Write a Python function that reverses a list.",
        "What is the capital of France? Answer in one sentence.",
        "Summarize: " + first_sentence(make_paragraph(9, "int8", 60)),
    ]
    return texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="../shared/models/smollm2-135m-instruct-q4")
    parser.add_argument(
        "--text", type=Path, default=ROOT / "docs" / "architecture.md", help="the text perplexity is measured on"
    )
    parser.add_argument("--text-tokens", type=int, default=2048)
    parser.add_argument("--tokens", type=int, default=64, help="greedy tokens per prompt")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmark_results" / "qmatmul_int8.md")
    args = parser.parse_args()

    import mlxd_qmatmul

    if not mlxd_qmatmul.int8_available(4):
        sys.exit("no int8-activation kernel on this CPU (it needs AVX-512 VNNI and the built extension)")
    forms = {choice: load_form(args.model, choice) for choice in ("kernel", "kernel-int8")}
    tokenizer = forms["kernel"][1]
    text_tokens = tokenizer.encode(args.text.read_text())[: args.text_tokens]
    scored = {choice: token_logprobs(module, text_tokens) for choice, (module, _, _) in forms.items()}
    ppl = {choice: math.exp(-sum(lp) / len(lp)) for choice, (lp, _) in scored.items()}
    top1_agree = sum(a == b for a, b in zip(scored["kernel"][1], scored["kernel-int8"][1])) / len(scored["kernel"][1])

    rows, identical, matched = [], 0, 0
    for text in prompts():
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        ref, ref_logits = greedy(forms["kernel"][0], prompt, args.tokens)
        got, _ = greedy(forms["kernel-int8"][0], prompt, args.tokens)
        split = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), None)
        if split is None:
            identical += 1
            matched += len(ref)
            rows.append(f"| {text[:60]!r} | identical | - | - |")
            continue
        matched += split
        gap = (ref_logits[split][ref[split]] - ref_logits[split][got[split]]).item()
        rows.append(f"| {text[:60]!r} | differs | {split} | {gap:.3f} |")
        print(text[:40], "differs at", split, "gap", gap, flush=True)

    from bench_common import command_line, machine_facts

    facts = machine_facts()
    n = len(prompts())
    block = os.environ.get(mlxd_qmatmul.INT8_BLOCK_ENV)
    asked_block = f"{mlxd_qmatmul.INT8_BLOCK_ENV}={block} " if block else ""
    blocks_note = (
        " (`MLXD_INT8_BLOCK` chooses 16 or 32). Blocks of 32 cost more: an earlier build with them (and the 8-bit "
        "head left on the float kernel) gave perplexity +1.76% on this text and top-1 agreement 92.3%."
        if mlxd_qmatmul.int8_block() == 8
        else f" with `MLXD_INT8_BLOCK={mlxd_qmatmul.int8_block()}` (blocks of 8 by default: qmatmul_int8.md)."
    )
    lines = [
        f"# int8 activations on {Path(args.model).name}: what they change",
        "",
        f"Command: `{asked_block}.venv/bin/python {command_line()}`",
        "",
        f"Machine: {facts['cpu']}, {facts['cores']} cores; MLX {facts['mlx']}; kernel {mlxd_qmatmul.kernel_isa()}.",
        "",
        "`kernel` is the float kernel (greedy output equal to the float32 path); `kernel-int8` rounds each "
        f"product's input rows to int8 in blocks of {mlxd_qmatmul.int8_block()} (llama.cpp's Q8 activations use 32) "
        "and runs VNNI integer dot products, for the 4-bit layers and the 8-bit tied head alike. Opt-in: "
        f"`MLXD_CPU_WEIGHTS=kernel-int8`{blocks_note}",
        "",
        f"Perplexity on the first {len(text_tokens)} tokens of `{args.text.relative_to(ROOT)}` "
        f"(teacher forced, {CHUNK}-token chunks through a KV cache):",
        "",
        "| form | perplexity |",
        "|---|---|",
        f"| kernel | {ppl['kernel']:.4f} |",
        f"| kernel-int8 | {ppl['kernel-int8']:.4f} ({(ppl['kernel-int8'] / ppl['kernel'] - 1) * 100:+.2f}%) |",
        "",
        f"Top-1 next token equal at {top1_agree * 100:.2f}% of the {len(scored['kernel'][1])} positions.",
        "",
        f"Greedy continuations, {args.tokens} tokens each, chat template: {identical} of {n} identical; "
        f"{matched} of {n * args.tokens} tokens before the first difference. At a difference, the float model's "
        "logit gap between its token and the int8 model's:",
        "",
        "| prompt | output | first difference | logit gap |",
        "|---|---|---|---|",
        *rows,
    ]
    text = "\n".join(lines) + "\n"
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
