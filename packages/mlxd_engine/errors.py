"""The engine's exceptions that several of its modules raise, in one leaf module so that none imports back.

``ModelLoadError`` (loading, the cache layout, sharding), its subclass ``GGUFError`` (GGUF import and its
tokenizer), ``KVStorageFull`` (every KV storage kind, the state rows, the engine) and its subclass
``PromptTooLong`` (the engine's admissibility check). Each is still importable
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


class PromptTooLong(KVStorageFull, ValueError):
    """A prompt at or past the context bound (``Engine.check_request``): a request that can never run, so a
    ValueError to the scheduler's callers, and the KVStorageFull ``add_sequence`` always raised for it."""
