"""Llama-style decoder layers as two ops each on the CPU kernel: the attention input, and the rest after the
cache update.

Contract: ``fuse_blocks(model)`` changes, in place, every layer of ``model`` that is exactly mlx-lm's llama
``TransformerBlock`` (SmolLM2, Llama, Mistral-style checkpoints) whose projections all run on the CPU
kernel without biases and without int8 activations, q/k/v and gate/up packed (``projection_groups``), with
plain RMSNorm and RoPE modules, into ``FusedLlamaBlock``: same parameters, same module tree. Returns how many
layers are fused. A fused layer called with float32 input of at most the kernel's row limit runs
``mlxd_qmatmul.attention_input``, the cache's ``update_and_fetch`` (unchanged: every storage kind, the
compiled step's buffers), then ``mlxd_qmatmul.block_output``; the result is bit-identical to the layer's
own ops on the kernel (tests/engine/test_fused_blocks.py). Anything else (prompt chunks past the row limit,
another dtype, a quantized cache, a mask or cache the one-op attention does not take) runs the layer's
stock ``__call__``. Applied by ``Engine`` with the other CPU fusions; ``MLXD_FUSE_BLOCKS=0`` keeps layers
op by op. Why: a SmolLM2 step was about 760 ops at roughly 7 us of dispatch each on MLX's CPU stream
(docs/benchmark_results/code_notes.md#fused-blocks).
"""

from __future__ import annotations

import os

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama

import mlxd_qmatmul

from .cpu_fusion import _STOCK_ATTENTION, FusedRMSNorm, FusedRoPE, _one_op_attention_applies
from .loading.kernel_layers import KernelQuantizedLinear
from .loading.projection_groups import GroupedQuantizedLinear, ProjectionGroup

DISABLE_ENV = "MLXD_FUSE_BLOCKS"
_NORMS = (nn.RMSNorm, FusedRMSNorm)
_ROPES = (nn.RoPE, FusedRoPE)


def blocks_wanted() -> bool:
    return os.environ.get(DISABLE_ENV, "1").strip() != "0" and mlxd_qmatmul.available()


def _packed(layer) -> tuple:
    """(weight, scales, biases, group_size, bits) of a kernel layer or a projection group."""
    return (layer.weight, layer.scales, layer.biases, layer.group_size, layer.bits)


def _plain_kernel_layer(layer) -> bool:
    return type(layer) is KernelQuantizedLinear and "bias" not in layer and not layer.kernel_int8


def _group_of(layers: list) -> ProjectionGroup | None:
    """The projection group that packs exactly ``layers``, in order, without biases or int8 activations."""
    if not all(type(layer) is GroupedQuantizedLinear for layer in layers):
        return None
    group = layers[0].projection_group
    if group.layers != layers or group.bias is not None or group.int8:
        return None
    return group


def _fusable(block) -> bool:
    if type(block) is not llama.TransformerBlock:
        return False
    attn, mlp = block.self_attn, block.mlp
    if type(attn) is not llama.Attention or type(mlp) is not llama.MLP:
        return False
    if type(block.input_layernorm) not in _NORMS or type(block.post_attention_layernorm) not in _NORMS:
        return False
    if type(attn.rope) not in _ROPES:
        return False
    if not (_plain_kernel_layer(attn.o_proj) and _plain_kernel_layer(mlp.down_proj)):
        return False
    qkv = _group_of([attn.q_proj, attn.k_proj, attn.v_proj])
    gate_up = _group_of([mlp.gate_proj, mlp.up_proj])
    if qkv is None or gate_up is None:
        return False
    if qkv.sizes != [attn.n_heads * attn.head_dim] + [(attn.n_kv_heads or attn.n_heads) * attn.head_dim] * 2:
        return False
    norms = (block.input_layernorm.weight, block.post_attention_layernorm.weight)
    return all(w.dtype == mx.float32 for w in norms)


class FusedLlamaBlock(llama.TransformerBlock):
    def __call__(self, x: mx.array, mask=None, cache=None) -> mx.array:
        attn, mlp = self.self_attn, self.mlp
        qkv = attn.q_proj.projection_group
        rows = x.size // x.shape[-1] if x.ndim else 0
        if (
            x.dtype != mx.float32
            or x.ndim != 3
            or rows > min(layer.kernel_max_rows for layer in qkv.layers)
            or hasattr(cache, "bits")
            or mx.default_device() != mx.cpu
        ):
            return super().__call__(x, mask, cache)
        offset = cache.offset if cache is not None else 0
        if not isinstance(offset, mx.array):
            offset = mx.array(offset, dtype=mx.int32)
        rope = attn.rope
        queries, keys, values = mlxd_qmatmul.attention_input(
            x,
            self.input_layernorm.weight,
            self.input_layernorm.eps,
            _packed(qkv) + (qkv.sizes,),
            attn.n_heads,
            attn.n_kv_heads or attn.n_heads,
            attn.head_dim,
            offset,
            (rope.dims, rope.traditional, rope.base, rope.scale),
        )
        if cache is not None:
            keys, values = cache.update_and_fetch(keys, values)
        if not _one_op_attention_applies(queries, keys, values, cache, mask, None):
            return self._stock_tail(x, queries, keys, values, mask, cache)
        causal = isinstance(mask, str)
        return mlxd_qmatmul.block_output(
            x,
            queries,
            keys,
            values,
            None if causal else mask,
            causal,
            attn.scale,
            _packed(attn.o_proj),
            self.post_attention_layernorm.weight,
            self.post_attention_layernorm.eps,
            _packed(mlp.gate_proj.projection_group),
            _packed(mlp.down_proj),
        )

    def _stock_tail(self, x, queries, keys, values, mask, cache) -> mx.array:
        """The layer after its cache update, op by op (a mask the one-op attention does not take)."""
        B, L, _ = x.shape
        out = _STOCK_ATTENTION(queries, keys, values, cache=cache, scale=self.self_attn.scale, mask=mask)
        h = x + self.self_attn.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))
        return h + self.mlp(self.post_attention_layernorm(h))


def fuse_blocks(model: nn.Module) -> int:
    """Swap the model's fusable llama layers for ``FusedLlamaBlock`` (see the module's contract); returns how
    many layers are fused afterwards."""
    if not isinstance(model, nn.Module) or not mlxd_qmatmul.available():
        return 0
    count = 0
    for _, module in model.named_modules():
        if _fusable(module):
            module.__class__ = FusedLlamaBlock
        count += type(module) is FusedLlamaBlock
    return count
