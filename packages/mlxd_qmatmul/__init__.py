"""mlxd's CPU kernels: MLX's affine 4-bit and 8-bit weights read at memory speed, RoPE, RMSNorm,
attention and SwiGLU as one op each.

Why: MLX's own CPU quantized matmul recomputes the dequantization for every input row, and float32
copies of the weights read 4 bytes a weight where the checkpoint holds 0.5-1. This MLX extension (a C++
``Primitive`` with ``eval_cpu``, ``native/``) decodes each block of weights once per tile of rows, in
registers, with SIMD chosen at run time (AVX-512, AVX2 + FMA, SSE2 / NEON), its output columns cut into
tasks, each core taking a run of adjacent ones and then what the others leave (a core the OS takes away
holds back one task, not a share). Figures: docs/benchmark_results/qmatmul_kernel.md.

Contract:
- ``available()`` is True when the extension was built (``make setup`` runs ``scripts/build_qmatmul.sh``)
  and imports; ``unavailable_reason()`` says why not, for the log (the engine then keeps its float32 rule).
- ``quantized_matmul(x, w, scales, biases, group_size, bits)`` equals
  ``mx.quantized_matmul(x, w, scales, biases, transpose=True, group_size=..., bits=..., mode="affine")``
  within float32 rounding, for bits 4 and 8 and group sizes 32, 64, 128; CPU only; float32 math. 8 bits also
  in groups of 16 (``SMALL_GROUP``), which MLX does not have: the float64 product of the dequantized weights
  within float32 rounding (a GGUF file's K-quant sub-blocks, ``mlxd_engine.loading.group16``).
- ``rope(x, offset, dims, traditional, base, scale)``: RoPE as one op, bit-identical to ``mx.fast.rope`` on
  the CPU (same formula, MLX's own exp / sin / cos).
- ``rms_norm(x, weight, eps)``: RMSNorm as one op, bit-identical to ``mx.fast.rms_norm`` on the CPU.
- ``attention(q, k, v, scale, causal, mask)``: attention for a few queries as one op (within float32
  rounding of ``mx.fast.scaled_dot_product_attention``); its softmax takes MLX's exp eight floats at a time.
- ``swiglu(gate, up)``: mlx-lm's SwiGLU as one op, bit-identical to MLX's CPU result (native/vector_math.h:
  MLX's exp and sigmoid with the CPU's vector FMA, where MLX's x86-64 wheel calls a software fma per term).
- ``write_rows(buffer, rows, index)``: rows written into a buffer at the rows an index names, as one CPU op,
  in place when nothing else holds the buffer (a KV cache's update for rows at different positions: MLX's
  scatter builds a dozen index ops around each one).
- ``quantized_matmul(..., int8_activations=True)``: the opt-in int8-activation variant (4 and 8 bits,
  AVX-512 VNNI; ``int8_available()``), not within float32 rounding: x in blocks of 8 (``MLXD_INT8_BLOCK=16`` or
  ``32`` for coarser ones, ``int8_block()``); their greedy agreement and perplexity are in
  docs/benchmark_results/qmatmul_int8.md and qmatmul_int8_block32.md.
- ``interleave_columns(w, scales, biases, sizes)``: 4- or 8-bit weights put in column-block order, which the int8
  kernel reads 16 output columns at a time (``quantized_matmul(..., int8_activations=True, column_blocks=True)``;
  ``dequantized_rows(..., column_blocks=True)`` looks rows up in it): the same arrays' shapes, dtypes and bytes,
  rearranged within each block of 16 columns of each part. No float path reads that order (``INT8_OFF`` /
  ``INT8_ROWS`` / ``INT8_COLUMNS`` name the three ways a product runs).
- ``quantized_matmul_split(..., sizes)``: the product of a weight packed from several layers' rows, one
  output per layer, each equal to that layer's own ``quantized_matmul`` (one op for q/k/v or gate/up).
- ``gather_quantized_matmul(x, w, scales, biases, experts, group_size, bits)``: a mixture-of-experts layer's
  products (mlx-lm's ``QuantizedSwitchLinear``, ``mx.gather_qmm``): each row of x times its expert's weights,
  within float32 rounding; rows are put in order of their expert and each expert's rows run as one product.
- ``dequantized_rows(w, scales, biases, ids, group_size, bits)``: rows of a packed affine matrix dequantized to
  float32 by index as one CPU op (a quantized embedding's lookup), bit for bit ``mx.dequantize`` of the gathered
  rows with float32 scales and biases (MLX's CPU builds that from about forty ops).
- ``supports(bits, group_size, mode)`` says whether a layer's format is one the kernel takes.
- ``amx_available()``: products of 6 rows or more (8 or more with 8-bit weights: a verify, a batch, a prompt
  chunk) run on Intel AMX's tile units where the CPU and OS have them, still within float32 rounding (x split
  into three exact bfloat16 pieces; native/kernel_amx.cpp); ``MLXD_QMM_AMX=0`` turns that off.
- ``set_small_split_tiles(bits, on)``: the float kernel's tiles of 3-6 rows split their blocks' halves as the tall
  tiles do (the same results; faster or slower by CPU: the engine times both at load).
- ``kernel_isa()`` / ``kernel_threads()``: what it runs with here. ``MLXD_QMM_ISA`` (avx512, avx2, sse2,
  neon) forces a narrower instruction set, ``MLXD_QMM_THREADS`` the thread count (default: every core, for
  decode's few rows too: one thread does not reach the memory bandwidth), ``MLXD_QMM_SPIN_US`` how long an
  idle worker spins for the next product before it sleeps (default 20: longer spins take the core the
  serving thread builds the next step on).
"""

