"""Where the tests find their models: the repository's own copies first, then what ``make setup`` cached.

- ``STORIES_260K``: ``models/stories260K`` in this repository (llama2.c's 260K-parameter TinyStories model,
  MIT, 1 MB; its model card says where it comes from), so a clone needs nothing beside it.
- ``SMOLLM2``: SmolLM2-135M-Instruct q4 as an MLX checkpoint: ``../shared/models/smollm2-135m-instruct-q4``
  where this team's machines have it, else the default model ``make setup`` converted into the cache
  (``<cache>/gguf/<sha256>/``, the same weights: tests/engine/test_gguf_import.py compares the two). Tests
  that need it skip when neither is there (a clone set up offline).
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STORIES_260K = ROOT / "models" / "stories260K"
SHARED_SMOLLM2 = ROOT.parent / "shared" / "models" / "smollm2-135m-instruct-q4"


def _smollm2() -> Path:
    if SHARED_SMOLLM2.is_dir():
        return SHARED_SMOLLM2
    from mlxd_engine.loading.cache_dir import mlxd_cache_dir
    from mlxd_engine.loading.default_model import GGUF_SHA256

    return mlxd_cache_dir() / "gguf" / GGUF_SHA256


SMOLLM2 = _smollm2()
