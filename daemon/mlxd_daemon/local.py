"""The one seam between the command-line tools and the daemon: the daemon's core in the caller's process.

Contract: ``local_client(options=None, **overrides)`` loads the model with ``model_setup.load_for_serving``
and wraps the daemon's core (``core.DaemonCore``: the same scheduler, speculative dispatch, handlers,
edge and reply streams as ``mlxd``), built from the same ``DaemonOptions`` and with the same measured step
settings (``step_tuning``), in a ``mlxd_protocol.LocalClient``. ``mlx-generate --local`` and the daemon therefore run
one code path from one set of options and cannot drift. Failures come back as the protocol's errors: a model the engine
cannot serve is ``DaemonError("not_found")``, options that do not go together ``DaemonError("invalid_request")``.

Imports mlx (through the engine): the tools import this module lazily, from ``mlxd_cli.local`` only
(tests/test_layers.py holds that rule).
"""

from __future__ import annotations

import dataclasses

from mlxd_engine import ModelLoadError, calibrate_forward_cost
from mlxd_protocol import INVALID, NOT_FOUND, DaemonError, LocalClient

from .core import DaemonCore
from .model_setup import load_for_serving
from .options import DaemonOptions
from .step_tuning import tune_steps


def local_client(options: DaemonOptions | None = None, **overrides) -> LocalClient:
    """A client for the daemon's core running here.

    Args:
        options: The daemon's options (default: ``DaemonOptions()``, what a bare ``mlxd`` runs).
        **overrides: Fields of ``DaemonOptions`` to change, e.g. ``model=...``, ``max_batch=1``.

    Returns:
        The LocalClient (close it, or use it in a ``with``).

    Raises:
        DaemonError: "not_found" when the model cannot be loaded, "invalid_request" for bad options.
    """
    options = dataclasses.replace(options or DaemonOptions(), **overrides)
    try:
        loaded = load_for_serving(options)
    except ModelLoadError as error:
        raise DaemonError(NOT_FOUND, str(error)) from error

    def build_core(deliver) -> DaemonCore:
        core = DaemonCore(loaded, options, deliver, endpoint="local")
        tune_steps(core.engine)  # the same measured step settings as mlxd
        calibrate_forward_cost(core.engine)  # and the same verify-gate cost model
        return core

    try:
        return LocalClient(build_core)
    except ValueError as error:
        raise DaemonError(INVALID, str(error)) from error
