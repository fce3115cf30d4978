"""Which model the daemon serves and how it is loaded: one function shared by ``mlxd`` and ``--local``.

Contract: ``load_for_serving(options)`` resolves ``options.model`` (None: the default model), loads it
through the engine and returns the ``LoadedModel``; a model the engine cannot serve raises
``ModelLoadError`` with a message for the user.
"""

from __future__ import annotations

import logging

from mlxd_engine import LoadedModel, load

from .options import DaemonOptions

log = logging.getLogger("mlxd")


def load_for_serving(options: DaemonOptions) -> LoadedModel:
    return load(options.model)