from __future__ import annotations

BITS = (4, 8)
GROUP_SIZES = (32, 64, 128)
# Groups of 16 weights, 8-bit codes only: not an MLX format (mx.quantize refuses 16), the form mlxd gives
# llama.cpp's K-quants with 16-weight sub-blocks (Q6_K, Q3_K, Q2_K) read from a GGUF file
# (mlxd_engine.loading.group16).
SMALL_GROUP = 16
# Elements of x sharing one scale on the int8-activation kernel: 8, or what MLXD_INT8_BLOCK asks of INT8_BLOCKS
# (read once by the extension: int8_block())
INT8_BLOCK_ENV = "MLXD_INT8_BLOCK"
INT8_BLOCKS = (8, 16, 32)
# How a product meets its weights (Int8Mode in native/kernel.h): float32 x; x rounded to int8 against weights in
# MLX's order; x rounded to int8 against 4-bit weights in column-block order (interleave_columns)
INT8_OFF, INT8_ROWS, INT8_COLUMNS = 0, 1, 2
COLUMN_BLOCK = 16  # output columns of one block of column-block order


def _load():
    """The extension module and "" when it loads and computes one small product right, else None and why."""
    from pathlib import Path

    if not any(Path(__file__).parent.glob("_ext*")):
        return None, "the CPU quantized-matmul extension is not built (make setup builds it: cmake and a C++ compiler)"
    try:
        from . import _ext  # lazy: optional, built by scripts/build_qmatmul.sh; available() says why it is absent
    except ImportError as error:  # not built, or built against another mlx
        return None, f"the CPU quantized-matmul extension is not built or does not load ({error}); run make setup"
    try:  # a module built with another nanobind ABI than mlx's imports, then refuses mlx arrays
        import mlx.core as mx

        w = mx.arange(64 * 32, dtype=mx.float32).reshape(32, 64) / 1000
        wq, s, b = mx.quantize(w, group_size=32, bits=4)
        x = mx.ones((1, 64))
        got = _ext.quantized_matmul(x, wq, s, b, 32, 4)
        want = mx.quantized_matmul(x, wq, s, b, transpose=True, group_size=32, bits=4)
        if not mx.allclose(got, want, rtol=1e-4, atol=1e-4).item():
            return None, "the CPU quantized-matmul extension gives wrong results here; not used"
    except Exception as error:  # noqa: BLE001 - any failure means: run without it
        return None, f"the CPU quantized-matmul extension does not run with this mlx ({type(error).__name__}: {error})"
    return _ext, ""


