"""Write a copy of a checkpoint with mlxd's CPU weight rule applied, for a library that lacks the rule.

The reference comparison gives mlx_lm.server this copy, so both servers compute with the same weights:
float32 throughout, quantized layers dequantized with float32 scales (packages/mlxd_engine/loading/cpu_weights.py).

Run: .venv/bin/python scripts/write_cpu_weights_copy.py MODEL OUT
"""

from __future__ import annotations

import sys

from mlxd_fast_blas import ensure_fast_blas


def main(model: str, out: str) -> int:
    ensure_fast_blas()
    from mlx_lm.utils import load, load_config, save

    from mlxd_engine.loading.cpu_weights import apply_cpu_weight_rule
    from mlxd_engine.loading.default_model import EMBEDDED_ALIASES
    from mlxd_engine.loading.loader import embedded_model_path

    model = str(embedded_model_path()) if model in EMBEDDED_ALIASES else model
    module, tokenizer = load(model)
    form = apply_cpu_weight_rule(module)
    config = load_config(__import__("pathlib").Path(model))
    config.pop("quantization", None)
    config.pop("quantization_config", None)
    config["torch_dtype"] = "float32"
    save(out, model, module, tokenizer, config)
    print(f"wrote {out}: {form}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
