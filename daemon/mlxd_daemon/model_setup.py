"""Which model the daemon serves and how it is loaded: one function shared by ``mlxd`` and ``--local``.

Contract: ``load_for_serving(options)`` resolves ``options.model`` and loads it through the engine:
- None: the default model (SmolLM2-135M-Instruct, fetched and converted once; see
  ``mlxd_engine.loading.default_model``), or the embedded tiny model with a logged warning where it cannot be had;
- ``embedded`` (or ``mlxd-qwen3-tiny``): the embedded tiny model;
- anything else: a checkpoint directory, a ``.gguf`` file or a hub id, as ``mlxd_engine.load`` takes it.
The CPU weight rule gets ``options.cpu_weight_budget`` of the machine's memory; ``options.chat_template``
(``--chat-template``) replaces the model's chat template. A model the engine cannot
serve raises ``ModelLoadError`` with a message for the user.
"""

from __future__ import annotations

import logging

from mlxd_engine import (
    EMBEDDED_ALIASES,
    LoadedModel,
    default_budget_bytes,
    embedded_model_path,
    load,
    resolve_default_model,
)

from .chat_templates import install_chat_template
from .options import DaemonOptions

log = logging.getLogger("mlxd")


def resolve_model_name(model: str | None) -> str:
    """The path or hub id to load for ``--model`` (see the module docstring); logs what it chose."""
    if model is None:
        path, note = resolve_default_model()
        (log.info if path != embedded_model_path() else log.warning)("%s", note)
        return str(path)
    if model.strip().lower() in EMBEDDED_ALIASES:
        return str(embedded_model_path())
    return model


def load_for_serving(options: DaemonOptions, group=None) -> LoadedModel:
    """Load the model; with ``group`` (``--distributed``) only this rank's part of it."""
    distributed = (options.distributed, group) if group is not None else None
    loaded = load(
        resolve_model_name(options.model),
        cpu_weight_budget=default_budget_bytes(options.cpu_weight_budget),
        cpu_weights=options.cpu_weights,
        distributed=distributed,  # type: ignore[arg-type]  # with a group, options.distributed is set
    )
    log.info("%s", loaded.weights)
    if options.chat_template is not None and loaded.tokenizer is not None:
        install_chat_template(loaded.tokenizer, options.chat_template)
        log.info("chat template: the one given by --chat-template(-file), not the model's")
    return loaded