_ext, _REASON = _load()


def available() -> bool:
    return _ext is not None


def unavailable_reason() -> str:
    return _REASON


def supports(bits: int, group_size: int, mode: str = "affine") -> bool:
    return mode == "affine" and bits in BITS and (group_size in GROUP_SIZES or (group_size, bits) == (SMALL_GROUP, 8))


def asked_int8_block() -> int:
    """The block MLXD_INT8_BLOCK asks for (8 when unset); a ValueError naming the variable for another value."""
    import os

    wanted = os.environ.get(INT8_BLOCK_ENV, "").strip()
    if not wanted:
        return INT8_BLOCKS[0]
    if wanted not in {str(block) for block in INT8_BLOCKS}:
        raise ValueError(f"{INT8_BLOCK_ENV}={wanted!r}: the int8 kernel rounds x in blocks of 8, 16 or 32 elements")
    return int(wanted)


def int8_block() -> int:
    """Elements of x that share one int8 scale on the int8-activation kernel in this process: 8, or 16 or 32 where
    MLXD_INT8_BLOCK asks (llama.cpp's Q8 activations use 32: fewer conversions and scalings a row in the column
    tiles, a coarser rounding of x)."""
    return _ext.int8_block() if _ext is not None else asked_int8_block()


def int8_mode(int8_activations: bool, column_blocks: bool = False) -> int:
    """The ``INT8_*`` mode of a product asked for with these flags (column blocks only with int8)."""
    if column_blocks and not int8_activations:
        raise ValueError("column-block weights are read by the int8 kernel only: pass int8_activations=True")
    return INT8_COLUMNS if column_blocks else INT8_ROWS if int8_activations else INT8_OFF


def int8_flags(mode: int) -> tuple[bool, bool]:
    """``(int8_activations, column_blocks)`` of an ``INT8_*`` mode: ``int8_mode``'s inverse, for a caller that
    keeps the mode (the engine's layers) and calls ``quantized_matmul``."""
    return mode != INT8_OFF, mode == INT8_COLUMNS


def quantized_matmul(
    x, w, scales, biases, group_size: int, bits: int, int8_activations: bool = False, column_blocks: bool = False
):
    """With ``int8_activations`` (where ``int8_available(bits)``), x is rounded to int8 in blocks of
    ``int8_block()`` elements (one float scale each, as llama.cpp's Q8 activations, in blocks of 32) and
    multiplied with the weights' codes as integers: faster than the float kernel, results near the float
    product instead of within float32 rounding. Elsewhere the flag is ignored and the float kernel runs.
    ``column_blocks``: ``w``, ``scales`` and ``biases`` come from ``interleave_columns`` (int8 only, groups of 32
    or more, and a ValueError where this CPU has no int8 kernel: no other path reads that order). Each row's
    result then has the same bits whatever the number of rows."""
    if _ext is None:
        raise RuntimeError(_REASON)
    mode = int8_mode(int8_activations, column_blocks)
    return _ext.quantized_matmul(x, w, scales, biases, group_size, bits, int8_activations=mode)


def quantized_matmul_split(
    x, w, scales, biases, group_size: int, bits: int, sizes, int8_activations: bool = False, column_blocks: bool = False
):
    """``quantized_matmul`` for a weight packed from several layers' rows (``sizes``: each layer's output
    count, in order, summing to the rows of ``w``): one output per layer, each dense and equal to that
    layer's own ``quantized_matmul``, computed as one op and one job on the kernel's threads. With
    ``column_blocks``, each part in the order ``interleave_columns(..., sizes)`` gives."""
    if _ext is None:
        raise RuntimeError(_REASON)
    mode = int8_mode(int8_activations, column_blocks)
    return _ext.quantized_matmul_split(x, w, scales, biases, group_size, bits, list(sizes), int8_activations=mode)


