"""KV storage: the kinds of per-sequence model state the engine keeps between forwards, and the prefix cache.

``kv_backend`` (the ``KVStorage`` protocol and ``make_kv_storage``), ``kv_storage`` (a slot per sequence),
``paged_kv_storage`` (blocks from a pool, shared prefixes), ``row_storage`` with ``sliding_window`` and
``recurrent_state`` (the rings and state rows beside the KV backend), ``kv_bound`` (a sequence's KV bound)
and ``prefix_cache``. Storage never imports ``loading`` (tests/test_import_rules.py): what it needs to know of a
model comes through the engine (the storage kinds are named in ``mlxd_engine/cache_layout.py``).
"""
