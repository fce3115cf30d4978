"""The engine as mlxd builds it from ``DaemonOptions``: the same on every rank of a distributed group.

``build_engine`` is shared by the core (``core.build_scheduler``, rank 0 or a lone daemon) and the followers
of a group (``distributed.serve_follower``), so neither imports the other for it.
"""

from __future__ import annotations

from mlxd_engine import Engine, LoadedModel, kv_bytes_per_token, parse_kv_dtype

from .options import DaemonOptions


def pool_tokens(loaded: LoadedModel, options: DaemonOptions) -> int | None:
    """Paged pool size in tokens: --kv-pool-tokens, else --kv-memory-fraction of this machine's memory."""
    if options.kv_pool_tokens:
        return options.kv_pool_tokens
    if options.kv_memory_fraction:
        import psutil

        return int(psutil.virtual_memory().total * options.kv_memory_fraction) // stored_bytes_per_token(
            loaded, options
        )
    return None


def prefix_cache_budget(loaded: LoadedModel, options: DaemonOptions) -> int:
    """--prefix-cache-bytes, else a quarter of the KV bound (every slot full, or the paged pool), at most a
    tenth of this machine's memory."""
    if options.prefix_cache_bytes is not None:
        return options.prefix_cache_bytes
    import psutil

    tokens = pool_tokens(loaded, options) or options.max_batch * (options.max_kv_size or loaded.context_length)
    return min(tokens * stored_bytes_per_token(loaded, options) // 4, psutil.virtual_memory().total // 10)


def stored_bytes_per_token(loaded: LoadedModel, options: DaemonOptions) -> int:
    """K and V bytes a token takes in storage under --kv-dtype."""
    return kv_bytes_per_token(loaded, kv_dtype=parse_kv_dtype(options.kv_dtype))


def build_engine(loaded: LoadedModel, options: DaemonOptions) -> Engine:
    """The engine for ``options``; every rank of a distributed group builds the same one (no compiled
    steps there: each rank must run the very same forwards, and tuning them by timing could differ)."""
    return Engine(
        loaded,
        max_sequences=options.max_batch,
        max_kv_size=options.max_kv_size,
        storage=options.storage_backend,
        kv_block_size=options.kv_block_size,
        kv_dtype=parse_kv_dtype(options.kv_dtype),
        kv_pool_tokens=pool_tokens(loaded, options),
        compile_decode=False if loaded.group is not None else None,
        # a group's ranks replay rank 0's engine operations; the cache's own choices are not among them
        prefix_cache_bytes=prefix_cache_budget(loaded, options) if loaded.group is None else 0,
    )
