"""The form of batched attention masks, shared by the KV storage kinds, the compiled step and the layout probe.

``shape_mask`` turns a ``[B, 1, n, L]`` mask array into the form the model's attention broadcasts:
``mask_axes`` 5 (attentions that split the heads into ``[B, kv_heads, repeats, n, L]`` scores, as gemma2's
does) gets ``[B, 1, 1, n, L]``; 4 (or None) leaves it as it is. ``cache_layout``'s probe finds the form.
"""

from __future__ import annotations

import mlx.core as mx


def shape_mask(mask, mask_axes: int | None):
    """Give a ``[B, 1, n, L]`` mask array the form the model's attention broadcasts (see the docstring)."""
    if mask_axes == 5 and isinstance(mask, mx.array) and mask.ndim == 4:
        return mask[:, :, None]
    return mask
