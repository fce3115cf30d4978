"""Model loading through mlx-lm: any mlx-lm checkpoint, a local directory or a hub id.

Contract: ``load`` returns a ``LoadedModel`` (the mlx-lm model module, its tokenizer wrapper with the
chat template and streaming detokenizer, and facts the engine needs: layer count, vocabulary size, EOS
ids, context length). Errors a user can cause (missing path, unsupported architecture, unreadable
config) raise ``ModelLoadError`` with a message that says what to do. Hub access is the caller's
business: a name that is not a local directory is handed to mlx-lm, which may download it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .cpu_weights import apply_cpu_weight_rule

EMBEDDED_MODEL_NAME = "mlxd-qwen3-tiny"


class ModelLoadError(RuntimeError):
    """The model could not be loaded; the message is meant for the user."""


def embedded_model_path() -> Path:
    """The small copy-capable qwen3 checkpoint shipped in the repository under ``models/``."""
    return Path(__file__).resolve().parents[2] / "models" / EMBEDDED_MODEL_NAME


@dataclass
class LoadedModel:
    model: Any  # mlx-lm nn.Module: model(inputs [B, T], cache=list of per-layer caches) -> logits [B, T, V]
    tokenizer: Any  # mlx_lm TokenizerWrapper
    path: str
    model_type: str
    n_layers: int
    vocab_size: int
    eos_token_ids: frozenset[int]
    context_length: int
    weights: str = "as stored"  # what the CPU weight rule did (cpu_weights.py), for the log and status

    def new_detokenizer(self):
        """A fresh streaming detokenizer (one per sequence): mlx-lm hands out a reset copy per call."""
        return self.tokenizer.detokenizer


def _looks_like_local_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or Path(name).exists() or name.count("/") != 1


def load(model: str | Path | None = None, cpu_weight_budget: int | None = None) -> LoadedModel:
    """Load an mlx-lm checkpoint and apply the CPU weight rule (``cpu_weights.py``) to it.

    Args:
        model: a local directory or a hub id ("org/name"); None means the embedded model.
        cpu_weight_budget: bytes the float32 weights may take on the CPU before quantized layers stay
            quantized (None: a share of the machine's memory).
    Returns:
        The loaded model with its tokenizer.
    Raises:
        ModelLoadError: the path does not exist, has no config.json, or names an architecture
            mlx-lm does not support.
    """
    from mlx_lm.utils import load as mlx_lm_load

    name = str(model) if model is not None else str(embedded_model_path())
    path = Path(name).expanduser()
    if name.lower().endswith(".gguf") and path.is_file():  # a GGUF file: served from its converted directory
        from .gguf_import import cached_conversion

        path = cached_conversion(path)
        name = str(path)
    if _looks_like_local_path(name) or name.lower().endswith(".gguf"):
        if not path.exists():
            raise ModelLoadError(f"model path {name!r} does not exist (give a local mlx-lm checkpoint directory or a hub id like org/name)")
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{name!r} is not an mlx-lm checkpoint: it has no config.json")
        try:
            config = json.loads((path / "config.json").read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise ModelLoadError(f"cannot read {path / 'config.json'}: {error}") from error
        _check_architecture(config)
        name = str(path)
    try:
        module, tokenizer = mlx_lm_load(name)
    except ValueError as error:
        if "not supported" in str(error):
            raise ModelLoadError(str(error)) from error
        raise
    weights = apply_cpu_weight_rule(module, cpu_weight_budget)
    args = getattr(module, "args", None)
    model_type = getattr(args, "model_type", None) or getattr(module, "model_type", "unknown")
    layers = module.layers if hasattr(module, "layers") else module.model.layers
    eos = set(tokenizer.eos_token_ids) if getattr(tokenizer, "eos_token_ids", None) else set()
    if tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    context = getattr(args, "max_position_embeddings", None) or 8192
    return LoadedModel(
        model=module,
        tokenizer=tokenizer,
        path=name,
        model_type=model_type,
        n_layers=len(layers),
        vocab_size=int(getattr(args, "vocab_size", 0) or module.model.embed_tokens.weight.shape[0]),
        eos_token_ids=frozenset(eos),
        context_length=int(context),
        weights=weights.detail,
    )


def _check_architecture(config: dict) -> None:
    from mlx_lm.utils import _get_classes

    if not isinstance(config, dict) or not config.get("model_type"):
        raise ModelLoadError("config.json has no model_type")
    try:
        _get_classes(config)
    except ValueError as error:
        raise ModelLoadError(f"model type {config['model_type']!r} is not supported by the installed mlx-lm") from error
