"""The engine's exceptions that several of its modules raise, in one leaf module so that none imports back.

``ModelLoadError`` (loading, the cache layout, sharding), its subclass ``GGUFError`` (GGUF import and its
tokenizer) and ``KVStorageFull`` (every KV storage kind, the state rows, the engine). Each is still importable
from the module that raises it most (``loading.loader``, ``loading.gguf_import``, ``storage.kv_storage``) and
from ``mlxd_engine``.
"""

from __future__ import annotations


class ModelLoadError(RuntimeError):
    """The model could not be loaded; the message is meant for the user."""


class GGUFError(ModelLoadError):
    """The GGUF file cannot be converted; the message is meant for the user."""


class KVStorageFull(RuntimeError):
    """No free slot, or a sequence would pass the storage's capacity."""
