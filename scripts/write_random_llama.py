"""Write a random float32 llama checkpoint of a chosen shape, to time weight formats of that shape through mlxd.

No llama of a 1B model's shape ships with the project and the tests never download one, so this builds mlx-lm's
own ``llama`` model with random weights and saves it with stories260K's SentencePiece tokenizer and llama2.c's
rotary layout (``rope_traditional``), which ``scripts/write_stories_gguf.py`` writes as a GGUF file and
``scripts/write_gguf_quants.py`` then writes in llama.cpp's quantized types. Its text is noise; its products
cost what a real model's of these shapes cost. The defaults are TinyLlama-1.1B's shape with 4 of its 22 layers
(every matrix a multiple of 256 wide, so llama.cpp's K types apply to all of them).

Run: .venv/bin/python scripts/write_random_llama.py OUT [--hidden 2048 --intermediate 5632 --layers 4
     --heads 32 --kv-heads 4 --vocab 32000]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STORIES_260K = ROOT / "models" / "stories260K"  # the project's copy: the tokenizer's source
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=5632)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm.models import llama

    config = dict(
        model_type="llama",
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        rms_norm_eps=1e-5,
        vocab_size=args.vocab,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        rope_traditional=True,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = llama.Model(llama.ModelArgs.from_dict(config))
    mx.random.seed(args.seed)
    params = [
        (name, mx.random.normal(p.shape) * (0.02 if p.ndim > 1 else 0.1) + (1.0 if "norm" in name else 0.0))
        for name, p in tree_flatten(model.parameters())
    ]
    model.update(tree_unflatten(params))
    mx.eval(model.parameters())
    args.out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(args.out / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (args.out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        shutil.copy(STORIES_260K / name, args.out / name)
    print(f"wrote {args.out}: llama, hidden {args.hidden}, {args.layers} layers, vocabulary {args.vocab}, float32")
    return 0


if __name__ == "__main__":
    sys.exit(main())
