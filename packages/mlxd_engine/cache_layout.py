"""The model's cache layout: what each cache entry is, what the engine serves, and the facts a probe measures.

Contract:
- ``read_cache_layout(model, model_type)`` asks the model for its own cache list (``model.make_cache()``
  when it has one, else mlx-lm's ``make_prompt_cache``: a ``KVCache`` per layer) and maps every entry to
  a storage kind. Served: ``attention`` (``KVCache``: the slot and paged views),
  ``sliding_window`` (``RotatingKVCache``: a ring per sequence bounded by the window, ``storage/sliding_window.py``)
  and ``recurrent`` (``ArraysCache``: the state of Mamba, gated-delta and short-conv layers, one row per
  sequence, ``storage/recurrent_state.py``); ``storage/row_storage.py`` holds the last two beside the KV backend.
  A model that makes fewer cache entries than it has layers gets one view per entry, as mlx-lm's own
  loop does: the remaining layers own no cache (gemma4's KV-shared layers reuse an earlier layer's K/V,
  nemotron_h's MLP layers hold nothing) and the model maps the entries to its layers.
  A ``CacheList`` of served kinds (falcon_h1: recurrent state and attention in every layer) is a
  ``composite``, served part by part. Anything else (a composite with an unserved part; chunked or
  quantized KV; a class mlxd does not know) is refused:
  ``CacheLayout.refusal`` says which entry, which class, the model type and why, and
  ``check_servable`` raises ``ModelLoadError`` with it.
- For a served ``nn.Module`` model a probe forward (two rows, one token each, one earlier position of
  made-up keys) measures, through views that follow the same protocol as the storage's:
  the mask form the model's attention broadcasts correctly (``mask_axes``: 4 for ``[B, 1, n, L]``,
  which ``mx.fast.scaled_dot_product_attention`` and most attentions take; 5 for ``[B, 1, 1, n, L]``,
  for attentions that split the heads into ``[B, kv_heads, repeats, n, L]`` scores, as gemma2 does;
  None when neither keeps the rows apart: then rows are forwarded one at a time), the bytes one token's
  K and V take (shapes and dtype as the model produces them, every cache entry with its own head count
  and size) and the vocabulary (the logits' width).
  Row 0 must not see the earlier position and row 1 must: a form passes when row 0's logits do not
  move when that position's keys and values change. The probe uses its own random key, so the global
  random state is untouched.
- Models that are not ``nn.Module`` (test stubs) are taken as they say: one ``attention`` entry per
  layer, no probe.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import mlx.core as mx
import mlx.nn as nn

from .errors import ModelLoadError
from .masks import shape_mask
from .storage.kv_dtype import stored_dtype

if TYPE_CHECKING:  # the loader imports this module
    from .loading.loader import LoadedModel

log = logging.getLogger("mlxd.engine")

ATTENTION = "attention"
SLIDING_WINDOW = "sliding_window"
RECURRENT = "recurrent"  # ArraysCache: state rows of storage/recurrent_state.py
COMPOSITE = "composite"  # CacheList of served kinds (falcon_h1: recurrent state and attention per layer)
SERVED_KINDS = (ATTENTION, SLIDING_WINDOW, RECURRENT, COMPOSITE)

# cache class name -> what it holds (why mlxd's KV storage cannot serve it yet)
_REFUSED_CLASSES = {
    "MambaCache": "recurrent state",
    "CacheList": "a composite of caches one of which is not served",
    "ChunkedKVCache": "chunked attention",
    "QuantizedKVCache": "quantized keys and values",
    "ConcatenateKVCache": "a concatenating KV cache",
}
_SERVED_CLASSES = {"KVCache": ATTENTION, "RotatingKVCache": SLIDING_WINDOW}


@dataclass
class CacheEntry:
    cls: str  # the cache class's name, e.g. "KVCache"
    kind: str | None  # a served storage kind, or None
    why: str = ""  # what the class holds, for a refused entry
    window: int | None = None  # a sliding window's size
    size: int = 0  # a recurrent entry's number of state arrays
    parts: list[CacheEntry] = field(default_factory=list)  # a composite's entries, in its order

    def leaves(self) -> list[CacheEntry]:
        return [leaf for part in self.parts for leaf in part.leaves()] if self.kind == COMPOSITE else [self]


@dataclass
class CacheLayout:
    model_type: str
    n_layers: int
    entries: list[CacheEntry]
    mask_axes: int | None = 4  # see the module docstring
    kv_bytes_per_token: int | None = None  # measured by the probe; None for stubs
    kv_value_dtype: mx.Dtype | None = None  # the dtype keys and values came in, in the probe
    vocab_size: int | None = None  # the logits' width, measured by the probe
    notes: list[str] = field(default_factory=list)  # what the probe found, for the log

    @property
    def n_caches(self) -> int:
        """Views a forward gets: one per cache entry (fewer than layers under KV sharing)."""
        return len(self.entries)

    @property
    def refusal(self) -> str | None:
        """Why this model cannot be served, or None."""
        for i, entry in enumerate(self.entries):
            if entry.kind is None:
                return (
                    f"model type {self.model_type!r}: layer {i} uses {entry.cls} ({entry.why}), "
                    f"which mlxd's KV storage does not serve yet"
                )
        return None

    def leaves(self) -> list[CacheEntry]:
        """Every entry with composites opened up, in order."""
        return [leaf for entry in self.entries for leaf in entry.leaves()]

    @property
    def unwinds_by_replay(self) -> bool:
        """Whether dropping speculative appends means restoring recurrent state and replaying kept tokens
        (``storage/row_storage.py``) instead of a counter move."""
        return any(leaf.kind == RECURRENT for leaf in self.leaves())

    def describe(self) -> str:
        kinds: dict[str, int] = {}
        for entry in self.entries:
            kinds[entry.kind or entry.cls] = kinds.get(entry.kind or entry.cls, 0) + 1
        text = ", ".join(f"{n} {kind}" for kind, n in kinds.items())
        if self.n_caches < self.n_layers:
            text += f", {self.n_layers - self.n_caches} layers owning no cache"
        return text


def _describe_entry(cache) -> CacheEntry:
    name = type(cache).__name__
    if name in _SERVED_CLASSES:
        window = getattr(cache, "max_size", None) if name == "RotatingKVCache" else None
        return CacheEntry(name, _SERVED_CLASSES[name], window=window)
    if name == "ArraysCache":
        return CacheEntry(name, RECURRENT, size=len(cache.cache))
    if name == "CacheList":
        parts = [_describe_entry(c) for c in getattr(cache, "caches", ())]
        label = f"CacheList({', '.join(part.cls for part in parts)})"
        if parts and all(part.kind in (ATTENTION, SLIDING_WINDOW, RECURRENT) for part in parts):
            return CacheEntry(label, COMPOSITE, parts=parts)
        return CacheEntry(label, None, _REFUSED_CLASSES[name])
    return CacheEntry(name, None, _REFUSED_CLASSES.get(name, "a cache class mlxd does not know"))


def model_layers(model) -> list:
    """The model's decoder layers wherever they live (``model.layers`` on most mlx-lm models)."""
    for path in ("layers", "model.layers", "language_model.layers", "language_model.model.layers", "backbone.layers"):
        obj = model
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            continue
        try:
            return list(obj)
        except TypeError:
            continue
    raise AttributeError(f"{type(model).__name__} has no layers mlxd can find")


