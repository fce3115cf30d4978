"""A prompt's last forward computes the output head at its last position only.

A prompt chunk's caller reads the logits of its last position alone (the first output token); the rest of
the chunk only fills the KV storage. mlx-lm's models apply the output head to every position, and MLX
computes a product whole even where only a slice of it is read, so a 130-token prompt paid 130 rows of the
head (SmolLM2: 49152 x 576) for one. llama.cpp and vLLM compute the last position's logits only; so does
this.

Contract: ``mark_output_heads(model)`` switches, in place and once, the model's output head to a subclass of
its own class: the ``as_linear`` of every embedding table (what mlx-lm's tied heads call, and nothing else
does), and a Linear-like layer (``nn.Linear``, ``nn.QuantizedLinear`` and their subclasses, the CPU kernel's
among them) outside the layer stack (no numbered part in its path) named as mlx-lm's models name their
untied heads (``HEAD_NAMES``), whose output features are the vocabulary (the rows of the model's largest
embedding table). Sizes alone would not do: in a small model a projection inside the stack may have the
vocabulary's width. Inside ``last_position_only()`` such a head given a ``[batch, tokens, features]`` input
of more than one token computes the last token only and returns ``[batch, 1, vocab]``; outside it nothing
changes. What mlx-lm's models do after the head (logit soft-capping, scaling) is elementwise, so
``logits[:, -1]`` is the same row either way, within float32 rounding (the product of one row instead of
many). A sharded head (its outputs a share of the vocabulary) is not matched and computes every position as
before.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import mlx.core as mx
import mlx.nn as nn

# what mlx-lm's models call an untied output head
HEAD_NAMES = frozenset({"lm_head", "output", "embed_out", "ff_out"})

_last_only: ContextVar[bool] = ContextVar("mlxd_last_position_only", default=False)
_head_classes: dict[type, type] = {}


@contextmanager
def last_position_only() -> Iterator[None]:
    """Output heads built inside compute the last position of a multi-token input only."""
    token = _last_only.set(True)
    try:
        yield
    finally:
        _last_only.reset(token)


def _last(x: mx.array) -> mx.array:
    if _last_only.get() and x.ndim == 3 and x.shape[1] > 1:
        return x[:, -1:, :]
    return x


def _head_class(cls: type) -> type:
    """``cls`` with its output product taking the last position only inside ``last_position_only()``."""
    head = _head_classes.get(cls)
    if head is None:
        if issubclass(cls, (nn.Embedding, nn.QuantizedEmbedding)):

            def as_linear(self, x):
                return super(head, self).as_linear(_last(x))

            methods = {"as_linear": as_linear}
        else:

            def call(self, x):
                return super(head, self).__call__(_last(x))

            methods = {"__call__": call}
        head = _head_classes[cls] = type(f"LastPosition{cls.__name__}", (cls,), methods)
        _head_classes[head] = head  # marking twice changes nothing
    return head


def mark_output_heads(model: nn.Module) -> int:
    """Switch the model's output head(s) to compute the last position only inside ``last_position_only()``.
    Returns how many layers were switched (0: no head found; every forward then computes every position)."""
    if not isinstance(model, nn.Module):
        return 0  # a stand-in forward (tests): nothing to switch
    named = model.named_modules()
    tables = [m for _, m in named if isinstance(m, (nn.Embedding, nn.QuantizedEmbedding)) and "weight" in m]
    if not tables:
        return 0
    vocab = max(table["weight"].shape[0] for table in tables)
    heads = tables + [
        module
        for path, module in named
        if isinstance(module, (nn.Linear, nn.QuantizedLinear))
        and path.rsplit(".", 1)[-1] in HEAD_NAMES
        and not any(part.isdigit() for part in path.split("."))
        and "weight" in module
        and module["weight"].shape[0] == vocab
    ]
    for module in heads:
        module.__class__ = _head_class(type(module))
    return len(heads)
