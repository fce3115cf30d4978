"""Splitting a loaded model over an ``mx.distributed`` group with mlx-lm's own sharding.

Contract: ``shard_model(module, mode, group)`` changes the mlx-lm model in place so that this rank holds
its part, or raises ``ModelLoadError`` saying which mode the model lacks and what to do:
- ``tensor``: ``model.shard(group)`` (mlx-lm: llama, qwen2/3, deepseek_v2/v3, gpt_oss, glm4_moe, ...).
  Every rank keeps the embeddings and the head and a 1/N share of every layer's attention heads and MLP;
  the layers' ``sharded-to-all`` projections sum over the group, so every rank ends with the same logits.
  The attention and KV head counts must divide by the group size (SmolLM2-135M: 9 and 3 heads, so 3
  ranks, not 2).
- ``pipeline``: ``model.model.pipeline(group)`` (mlx-lm: deepseek_v2/v3, glm4_moe, qwen3_5, ministral3,
  ...). Rank r runs a contiguous run of layers (rank 0 the last ones); hidden states go rank to rank and
  the last hidden state is gathered on every rank, so every rank again ends with the same logits.
Nothing here is hand-written model code: where mlx-lm has no ``shard``/``pipeline`` for an architecture,
the model cannot be split. One seam: mlx-lm's pipelined forwards tie their ``send`` into the graph by
writing ``cache[-1].keys = mx.depends(cache[-1].keys, h)``, which mlx-lm's own caches allow and mlxd's KV
views (no ``keys``) do not. The send already feeds the gathered hidden state, hence the logits, so
``_tie_pipeline_sends`` hands the forward a stand-in for its last view that takes the write and drops it.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from ..errors import ModelLoadError
from .model_config import config_value

MODES = ("tensor", "pipeline")


def supported_modes(module: Any) -> list[str]:
    """The distributed modes the installed mlx-lm offers for this model."""
    modes = []
    if callable(getattr(module, "shard", None)):
        modes.append("tensor")
    if callable(getattr(getattr(module, "model", None), "pipeline", None)):
        modes.append("pipeline")
    return modes


def shard_model(module: Any, mode: str, group: Any, model_type: str, config: dict | None = None) -> None:
    """Give this rank its part of ``module`` (see the module docstring).

    Args:
        module: the mlx-lm model, best still lazy (only this rank's part is then ever read).
        mode: ``tensor`` or ``pipeline``.
        group: the ``mx.distributed`` group to split over.
        model_type: for the messages.
        config: the checkpoint's config.json, for the head counts.
    Raises:
        ModelLoadError: the model has no such mode, or its shapes do not split over this many ranks.
    """
    check_shardable(module, mode, group.size(), model_type, config)
    if mode == "tensor":
        module.shard(group)
    else:
        module.model.pipeline(group)
        _tie_pipeline_sends(module.model)


def check_shardable(module: Any, mode: str, size: int, model_type: str, config: dict | None = None) -> None:
    """Raise ``ModelLoadError`` unless ``shard_model`` can split ``module`` over ``size`` ranks. Cheap (no
    weights are read): every rank refuses a model at once, before any of them does heavy work."""
    if mode not in MODES:
        raise ModelLoadError(f"unknown distributed mode {mode!r} (expected {' or '.join(MODES)})")
    modes = supported_modes(module)
    if mode not in modes:
        method = "model.shard(group)" if mode == "tensor" else "model.model.pipeline(group)"
        other = f"; it has {modes[0]} parallel: use --distributed {modes[0]}" if modes else ""
        raise ModelLoadError(
            f"model type {model_type!r} has no {mode} parallel in the installed mlx-lm (no {method}){other}"
        )
    args = getattr(module, "args", None)
    if mode == "tensor":
        for field in ("num_attention_heads", "num_key_value_heads"):
            count = config_value(config, args, field)
            if isinstance(count, int) and count % size:
                raise ModelLoadError(
                    f"model type {model_type!r}: {field}={count} does not split over {size} ranks "
                    f"for tensor parallel (use a rank count that divides it)"
                )
    elif len(module.model.layers) < size:
        raise ModelLoadError(
            f"model type {model_type!r}: {len(module.model.layers)} layers cannot be split over {size} ranks"
        )


class _SendTie:
    """The rank's last KV view as the pipelined forward sees it: everything is the view's, but ``keys``
    (read: a placeholder; written: dropped, see the module docstring)."""

    def __init__(self, view):
        object.__setattr__(self, "_view", view)

    def __getattr__(self, name):
        return getattr(self._view, name)

    def __getitem__(self, index):
        return self._view[index]

    def __setitem__(self, index, value):
        self._view[index] = value

    @property
    def keys(self):
        return mx.array(0)

    @keys.setter
    def keys(self, value):
        pass


def _tie_pipeline_sends(inner) -> None:
    base = type(inner)

    def forward(self, inputs, cache=None, *args, **kwargs):
        if cache and cache[-1] is not None and not hasattr(cache[-1], "keys"):
            cache = [*cache[:-1], _SendTie(cache[-1])]
        return base.__call__(self, inputs, cache, *args, **kwargs)

    inner.__class__ = type(base.__name__, (base,), {"__call__": forward, "__module__": base.__module__})
