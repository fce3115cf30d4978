"""Llama-style decoder layers as two ops each on the CPU kernel: the attention input, and the rest after the
cache update.

Contract: ``fuse_blocks(model)`` changes, in place, every layer of ``model`` whose class is exactly one of
``FAMILIES``' ``TransformerBlock`` (mlx-lm's llama: SmolLM2, Llama, Mistral-style checkpoints; qwen2, with its
q/k/v biases; qwen3, with its per-head q/k norms) and whose projections all run on the CPU kernel (q/k/v and
gate/up packed by ``projection_groups``; no biases but qwen2's q/k/v; int8 activations or not), with plain
RMSNorm and RoPE modules, into that class's fused subclass: same parameters, same module tree. Returns how many
layers are fused. A fused layer called with float32 input of at most the kernel's row limit runs
``mlxd_qmatmul.attention_input``, the cache's ``update_and_fetch`` (unchanged: every storage kind, the
compiled step's buffers), then ``mlxd_qmatmul.block_output``; where the cache writes in place
(``update_in_place``: the contiguous storage, rows in adjacent slots) the writes, then
``mlxd_qmatmul.block_output_span`` over the layer's whole buffers, without the slices' ops. Either way the
result is bit-identical to the layer's own ops on the kernel (tests/engine/test_fused_blocks.py). In a verify
forward of rows of different widths both ops compute the real tokens only (``ragged.py``). Anything else
(prompt chunks past the row limit, another dtype, a quantized cache, a mask or cache the one-op attention does
not take) runs the layer's stock ``__call__``. Applied by ``Engine`` with the other CPU fusions;
``MLXD_FUSE_BLOCKS=0`` keeps layers op by op. Why: docs/benchmark_results/code_notes.md#fused-blocks,
#eval-handoffs.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

import mlxd_qmatmul

from .cpu_fusion import _STOCK_ATTENTION, FusedRMSNorm, FusedRoPE, _one_op_attention_applies, _one_op_mask_applies
from .loading.kernel_layers import KernelQuantizedLinear
from .loading.projection_groups import GroupedQuantizedLinear, ProjectionGroup
from .ragged import lengths_for

DISABLE_ENV = "MLXD_FUSE_BLOCKS"
_NORMS = (nn.RMSNorm, FusedRMSNorm)
_ROPES = (nn.RoPE, FusedRoPE)


def _families() -> dict[type, tuple[type, type, bool, bool]]:
    """TransformerBlock class -> (its Attention class, its MLP class, q/k/v biases, per-head q/k norms), for
    the mlx-lm model files whose layers compute exactly llama's ``__call__`` (with those two additions)."""
    families: dict[type, tuple[type, type, bool, bool]] = {}
    for name, bias, qk_norm in (("llama", False, False), ("qwen2", True, False), ("qwen3", False, True)):
        try:
            module = importlib.import_module(f"mlx_lm.models.{name}")
        except ImportError:
            continue
        families[module.TransformerBlock] = (module.Attention, module.MLP, bias, qk_norm)
    return families


FAMILIES = _families()


def blocks_wanted() -> bool:
    return os.environ.get(DISABLE_ENV, "1").strip() != "0" and mlxd_qmatmul.available()


def _packed(layer) -> tuple:
    """(weight, scales, biases, group_size, bits, int8 mode: ``mlxd_qmatmul.INT8_*``) of a kernel layer or a
    projection group."""
    int8 = layer.int8 if isinstance(layer, ProjectionGroup) else layer.kernel_int8
    return (layer.weight, layer.scales, layer.biases, layer.group_size, layer.bits, int8)


def _plain_kernel_layer(layer) -> bool:
    return type(layer) is KernelQuantizedLinear and "bias" not in layer


def _group_of(layers: list, bias: bool = False) -> ProjectionGroup | None:
    """The projection group that packs exactly ``layers``, in order, with a bias when ``bias`` (else none)."""
    if not all(type(layer) is GroupedQuantizedLinear for layer in layers):
        return None
    group = layers[0].projection_group
    if group.layers != layers or (group.bias is not None) != bias:
        return None
    if bias and group.bias.dtype != mx.float32:
        return None
    return group


