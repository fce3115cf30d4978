"""Model loading through mlx-lm: any mlx-lm checkpoint, a local directory or a hub id.

Contract: ``load`` returns a ``LoadedModel`` (the mlx-lm model module, its tokenizer wrapper with the
chat template and streaming detokenizer, and facts the engine needs: layer count, vocabulary size, EOS
ids, context length, the cache layout). Errors a user can cause (missing path, unsupported architecture,
unreadable config, a cache layout the engine does not serve: ``cache_layout.py``) raise
``ModelLoadError`` with a message that says what to do. Hub access is the caller's business: a name that
is not a local directory is handed to mlx-lm, which may download it.

Facts are read wherever the model keeps them: the model's args, a wrapped ``text_config`` (mistral3,
qwen3_5 and other multimodal wrappers), then config.json itself; layers wherever the module holds them;
the vocabulary and the KV bytes per token from the cache-layout probe (the logits' width, the K/V
shapes and dtype the loaded weights produce). A config without ``max_position_embeddings`` gets the
tokenizer's ``model_max_length`` when that is a real length, else ``FALLBACK_CONTEXT`` tokens; either
choice is logged, and ``--max-kv-size`` may go past a fallback.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..cache_layout import CacheLayout, check_servable, model_layers, read_cache_layout
from ..errors import ModelLoadError
from .cpu_weights import apply_cpu_weight_rule
from .gguf_import import cached_conversion
from .group16 import GROUP16_FILE
from .model_config import config_value
from .sharding import check_shardable, shard_model

log = logging.getLogger("mlxd.engine")

EMBEDDED_MODEL_NAME = "mlxd-qwen3-tiny"
FALLBACK_CONTEXT = 8192  # tokens per sequence when neither the config nor the tokenizer gives a length


def embedded_model_path() -> Path:
    """The small copy-capable qwen3 checkpoint shipped in the repository under ``models/``."""
    return Path(__file__).resolve().parents[3] / "models" / EMBEDDED_MODEL_NAME


@dataclass
class LoadedModel:
    model: Any  # mlx-lm nn.Module: model(inputs [B, T], cache=list of per-layer caches) -> logits [B, T, V]
    tokenizer: Any  # mlx_lm TokenizerWrapper
    path: str  # what was loaded: the checkpoint directory, hub id or .gguf file (not its converted directory)
    model_type: str
    n_layers: int
    vocab_size: int
    eos_token_ids: frozenset[int]
    context_length: int
    weights: str = "as stored"  # what the CPU weight rule did (cpu_weights.py), for the log and status
    # where context_length came from: "config", "tokenizer" or "fallback" (a guess --max-kv-size may pass)
    context_source: str = "config"
    cache_layout: CacheLayout | None = None  # read by load, or on first use for a LoadedModel built directly
    group: Any = None  # the mx.distributed group this rank holds a part of the model for (None: all of it)

    def layout(self) -> CacheLayout:
        """The model's cache layout (``cache_layout.py``), read once."""
        if self.cache_layout is None:
            self.cache_layout = read_cache_layout(self.model, self.model_type, self.n_layers)
        return self.cache_layout

    def new_detokenizer(self):
        """A fresh streaming detokenizer (one per sequence): mlx-lm hands out a reset copy per call.

        Output continues the prompt, so a SentencePiece token's leading space stays, as llama-server and
        vLLM send it ("it is" + " blue"); mlx-lm's SentencePiece detokenizer drops the first token's
        (``trim_space``), which is right only for text that starts a document."""
        detokenizer = self.tokenizer.detokenizer
        if hasattr(detokenizer, "trim_space"):
            detokenizer.trim_space = False
        return detokenizer


def _looks_like_local_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or Path(name).exists() or name.count("/") != 1


