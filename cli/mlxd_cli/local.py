"""``mlx-generate --local``: the daemon's core in this process, reached through the one seam ``mlxd_daemon.local``.

The only module of the tools that imports the daemon, and only inside ``open_local_client`` (that import
loads mlx), so importing any tool never loads it. tests/test_import_rules.py holds this rule.
"""

from __future__ import annotations

from mlxd_protocol import LocalClient


def open_local_client(model: str | None) -> LocalClient:
    """The daemon's core on ``model`` (None: the daemon's default model), with the daemon's default options.

    One row of KV storage (``max_batch`` 1: one request at a time here); every other option is what a
    bare ``mlxd`` runs with.
    """
    from mlxd_daemon.local import local_client  # the seam

    return local_client(model=model, max_batch=1)
