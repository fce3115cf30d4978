"""The CPU quantized-matmul kernel alone: ms and GB/s of packed weights per shape and row count.

Each shape is timed over enough distinct copies of its weights (about 128 MB) that they stream from
memory, as a model's layers do, against MLX's own quantized matmul and float32 weights through BLAS.
Run: .venv/bin/python scripts/bench_qmatmul.py [--out docs/benchmark_results/qmatmul_kernel.md]
"""

from __future__ import annotations

import argparse
import platform
from pathlib import Path

from mlxd_fast_blas import ensure_fast_blas

ensure_fast_blas()

import mlx.core as mx  # noqa: E402

import mlxd_qmatmul  # noqa: E402
from mlxd_engine.kernel_layers import best_ms  # noqa: E402  (the same timing the load-time rule uses)

SHAPES = ((576, 1536), (1536, 576), (192, 576), (49152, 576))  # SmolLM2's projections and its tied head


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="1,2,4,8,16,32,72")
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=32)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    gs, bits = args.group_size, args.bits
    lines = [
        "# The CPU quantized-matmul kernel alone",
        "",
        f"Command: `.venv/bin/python scripts/bench_qmatmul.py --rows {args.rows} --bits {bits} --group-size {gs}`",
        "",
        f"Machine: {platform.machine()}, kernel {mlxd_qmatmul.kernel_isa()} on {mlxd_qmatmul.describe_threads()}; "
        f"MLX {mx.__version__}. Best of 3 passes over distinct weight copies (~128 MB packed, streamed from memory); "
        "float32 over 2 copies (cached where they fit).",
        "",
        "| shape (out x in) | rows | kernel ms | kernel GB/s (packed) | MLX quantized ms | float32 BLAS ms |",
        "|---|---|---|---|---|---|",
    ]
    for out_dims, in_dims in SHAPES:
        w = mx.random.normal((out_dims, in_dims), key=mx.random.key(0))
        wq, s, b = mx.quantize(w, group_size=gs, bits=bits)
        packed_bytes = wq.nbytes + s.nbytes + b.nbytes
        copies = max(1, (128 << 20) // packed_bytes)
        packs = [(wq + 0, s + 0, b + 0) for _ in range(copies)]
        dense = [mx.dequantize(wq, s, b, group_size=gs, bits=bits) + 0 for _ in range(2)]
        mx.eval(packs, dense)
        for n in rows:
            x = mx.random.normal((n, in_dims), key=mx.random.key(n))
            mx.eval(x)
            k = (
                best_ms(lambda x=x, packs=packs: [mlxd_qmatmul.quantized_matmul(x, *p, gs, bits) for p in packs], 3)
                / copies
            )
            few = packs[: max(1, copies // 8)]
            q = best_ms(
                lambda x=x, few=few: [
                    mx.quantized_matmul(x, *p, transpose=True, group_size=gs, bits=bits) for p in few
                ],
                2,
            ) / len(few)
            f = best_ms(lambda x=x, dense=dense: [x @ d.T for d in dense], 3) / len(dense)
            line = f"| {out_dims} x {in_dims} | {n} | {k:.3f} | {packed_bytes / k / 1e6:.1f} | {q:.3f} | {f:.3f} |"
            print(line, flush=True)
            lines.append(line)
        del packs, dense
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
