"""The CPU quantized-matmul kernel alone: ms and GB/s of packed weights per shape and row count.

It first measures the machine's streaming read bandwidth (numpy sums on one thread and on the kernel's
thread count) and reports each timing as a share of it. Each shape is timed over enough distinct copies
of its weights (about 128 MB) that they stream from
memory, as a model's layers do, against MLX's own quantized matmul and float32 weights through BLAS, and,
with ``--int8``, the opt-in int8-activation kernel (where the CPU has it) beside the float kernel, and with
``--split-small`` the float kernel again with its tiles of 3-6 rows split (``mlxd_qmatmul.set_small_split_tiles``:
the form the engine's load chooses where it is faster; the kernel column is the whole form).
Run: .venv/bin/python scripts/bench_qmatmul.py [--out docs/benchmark_results/qmatmul_kernel.md]
"""

from __future__ import annotations

import argparse
import platform
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mlxd_fast_blas import ensure_fast_blas

ensure_fast_blas()

import mlx.core as mx  # noqa: E402

import mlxd_qmatmul  # noqa: E402
from mlxd_engine.loading.kernel_layers import best_ms  # noqa: E402  (the same timing the load-time rule uses)

# SmolLM2's projections, its q/k/v and gate/up packed as the engine runs them (projection_groups.py), its tied head
BANDWIDTH = [1.0]  # GB/s of the kernel's thread count, measured in main()
SHAPES = ((576, 1536), (1536, 576), (192, 576), (960, 576), (3072, 576), (49152, 576))


