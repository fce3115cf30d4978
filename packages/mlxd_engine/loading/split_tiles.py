"""The float kernel's tiles of 3-6 rows, split or whole: chosen at load by timing both forms on this CPU.

Tiles of 3-6 rows (a few decoding rows, a short draft's verify, the rest of a longer product's rows) can split their
weight blocks' halves as the tall tiles do (``mlxd_qmatmul.set_small_split_tiles``). Both forms give the same bits;
which is faster depends on the CPU: on a Zen 5 EPYC the split form took 0.91-0.94 of the whole form's time for a
decode step's products at 3-6 rows, on a Zen 4 EPYC, whose 512-bit operations are double-pumped, 1.05-1.28
(docs/benchmark_results/code_notes.md#small-split-tiles). So, as the weight rule times its forms, the engine times
both here: for each weight width the float kernel runs, the largest such matrix's copies (as many bytes as the
model's layers of that width hold, at most 64 MB: they stream from memory as a step's weights do, or sit in cache as a
small model's do) at ``ROWS`` rows (``AMX_ROWS`` where AMX takes 4-bit products of 6), the two forms alternating
``ROUNDS`` times; the split form is kept where the median of its paired ratios is at most ``MARGIN`` at every row
count (where a ratio is within ``CLOSE`` of it, the forms are timed once more and the two timings' mean decides).
``MLXD_SMALL_SPLIT_TILES`` = ``1`` or ``0`` sets the choice without timing.

Contract: ``choose_split_tiles(layers, int8_activations)`` sets the kernel's choice for every weight width among
``layers`` (``kernel_layers(model)``) and returns a phrase for the load log, or "" where there is nothing to choose
(no AVX-512, or every layer on the int8-activation kernel).
"""

from __future__ import annotations

import os
import statistics
import time

import mlx.core as mx

import mlxd_qmatmul

from .kernel_layers import largest_matrix

ENV = "MLXD_SMALL_SPLIT_TILES"
ROWS = (4, 6)  # the row counts timed: a few decoding rows, a short draft's verify
AMX_ROWS = (4, 5)  # where 4-bit products of 6 rows run on AMX's tiles instead (mlxd_qmatmul.amx_available())
ROUNDS = 7
MARGIN = 0.97  # the split form must take at most this share of the whole form's time
CLOSE = 0.03  # a ratio this near MARGIN is timed once more, and the two timings' mean decides
PASS_BYTES = 64 << 20  # packed weights per timed pass
MAX_COPIES = 256


def choose_split_tiles(layers: list, int8_activations: bool = False) -> str:
    """Set the float kernel's tile form for each weight width of ``layers`` (module docstring); the log's phrase."""
    if not mlxd_qmatmul.small_split_tiles_available():
        return ""
    by_bits: dict[int, list] = {}
    for layer in layers:
        on_int8 = int8_activations and mlxd_qmatmul.int8_available(layer.bits)
        if layer.group_size >= 32 and not on_int8:  # the float kernel's split tiles need groups of 32 or more
            by_bits.setdefault(layer.bits, []).append(layer)
    if not by_bits:
        return ""
    forced = os.environ.get(ENV, "").strip()
    if forced not in ("", "0", "1"):
        raise ValueError(f"{ENV}={forced!r}: 1 (split), 0 (whole) or unset (timed at load)")
    parts = []
    for bits, of_bits in sorted(by_bits.items()):
        if forced:
            mlxd_qmatmul.set_small_split_tiles(bits, forced == "1")
            parts.append(f"{bits}-bit {'split' if forced == '1' else 'whole'} ({ENV}={forced})")
            continue
        ratios = time_forms(of_bits)
        if any(abs(ratio - MARGIN) < CLOSE for ratio in ratios.values()):  # too near to call on one timing
            again = time_forms(of_bits)
            ratios = {rows: (ratio + again[rows]) / 2 for rows, ratio in ratios.items()}
        split = max(ratios.values()) <= MARGIN
        mlxd_qmatmul.set_small_split_tiles(bits, split)
        timed = ", ".join(f"{rows} rows {ratio:.3f}" for rows, ratio in ratios.items())
        parts.append(f"{bits}-bit {'split' if split else 'whole'} (split / whole: {timed})")
    return "tiles of 3-6 rows: " + "; ".join(parts)


def time_forms(layers: list) -> dict[int, float]:
    """For each of ``ROWS`` (``AMX_ROWS`` for 4-bit weights where AMX takes products of 6 rows): the median over
    ``ROUNDS`` of the split form's time over the whole form's, in alternating order, on copies of the largest of
    ``layers`` (one weight width). Leaves the whole form set."""
    w, s, b, group_size, bits = largest_matrix(layers)
    # as many bytes a pass as the layers of this width hold, at most PASS_BYTES: they stream from memory as a
    # step's would, or sit in cache as a small model's do
    held = sum(m["weight"].nbytes + m["scales"].nbytes + m["biases"].nbytes for m in layers)
    copies = max(2, min(MAX_COPIES, min(PASS_BYTES, held) // max(1, w.nbytes + s.nbytes + b.nbytes)))
    packed = [(w + 0, s + 0, b + 0) for _ in range(copies)]
    mx.eval(packed)
    in_dims = w.shape[1] * 32 // bits
    ratios = {}
    for rows in AMX_ROWS if mlxd_qmatmul.amx_available() and bits == 4 else ROWS:
        x = mx.random.normal((rows, in_dims), key=mx.random.key(rows))
        mx.eval(x)

        def one_pass(x=x):
            for pw, ps, pb in packed:
                mx.eval(mlxd_qmatmul.quantized_matmul(x, pw, ps, pb, group_size, bits))

        times: dict[bool, list[float]] = {False: [], True: []}
        for split in (False, True):  # a warm-up of each
            mlxd_qmatmul.set_small_split_tiles(bits, split)
            one_pass()
        for round_ in range(ROUNDS):
            for split in (False, True) if round_ % 2 == 0 else (True, False):
                mlxd_qmatmul.set_small_split_tiles(bits, split)
                start = time.perf_counter()
                one_pass()
                times[split].append(time.perf_counter() - start)
        mlxd_qmatmul.set_small_split_tiles(bits, False)
        ratios[rows] = statistics.median(on / off for on, off in zip(times[True], times[False]))
    return ratios