def _float32_norm(norm) -> bool:
    return type(norm) in _NORMS and norm.weight.dtype == mx.float32


def _fusable(block: Any) -> bool:
    family = FAMILIES.get(type(block))
    if family is None:
        return False
    attention_class, mlp_class, bias, qk_norm = family
    attn: Any = block.self_attn
    mlp: Any = block.mlp
    if (type(attn), type(mlp)) != (attention_class, mlp_class):
        return False
    if not (_float32_norm(block.input_layernorm) and _float32_norm(block.post_attention_layernorm)):
        return False
    if qk_norm and not (
        _float32_norm(attn.q_norm) and _float32_norm(attn.k_norm) and attn.q_norm.eps == attn.k_norm.eps
    ):
        return False
    if type(attn.rope) not in _ROPES:
        return False
    if not (_plain_kernel_layer(attn.o_proj) and _plain_kernel_layer(mlp.down_proj)):
        return False
    qkv = _group_of([attn.q_proj, attn.k_proj, attn.v_proj], bias)
    gate_up = _group_of([mlp.gate_proj, mlp.up_proj])
    if qkv is None or gate_up is None or qkv.sizes[0] % attn.n_heads:
        return False
    head_dim = qkv.sizes[0] // attn.n_heads
    return qkv.sizes[1:] == [attn.n_kv_heads * head_dim] * 2


@dataclass(frozen=True)
class FusedArguments:
    """A fused layer's arguments to its two ops that do not change from call to call (its weights, norms, head
    shapes, RoPE settings), gathered on its first call: a decode step builds 30 layers' ops, and reading these
    through nn.Module's attribute lookups again each time cost about a third of the step's graph building. A
    plain object, not a tuple, so nn.Module keeps it as an attribute, outside the layer's parameters."""

    max_rows: int  # the kernel's row limit of the q/k/v product (more rows: the stock layer)
    # attention_input's arguments between x and the offset: norm weight, eps, q/k/v, heads, kv heads, head_dim
    attention_input: tuple[mx.array, float, tuple, int, int, int]
    rope: tuple  # (dims, traditional, base, scale)
    bias: Any  # the packed q/k/v bias, or None
    qk_norms: tuple | None
    int8: int  # mlxd_qmatmul.INT8_* of the q/k/v product
    scale: float
    # block_output's arguments after the attention's scale: o, norm weight, eps, gate/up, down
    block_output: tuple[tuple, mx.array, float, tuple, tuple]

    @classmethod
    def of(cls, block: FusedBlock) -> FusedArguments:
        attn, mlp = block.self_attn, block.mlp
        qkv = attn.q_proj.projection_group
        rope = attn.rope
        w, scales, biases, group_size, bits, int8 = _packed(qkv)
        norm = block.input_layernorm
        return cls(
            max_rows=min(layer.kernel_max_rows for layer in qkv.layers),
            attention_input=(
                norm.weight,
                norm.eps,
                (w, scales, biases, group_size, bits, qkv.sizes),
                attn.n_heads,
                attn.n_kv_heads,
                qkv.sizes[0] // attn.n_heads,
            ),
            rope=(rope.dims, rope.traditional, rope.base, rope.scale),
            bias=qkv.bias,
            qk_norms=(attn.q_norm.weight, attn.k_norm.weight, attn.q_norm.eps) if block.fused_qk_norm else None,
            int8=int8,
            scale=attn.scale,
            block_output=(
                _packed(attn.o_proj),
                block.post_attention_layernorm.weight,
                block.post_attention_layernorm.eps,
                _packed(mlp.gate_proj.projection_group),
                _packed(mlp.down_proj),
            ),
        )