def read_cache_layout(model, model_type: str, n_layers: int | None = None) -> CacheLayout:
    """Map the model's own cache list to storage kinds and, for a served module, run the probe.

    Args:
        model: the mlx-lm model (or a test stub).
        model_type: for messages.
        n_layers: the layer count when already known (stubs); read from the model otherwise.
    Returns:
        The layout; ``refusal`` is set when some entry is not served.
    """
    if not isinstance(model, nn.Module):
        count = n_layers or 1
        return CacheLayout(model_type, count, [CacheEntry("KVCache", ATTENTION) for _ in range(count)])
    from mlx_lm.models.cache import make_prompt_cache

    caches = make_prompt_cache(model)
    layers = len(model_layers(model))
    layout = CacheLayout(model_type, layers, [_describe_entry(c) for c in caches])
    if layout.refusal is None:
        _probe(model, layout)
    return layout


def check_servable(layout: CacheLayout) -> None:
    """Raise ``ModelLoadError`` with the layout's refusal, if it has one."""
    if layout.refusal is not None:
        raise ModelLoadError(layout.refusal)


class _ProbeView:
    """mlx-lm cache protocol for the probe: rows 0 and 1 at position 1, key 0 made up (``seed``)."""

    def __init__(self, seed: int, mask_axes: int, record: list):
        self.seed, self.mask_axes, self.record = seed, mask_axes, record
        self.offset = 1

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        # keys: [B, kv_heads, 1, k_dim] -> [B, kv_heads, 2, k_dim] with the made-up position first
        self.record.append((keys.shape, values.shape, keys.dtype))
        k_key, v_key = mx.random.split(mx.random.key(self.seed))
        k0 = (4 * mx.random.normal(keys.shape, key=k_key)).astype(keys.dtype)
        v0 = (4 * mx.random.normal(values.shape, key=v_key)).astype(values.dtype)
        return mx.concatenate([k0, keys], axis=2), mx.concatenate([v0, values], axis=2)

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None):
        mask = mx.array([[False, True], [True, True]])[:, None, None, :]  # [B, 1, n, L]
        return shape_mask(mask, self.mask_axes)

    @property
    def state(self):
        return []


