"""Write a random mixture-of-experts checkpoint, quantized, to time the experts' products through mlxd.

No mixture-of-experts checkpoint ships with the project and the tests never download one, so this builds
mlx-lm's own ``qwen3_moe`` model with random weights (experts of OLMoE / Qwen3-30B-A3B's shape class, fewer
layers), quantizes it in bfloat16 with ``nn.quantize`` (MLX's affine format, as ``mlx_lm.convert -q`` writes
a bfloat16 model) and saves it with the embedded model's tokenizer. Its text is noise; its products cost
what a real model's of these shapes cost.

Run: .venv/bin/python scripts/write_moe_checkpoint.py OUT [--bits 4] [--group-size 64]
"""

from __future__ import annotations

import argparse
import json
import sys

from mlxd_fast_blas import ensure_fast_blas

SHAPE = dict(
    model_type="qwen3_moe",
    hidden_size=1024,
    num_hidden_layers=8,
    intermediate_size=2048,
    moe_intermediate_size=512,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=128,
    num_experts=32,
    num_experts_per_tok=4,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    norm_topk_prob=True,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    ensure_fast_blas()
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.models import qwen3_moe
    from mlx_lm.utils import load_tokenizer, save

    from mlxd_engine.loading.loader import embedded_model_path

    tokenizer_source = embedded_model_path()
    tokenizer = load_tokenizer(tokenizer_source)
    config = dict(SHAPE, vocab_size=json.loads((tokenizer_source / "config.json").read_text())["vocab_size"])
    mx.random.seed(args.seed)
    model = qwen3_moe.Model(qwen3_moe.ModelArgs.from_dict(config))

    # the router gate stays float (mlx-lm's own quantization keeps too-small layers as they are, the gate among them)
    def quantized(path: str, module) -> bool:
        return hasattr(module, "to_quantized") and path.split(".")[-1] != "gate"

    model.set_dtype(mx.bfloat16)  # as mlx-community checkpoints are stored: bfloat16 norms, scales and biases
    nn.quantize(model, group_size=args.group_size, bits=args.bits, class_predicate=quantized)
    mx.eval(model.parameters())
    config["quantization"] = {"group_size": args.group_size, "bits": args.bits}
    save(args.out, tokenizer_source, model, tokenizer, config)
    print(
        f"wrote {args.out}: qwen3_moe, {SHAPE['num_hidden_layers']} layers, {SHAPE['num_experts']} experts "
        f"(top {SHAPE['num_experts_per_tok']}), {args.bits}-bit, groups of {args.group_size}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