def read_bandwidth(threads: int, mb_each: int = 128) -> float:
    """GB/s of ``threads`` threads each summing its own ``mb_each`` MB float32 array (numpy releases the GIL
    in the sum): the machine's streaming read bandwidth, best of 3."""
    import numpy as np

    arrays = [np.ones((mb_each << 20) // 4, dtype=np.float32) for _ in range(threads)]
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(3):
            start = time.perf_counter()
            list(pool.map(np.sum, arrays))
            best = min(best, time.perf_counter() - start)
    return threads * (mb_each << 20) / best / 1e9


def time_row(
    x, packs: list, dense: list, float32_scales: tuple, gs: int, bits: int, int8: bool, split: bool = False
) -> str:
    """The table cells of one row count: the kernel, MLX's quantized matmul, float32 BLAS (and int8, and the kernel
    with its tiles of 3-6 rows split)."""
    packed_bytes = sum(a.nbytes for a in packs[0])

    def kernel_ms(split_tiles: bool) -> float:
        if split:
            mlxd_qmatmul.set_small_split_tiles(bits, split_tiles)
        return best_ms(lambda: [mlxd_qmatmul.quantized_matmul(x, *p, gs, bits) for p in packs], 1) / len(packs)

    # with --split-small the two forms alternate, three passes each, the best of each kept (this VM's speed
    # moves from second to second: one form timed after the other would compare two minutes)
    k = t = float("inf")
    for _ in range(3):
        k = min(k, kernel_ms(False))
        if split:
            t = min(t, kernel_ms(True))
    if split:
        mlxd_qmatmul.set_small_split_tiles(bits, False)
    few = packs[: max(1, len(packs) // 8)]
    s32, b32 = float32_scales
    q = best_ms(
        lambda: [mx.quantized_matmul(x, p[0], s32, b32, transpose=True, group_size=gs, bits=bits) for p in few], 2
    ) / len(few)
    f = best_ms(lambda: [x @ d.T for d in dense], 3) / len(dense)
    gbs = packed_bytes / k / 1e6
    cells = f"{k:.3f} | {gbs:.1f} | {gbs / BANDWIDTH[0]:.2f} | {q:.3f} | {f:.3f} |"
    if int8:
        i = best_ms(lambda: [mlxd_qmatmul.quantized_matmul(x, *p, gs, bits, True) for p in packs], 3) / len(packs)
        cells += f" {i:.3f} | {packed_bytes / i / 1e6:.1f} | {k / i:.2f} |"
    if split:
        cells += f" {t:.3f} | {t / k:.3f} |"
    return cells


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="1,2,4,8,16,32,72")
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=32)
    parser.add_argument(
        "--scale-dtype",
        default="float32",
        choices=("float32", "float16", "bfloat16"),
        help="scales and biases as stored (checkpoints hold float16)",
    )
    parser.add_argument("--int8", action="store_true", help="also time the int8-activation kernel")
    parser.add_argument(
        "--split-small", action="store_true", help="also time the float kernel with its tiles of 3-6 rows split"
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    gs, bits = args.group_size, args.bits
    int8 = args.int8 and mlxd_qmatmul.int8_available(bits)
    split = args.split_small and mlxd_qmatmul.small_split_tiles_available()
    if args.split_small and not split:
        print("the float kernel here splits no small tiles (AVX-512 only): its column is left out")
    if args.int8 and not int8:
        print("no int8-activation kernel here (AVX-512 VNNI): its column is left out")
    flags = (
        (f" --scale-dtype {args.scale_dtype}" if args.scale_dtype != "float32" else "")
        + (" --int8" if args.int8 else "")
        + (" --split-small" if args.split_small else "")
    )
    int8_head = " int8 kernel ms | int8 GB/s | kernel / int8 |" if int8 else ""
    split_head = " split tiles ms | split / whole |" if split else ""
    threads = mlxd_qmatmul.kernel_threads(1)
    one, every = read_bandwidth(1), read_bandwidth(max(1, threads))
    BANDWIDTH[0] = every
    lines = [
        "# The CPU quantized-matmul kernel alone",
        "",
        "Command: `.venv/bin/python scripts/bench_qmatmul.py "
        f"--rows {args.rows} --bits {bits} --group-size {gs}{flags}`",
        "",
        f"Machine: {platform.machine()}, kernel {mlxd_qmatmul.kernel_isa()} on {mlxd_qmatmul.describe_threads()}; "
        f"MLX {mx.__version__}. Best of 3 passes over distinct weight copies (~128 MB packed, streamed from memory); "
        "float32 over 2 copies (cached where they fit).",
        "",
        f"Scales and biases {args.scale_dtype}.",
        "",
        f"This machine's streaming read bandwidth (numpy sums of 128 MB arrays, best of 3): {one:.1f} GB/s on one "
        f"thread, {every:.1f} GB/s on {threads} (the kernel's thread count); \"of bandwidth\" is the kernel's GB/s "
        "over the latter.",
        "",
        "| shape (out x in) | rows | kernel ms | kernel GB/s (packed) | of bandwidth | MLX quantized ms "
        "| float32 BLAS ms |" + int8_head + split_head,
        "|---|---|---|---|---|---|---|" + ("---|---|---|" if int8 else "") + ("---|---|" if split else ""),
    ]
    for out_dims, in_dims in SHAPES:
        w = mx.random.normal((out_dims, in_dims), key=mx.random.key(0))
        wq, s, b = mx.quantize(w, group_size=gs, bits=bits)
        s32, b32 = s, b  # MLX's own paths run float32 scales (float16 math is slow on the CPU)
        s, b = s.astype(getattr(mx, args.scale_dtype)), b.astype(getattr(mx, args.scale_dtype))
        packed_bytes = wq.nbytes + s.nbytes + b.nbytes
        copies = max(1, (128 << 20) // packed_bytes)
        packs = [(wq + 0, s + 0, b + 0) for _ in range(copies)]
        dense = [mx.dequantize(wq, s32, b32, group_size=gs, bits=bits) + 0 for _ in range(2)]
        mx.eval(packs, dense)
        for n in rows:
            x = mx.random.normal((n, in_dims), key=mx.random.key(n))
            mx.eval(x)
            line = f"| {out_dims} x {in_dims} | {n} | " + time_row(x, packs, dense, (s32, b32), gs, bits, int8, split)
            print(line, flush=True)
            lines.append(line)
        del packs, dense
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