def load(
    model: str | Path | None = None,
    cpu_weight_budget: int | None = None,
    distributed: tuple[str, Any] | None = None,
    cpu_weights: str | None = None,
) -> LoadedModel:
    """Load an mlx-lm checkpoint and apply the CPU weight rule (``cpu_weights.py``) to it.

    Args:
        model: a local directory, a .gguf file (converted once, ``gguf_import.cached_conversion``) or a hub id
            ("org/name"); None means the embedded model.
        cpu_weight_budget: bytes the float32 weights may take on the CPU before quantized layers stay
            quantized (None: a share of the machine's memory).
        distributed: (mode, group): load lazily and keep only this rank's part (``sharding.py``).
        cpu_weights: the CPU weight rule's choice (``cpu_weights.CHOICES``); None: ``MLXD_CPU_WEIGHTS`` or auto.
    Returns:
        The loaded model with its tokenizer.
    Raises:
        ModelLoadError: the path does not exist, has no config.json, or names an architecture
            mlx-lm does not support.
    """
    from mlx_lm.utils import load as mlx_lm_load

    name = str(model) if model is not None else str(embedded_model_path())
    path = Path(name).expanduser()
    gguf_file = None  # a GGUF file: served from its converted directory, reported as itself
    if name.lower().endswith(".gguf") and path.is_file():
        gguf_file = str(path)
        path = cached_conversion(path)
        name = str(path)
    if _looks_like_local_path(name) or name.lower().endswith(".gguf"):
        if not path.exists():
            raise ModelLoadError(
                f"model path {name!r} does not exist "
                "(give a local mlx-lm checkpoint directory or a hub id like org/name)"
            )
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{name!r} is not an mlx-lm checkpoint: it has no config.json")
        try:
            config = json.loads((path / "config.json").read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise ModelLoadError(f"cannot read {path / 'config.json'}: {error}") from error
        _check_architecture(config)
        name = str(path)
    # a GGUF conversion's groups of 16 (group16.py), unsharded only: the model is then loaded lazily, so that the
    # float layers they replace on the CPU are never read
    group16 = path / GROUP16_FILE if distributed is None and (path / GROUP16_FILE).is_file() else None
    try:
        # return_config=True: three values (mlx-lm's annotation names the two of the default)
        module, tokenizer, config = mlx_lm_load(  # type: ignore[misc]
            name, return_config=True, lazy=distributed is not None or group16 is not None
        )
    except ValueError as error:
        if "not supported" in str(error):
            raise ModelLoadError(str(error)) from error
        raise
    args = getattr(module, "args", None)
    model_type = str(config_value(config, args, "model_type") or getattr(module, "model_type", "unknown"))
    if distributed is not None:
        check_shardable(module, distributed[0], distributed[1].size(), model_type, config)  # before heavy work
    try:
        weights = apply_cpu_weight_rule(  # before sharding: mlx's own layers (a shard of column-block order is none)
            module, cpu_weight_budget, choice=cpu_weights, group16=group16, column_blocks=distributed is None
        )
    except ValueError as error:  # a weight form asked for that this machine or model cannot give: the user's to fix
        raise ModelLoadError(str(error)) from error
    if distributed is not None or group16 is not None:
        import mlx.core as mx

        if distributed is not None:
            mode, group = distributed
            shard_model(module, mode, group, model_type, config)
        mx.eval(module.parameters())  # what the lazy load left (the rule evaluates what it changes)
    try:
        n_layers = len(model_layers(module))
    except AttributeError as error:
        raise ModelLoadError(f"model type {model_type!r}: {error}") from error
    eos = set(tokenizer.eos_token_ids) if getattr(tokenizer, "eos_token_ids", None) else set()
    if tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    context, source = context_length_of(config, args, tokenizer)
    layout = read_cache_layout(module, model_type)
    check_servable(layout)  # before anything reports ready: a layout the engine cannot serve is refused here
    vocab = layout.vocab_size or config_value(config, args, "vocab_size") or _embedding_rows(module)
    if not vocab:
        raise ModelLoadError(f"model type {model_type!r}: cannot tell its vocabulary size")
    log.info(
        "model type %s: %d layers, caches: %s, %s KV bytes per token, context %d (%s)%s",
        model_type,
        n_layers,
        layout.describe(),
        layout.kv_bytes_per_token,
        context,
        source,
        "".join(f"; {note}" for note in layout.notes),
    )
    return LoadedModel(
        model=module,
        tokenizer=tokenizer,
        path=gguf_file or name,
        model_type=model_type,
        n_layers=n_layers,
        vocab_size=int(vocab),
        eos_token_ids=frozenset(eos),
        context_length=int(context),
        weights=weights.detail,
        context_source=source,
        cache_layout=layout,
        group=distributed[1] if distributed is not None else None,
    )


def context_length_of(config: dict | None, args: Any, tokenizer: Any) -> tuple[int, str]:
    """The longest context the model takes, and where that figure came from (logged when guessed)."""
    value = config_value(config, args, "max_position_embeddings")
    if value:
        return int(value), "config"
    model_max = getattr(tokenizer, "model_max_length", None)
    if isinstance(model_max, int) and 0 < model_max < 10_000_000:  # transformers' "unset" is ~1e30
        log.warning(
            "config.json gives no max_position_embeddings; the context length is the tokenizer's "
            "model_max_length, %d tokens",
            model_max,
        )
        return model_max, "tokenizer"
    log.warning(
        "config.json gives no max_position_embeddings and the tokenizer no model_max_length; serving "
        "at most %d tokens per sequence (--max-kv-size may set more)",
        FALLBACK_CONTEXT,
    )
    return FALLBACK_CONTEXT, "fallback"


def _embedding_rows(module) -> int | None:
    for path in ("model.embed_tokens", "language_model.model.embed_tokens", "embed_tokens"):
        obj = module
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
            return int(obj.weight.shape[0])
        except AttributeError:
            continue
    return None


def _check_architecture(config: dict) -> None:
    from mlx_lm.utils import _get_classes

    if not isinstance(config, dict) or not config.get("model_type"):
        raise ModelLoadError("config.json has no model_type")
    try:
        _get_classes(config)
    except ValueError as error:
        raise ModelLoadError(f"model type {config['model_type']!r} is not supported by the installed mlx-lm") from error