class _ProbeList:
    """CacheList protocol for the probe: ``cache[i]`` is part i's probe cache."""

    def __init__(self, parts: list):
        self.parts = parts

    def __getitem__(self, i: int):
        return self.parts[i]


def _probe_cache(entry: CacheEntry, seed: int, axes: int, record: list):
    if entry.kind == COMPOSITE:
        return _ProbeList([_probe_cache(part, seed, axes, record) for part in entry.parts])
    if entry.kind == RECURRENT:
        from mlx_lm.models.cache import ArraysCache

        return ArraysCache(entry.size)  # both rows start from a zero state
    return _ProbeView(seed, axes, record)


def _probe(model, layout: CacheLayout) -> None:
    inputs = mx.array([[1], [2]], dtype=mx.int32)
    failures = []
    for axes in (4, 5):
        runs = []
        try:
            for seed in (1, 2):
                record: list = []
                logits = model(inputs, cache=[_probe_cache(entry, seed, axes, record) for entry in layout.entries])
                mx.eval(logits)
                runs.append((logits, record))
        except Exception as error:  # noqa: BLE001 - a form the attention cannot broadcast
            failures.append(f"{axes}-D mask: {type(error).__name__}: {error}")
            continue
        (first, record), (second, _) = runs
        if not record:  # no attention entry (mamba2): no mask to shape, no KV to hold
            layout.vocab_size, layout.kv_bytes_per_token = int(first.shape[-1]), 0
            return
        row0_still = bool(mx.allclose(first[0], second[0], rtol=1e-4, atol=1e-4))
        row1_moved = not bool(mx.allclose(first[1], second[1], rtol=1e-4, atol=1e-4))
        layout.vocab_size = int(first.shape[-1])
        layout.kv_bytes_per_token = sum(k[1] * k[3] * dtype.size + v[1] * v[3] * dtype.size for k, v, dtype in record)
        layout.kv_value_dtype = record[0][2]
        if row0_still and row1_moved:
            layout.mask_axes = axes
            if axes != 4:
                layout.notes.append(f"attention takes {axes}-D masks")
            return
        failures.append(f"{axes}-D mask: rows not kept apart")
    if layout.kv_bytes_per_token is None:
        raise ModelLoadError(
            f"model type {layout.model_type!r}: a test forward through mlxd's KV views failed ({'; '.join(failures)})"
        )
    layout.mask_axes = None
    layout.notes.append("no batched mask form keeps rows apart; rows at different positions run one at a time")
    log.warning("model type %r: %s (%s)", layout.model_type, layout.notes[-1], "; ".join(failures))


def kv_bytes_per_token(
    loaded: LoadedModel, bytes_per_value: int | None = None, kv_dtype: mx.Dtype | None = None
) -> int:
    """K and V bytes one token occupies across all cache entries.

    Measured by the cache-layout probe (every entry's own head count and size, in the dtype the loaded
    weights produce; float32 values kept as ``kv_dtype`` where it is given: storage/kv_dtype.py);
    ``bytes_per_value``, or a model the probe did not run on (stubs, refused layouts), takes the config's
    heads and head size instead (4 bytes a value unless given)."""
    layout = loaded.layout()
    if bytes_per_value is None and layout.kv_bytes_per_token is not None:
        computed = layout.kv_value_dtype
        if computed is None:
            return layout.kv_bytes_per_token
        return layout.kv_bytes_per_token * stored_dtype(kv_dtype, computed).size // computed.size
    args = getattr(loaded.model, "args", None)
    text = getattr(args, "text_config", None)
    args = type("Args", (), text) if isinstance(text, dict) else (text or args)
    heads = getattr(args, "num_attention_heads", 1)
    kv_heads = getattr(args, "num_key_value_heads", None) or heads
    head_dim = getattr(args, "head_dim", None) or getattr(args, "hidden_size", heads) // heads
    return layout.n_caches * 2 * kv_heads * head_dim * (bytes_per_value or 4)
