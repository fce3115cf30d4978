"""Reading a model's settings wherever mlx-lm and the checkpoint keep them (loading, sharding, embeddings)."""

from __future__ import annotations

from typing import Any


def config_value(config: dict | None, args: Any, name: str):
    """``name`` from the model's args, their wrapped ``text_config``, config.json, or its ``text_config``."""
    text_args = getattr(args, "text_config", None)
    sources = [args, text_args, config or {}, (config or {}).get("text_config")]
    for source in sources:
        if source is None:
            continue
        value = source.get(name) if isinstance(source, dict) else getattr(source, name, None)
        if value is not None:
            return value
    return None