class FusedBlock:
    """The fused ``__call__`` of a family's TransformerBlock (mixed in before it: ``super().__call__`` is the
    stock layer). Its weights are read on its first fused call (``FusedArguments``): a model's weights do not
    change once it is loaded and fused."""

    fused_qk_norm = False  # set on each family's class: its heads go through q_norm / k_norm
    fused_arguments: FusedArguments | None = None  # gathered on the first fused call
    self_attn: Any  # the family's modules (annotations only: nn.Module holds them)
    mlp: Any
    input_layernorm: Any
    post_attention_layernorm: Any

    def __call__(self, x: mx.array, mask=None, cache=None) -> mx.array:
        fused = self.fused_arguments
        if fused is None:
            fused = self.fused_arguments = FusedArguments.of(self)
        rows = x.size // x.shape[-1] if x.ndim else 0
        if (
            x.dtype != mx.float32
            or x.ndim != 3
            or rows > fused.max_rows
            or hasattr(cache, "bits")
            or mx.default_device() != mx.cpu
        ):
            return super().__call__(x, mask, cache)  # type: ignore[misc]
        offset = cache.offset if cache is not None else 0
        if not isinstance(offset, mx.array):
            offset = mx.array(offset, dtype=mx.int32)
        lengths = lengths_for(x)  # a verify forward of rows of different widths: their real tokens only
        queries, keys, values = mlxd_qmatmul.attention_input(
            x, *fused.attention_input, offset, fused.rope, fused.bias, fused.qk_norms, fused.int8, lengths
        )
        if cache is not None:
            written = self._write_and_finish(x, queries, keys, values, mask, cache, fused, lengths)
            if written is not None:
                return written
            keys, values = cache.update_and_fetch(keys, values)
        if not _one_op_attention_applies(queries, keys, values, cache, mask, None):
            return self._stock_tail(x, queries, keys, values, mask, cache)
        causal = isinstance(mask, str)
        return mlxd_qmatmul.block_output(
            x, queries, keys, values, None if causal else mask, causal, fused.scale, *fused.block_output, lengths
        )

    def _write_and_finish(self, x, queries, keys, values, mask, cache, fused: FusedArguments, lengths):
        """The cache write, then ``block_output`` reading the layer's buffers itself, where the storage writes
        in place (``update_in_place``: rows in adjacent slots) and the one-op attention takes what it reads;
        else None, with nothing written."""
        update = getattr(cache, "update_in_place", None)
        if update is None or not _one_op_mask_applies(mask, queries.shape[2], cache.plan.read_length):
            return None
        written = update(keys, values)
        if written is None:
            return None
        k_buf, v_buf, first_slot, read_length = written
        causal = isinstance(mask, str)
        return mlxd_qmatmul.block_output_span(
            x, queries, k_buf, v_buf, first_slot, read_length, None if causal else mask, causal, fused.scale,
            *fused.block_output, lengths,
        )  # fmt: skip

    def _stock_tail(self, x, queries, keys, values, mask, cache) -> mx.array:
        """The layer after its cache update, op by op (a mask the one-op attention does not take)."""
        B, L, _ = x.shape
        out = _STOCK_ATTENTION(queries, keys, values, cache=cache, scale=self.self_attn.scale, mask=mask)
        h = x + self.self_attn.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))
        return h + self.mlp(self.post_attention_layernorm(h))


# family TransformerBlock -> its fused subclass
FUSED: dict[type, type] = {
    block: type(
        f"Fused{block.__module__.rsplit('.', 1)[-1].title()}Block", (FusedBlock, block), {"fused_qk_norm": qk_norm}
    )
    for block, (_, _, _, qk_norm) in FAMILIES.items()
}


def fuse_blocks(model: nn.Module) -> int:
    """Swap the model's fusable layers for their fused classes (see the module's contract); returns how many
    layers are fused afterwards."""
    if not isinstance(model, nn.Module) or not mlxd_qmatmul.available():
        return 0
    count = 0
    for _, module in model.named_modules():
        if _fusable(module):
            module.__class__ = FUSED[type(module)]
        count += isinstance(module, FusedBlock)
    return count