def interleave_columns(w, scales, biases, sizes=None):
    """Packed weights ``w`` [N, K * bits / 32] (uint32, 4 or 8 bits) with their ``scales`` and ``biases`` [N,
    groups] in column-block order, as new arrays of the same shapes and dtypes: each part of ``sizes`` (default:
    one part of N rows) in blocks of ``COLUMN_BLOCK`` rows, the last of a part possibly fewer (``count``), and
    within a block of ``count`` rows its words as [K * bits / 32][count] (word j of a row: its 32 / bits
    elements from j * 32 / bits) and its scales and biases as [groups][count]. Rearranged, not changed: the
    inverse puts back the same bits."""
    import mlx.core as mx

    sizes = [int(w.shape[0])] if sizes is None else [int(size) for size in sizes]
    if sum(sizes) != w.shape[0] or any(size <= 0 for size in sizes):
        raise ValueError(f"sizes {sizes} do not split the {w.shape[0]} rows of w")

    def blocked(a):
        pieces, start = [], 0
        for size in sizes:
            whole = size // COLUMN_BLOCK * COLUMN_BLOCK
            if whole:
                part = a[start : start + whole].reshape(whole // COLUMN_BLOCK, COLUMN_BLOCK, -1)
                pieces.append(part.transpose(0, 2, 1).reshape(whole, -1))
            if size > whole:
                count = size - whole
                pieces.append(a[start + whole : start + size].T.reshape(count, -1))
            start += size
        out = mx.concatenate(pieces, axis=0) if len(pieces) > 1 else mx.contiguous(pieces[0])
        return out

    out = (blocked(w), blocked(scales), blocked(biases))
    mx.eval(*out)
    return out


def gather_quantized_matmul(x, w, scales, biases, experts, group_size: int, bits: int):
    """A mixture-of-experts layer's products: row r of ``x`` [..., K] times ``dequantize(w[experts[r]]).T``,
    with ``w`` [E, N, K * bits / 32] and its scales and biases [E, N, K / group_size], ``experts`` one integer a
    row. Equals ``mx.gather_qmm(x[..., None, :], w, scales, biases, rhs_indices=experts, transpose=True,
    ...)`` within float32 rounding; the rows of each expert run as one product on the kernel."""
    if _ext is None:
        raise RuntimeError(_REASON)
    return _ext.gather_quantized_matmul(x, w, scales, biases, experts, group_size, bits)


def dequantized_rows(w, scales, biases, ids, group_size: int, bits: int, column_blocks: bool = False):
    """Rows ``ids`` (any integer shape) of the packed affine matrix ``w`` [N, K * bits / 32] (bits 4 or 8) as
    float32 [ids..., K]: ``mx.dequantize(w[ids], scales[ids], biases[ids])`` with the scales and biases widened
    to float32, to the bit, in one op; an id outside [0, N) gives zeros. ``column_blocks``: the arrays are in
    ``interleave_columns`` order (one part), and the rows are those of the arrays before it."""
    if _ext is None:
        raise RuntimeError(_REASON)
    return _ext.dequantized_rows(w, scales, biases, ids, group_size, bits, column_blocks=column_blocks)


def int8_available(bits: int = 4) -> bool:
    """Whether ``int8_activations`` takes effect for this many bits here (4 or 8, on a CPU with AVX-512 VNNI)."""
    return _ext is not None and _ext.int8_available(bits)


def rope(x, offset, dims: int, traditional: bool, base: float, scale: float):
    """``mx.fast.rope(x, dims, traditional=, base=, scale=, offset=offset)`` as one CPU op (MLX's CPU backend
    builds it from about a dozen); float32 ``x`` with at least 3 axes, an int32 ``offset`` array (a scalar
    or one per entry of x's first axis); bit-identical to MLX's result."""
    if _ext is None:
        raise RuntimeError(_REASON)
    return _ext.rope(x, offset, dims, traditional, base, scale)


def rms_norm(x, weight, eps: float):
    """``mx.fast.rms_norm(x, weight, eps)`` as one CPU op (MLX's CPU backend builds it from four); float32
    ``x`` and ``weight``; bit-identical to MLX's result."""
    if _ext is None:
        raise RuntimeError(_REASON)
    return _ext.rms_norm(x, weight, eps)


def attention(q, k, v, scale: float, causal: bool = False, mask=None):
    """``mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=...)`` as one CPU op, for float32
    ``[B, heads, L, D]`` queries against ``[B, kv_heads, S, D]`` keys and values (any strides): no mask,
    ``causal``, or a boolean / additive float32 ``mask`` broadcasting to ``[B, heads, L, S]``; equal within
    float32 rounding. Single-threaded: meant for a few queries (decode steps, verify forwards)."""
    if _ext is None:
        raise RuntimeError(_REASON)
    return _ext.attention(q, k, v, scale, causal, mask)


def swiglu(gate, up):
    """mlx-lm's ``swiglu(gate, up)`` (``silu(gate) * up``) as one CPU op with a vectorised exp (MLX's x86-64
    CPU backend evaluates exp one float at a time through a software fma); float32 arrays of one shape;
    bit-identical to MLX's result."""
    if _ext is None:
        raise RuntimeError(_REASON)
    return _ext.swiglu(gate, up)


def write_rows(buffer, rows, index):
    """``buffer`` with ``rows`` (``index.size`` rows of its last axis, row-major) written at its rows
    ``index`` (int32, distinct; ``buffer`` viewed as ``[size / D, D]``) as one CPU op: the same result as
    ``flat = buffer.reshape(-1, D); flat[index] = rows.reshape(-1, D)``, in place when nothing else holds the
    buffer (as MLX's slice updates), else on a copy. Any dtype (``rows``' the buffer's), or float32 rows into a
    float16 buffer: each value then rounds as a cast would, except that one past half's range is kept as +-65504
    rather than inf."""
    if _ext is None:
        raise RuntimeError(_REASON)
    return _ext.write_rows(buffer, rows, index)


def attention_input(
    x,
    norm_weight,
    eps: float,
    qkv,
    heads: int,
    kv_heads: int,
    head_dim: int,
    offset,
    rope,
    bias=None,
    qk_norms=None,
    int8_activations: int = INT8_OFF,
    lengths=None,
):
    """A llama-style layer's attention input as one CPU op: ``rms_norm(x)``, the packed q/k/v product
    (``qkv``: weight, scales, biases, group_size, bits, sizes) plus ``bias`` (the packed q/k/v bias, or None),
    each query and key head through its RMSNorm where ``qk_norms`` is (q weight, k weight, eps), RoPE at
    ``offset`` (an int32 array: a scalar or one per batch entry; ``rope``: dims, traditional, base, scale);
    ``int8_activations``: the product's ``INT8_*`` mode (``int8_mode``). Returns (q, k, v), each
    ``[B, heads, L, head_dim]``, bit-identical to those ops run one by one. ``lengths`` (an integer array, one
    count per batch entry, or None): only each entry's first tokens are computed and the rest, padding nothing
    reads, come out as zeros, so a batch of rows of different widths costs its real tokens."""
    if _ext is None:
        raise RuntimeError(_REASON)
    w, scales, biases, group_size, bits, sizes = qkv
    dims, traditional, base, scale = rope
    q_norm, k_norm, qk_eps = qk_norms if qk_norms is not None else (None, None, 0.0)
    return _ext.attention_input(
        x,
        norm_weight,
        eps,
        w,
        scales,
        biases,
        group_size,
        bits,
        list(sizes),
        heads,
        kv_heads,
        head_dim,
        offset,
        dims,
        traditional,
        base,
        scale,
        bias,
        q_norm,
        k_norm,
        qk_eps,
        int8_activations,
        lengths,
    )


def _layer_weights(o, norm_weight, eps: float, gate_up, down) -> tuple:
    """The arguments both layer-output bindings take after the attention's scale, in their order: o's, the norm,
    gate/up's and its hidden size, down's, then the three products' ``INT8_*`` modes. ``o``, ``gate_up`` and
    ``down`` are (weight, scales, biases, group_size, bits[, int8 mode])."""
    (*o_args, o_int8), (*gu_args, gu_int8), (*d_args, d_int8) = (
        tuple(w) + (INT8_OFF,) * (6 - len(w)) for w in (o, gate_up, down)
    )
    hidden = gate_up[0].shape[0] // 2
    return (*o_args, norm_weight, eps, *gu_args, hidden, *d_args, o_int8, gu_int8, d_int8)


def block_output(
    x,
    q,
    keys,
    values,
    mask,
    causal: bool,
    attention_scale: float,
    o,
    norm_weight,
    eps: float,
    gate_up,
    down,
    lengths=None,
):
    """A llama-style layer after its cache update as one CPU op: ``h = x + o(attention(q, keys, values))``,
    then ``h + down(swiglu(gate, up))`` with gate and up from ``rms_norm(h) @ gate_up``. ``o``, ``gate_up``
    and ``down`` are (weight, scales, biases, group_size, bits[, int8 mode]); ``mask`` as ``attention``
    takes it.
    Bit-identical to those ops run one by one. ``lengths`` as for ``attention_input``: the padding's rows
    come out as ``x``."""
    if _ext is None:
        raise RuntimeError(_REASON)
    weights = _layer_weights(o, norm_weight, eps, gate_up, down)
    return _ext.block_output(x, q, keys, values, mask, causal, attention_scale, *weights, lengths)


def block_output_span(
    x,
    q,
    k_buf,
    v_buf,
    first_slot: int,
    read_length: int,
    mask,
    causal: bool,
    attention_scale: float,
    o,
    norm_weight,
    eps: float,
    gate_up,
    down,
    lengths=None,
):
    """``block_output`` over a layer's whole key and value buffers [slots, kv_heads, capacity, dim] (the
    forward's new rows already written): the attention reads slots [first_slot, first_slot + B) at positions
    [0, read_length), as ``block_output`` reads those slices of them. The same bits, without the slices' ops on
    the CPU stream (docs/benchmark_results/code_notes.md#eval-handoffs)."""
    if _ext is None:
        raise RuntimeError(_REASON)
    weights = _layer_weights(o, norm_weight, eps, gate_up, down)
    return _ext.block_output_span(
        x, q, k_buf, v_buf, first_slot, read_length, mask, causal, attention_scale, *weights, lengths
    )


def amx_available() -> bool:
    """Whether products of several rows (6 or more) run on the AMX kernel here: an Intel CPU with AMX, the
    OS granting its tile state, and ``MLXD_QMM_AMX`` not ``0``."""
    return _ext is not None and _ext.amx_available()


def small_split_tiles_available() -> bool:
    """Whether the float kernel here can split its tiles of 3-6 rows (AVX-512): the same results, faster on some
    CPUs and slower on others, so the engine times both forms at load (``mlxd_engine.loading.split_tiles``)."""
    return _ext is not None and _ext.small_split_tiles_available()


def set_small_split_tiles(bits: int, on: bool) -> None:
    """Split (or not) the float kernel's tiles of 3-6 rows in products of ``bits``-bit weights set up from now on."""
    if _ext is None:
        raise RuntimeError(_REASON)
    _ext.set_small_split_tiles(bits, on)


def small_split_tiles(bits: int) -> bool:
    """Whether products of ``bits``-bit weights split their tiles of 3-6 rows."""
    return _ext is not None and _ext.small_split_tiles(bits)


def kernel_isa() -> str:
    return _ext.kernel_isa() if _ext is not None else "none"


def kernel_threads(rows: int = 1) -> int:
    """Threads a product of ``rows`` rows runs on (0 where the kernel is not built)."""
    return _ext.kernel_threads(rows) if _ext is not None else 0


def describe_threads() -> str:
    """E.g. "2 threads" (the rule in native/dispatch.cpp: every product on the same count)."""
    threads = kernel_threads(1)
    return f"{threads} thread{'s' if threads > 1 else ''}"
