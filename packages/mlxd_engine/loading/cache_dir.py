"""Where mlxd keeps files it derives or downloads (converted GGUF files, the default model).

Contract: ``mlxd_cache_dir()`` is ``$MLXD_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/mlxd``, else
``~/.cache/mlxd``. It only names the directory; callers create what they need under it.
"""

from __future__ import annotations

import os
from pathlib import Path


def mlxd_cache_dir() -> Path:
    """The mlxd cache directory (not created here)."""
    if os.environ.get("MLXD_CACHE_DIR"):
        return Path(os.environ["MLXD_CACHE_DIR"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "mlxd"
    return Path.home() / ".cache" / "mlxd"
