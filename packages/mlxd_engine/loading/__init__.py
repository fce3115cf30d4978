"""Model loading: reading a checkpoint (mlx-lm directory, hub id or GGUF file) into a ``LoadedModel``.

``loader`` (``load``, ``LoadedModel``), ``model_config`` (facts from the config), ``sharding`` (a distributed
rank's part), ``cpu_weights`` and ``kernel_layers`` (the CPU weight rule and its kernel layers), ``gguf_import``
and ``gguf_tokenizer`` (GGUF to an mlx-lm checkpoint), ``default_model`` and ``cache_dir`` (the default model
and where conversions are kept). The names other packages use are re-exported by ``mlxd_engine``.
"""
