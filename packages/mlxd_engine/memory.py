"""MLX's memory, for the layers above the engine (scheduler, daemon) that do not import mlx themselves.

Contract: ``memory_usage()`` reports MLX's active and peak allocation in bytes (an empty dict where the
backend cannot say); ``release_cached_memory()`` returns MLX's buffer cache to the system (after a failed
forward, so a retry starts from a clean allocator).
"""

from __future__ import annotations

import mlx.core as mx


def memory_usage() -> dict[str, int]:
    try:
        return {"mlx_active_bytes": int(mx.get_active_memory()), "mlx_peak_bytes": int(mx.get_peak_memory())}
    except (AttributeError, RuntimeError):
        return {}


def release_cached_memory() -> None:
    mx.clear_cache()
