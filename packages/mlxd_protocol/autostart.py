"""Start mlxd in the background when no daemon answers (used by mlx-generate and mlx-serve-http).

Contract: ``ensure_daemon(endpoint, model, extra_args)`` returns once a daemon answers at ``endpoint``:
either one already did, or this call started ``python -m mlxd_daemon`` detached (its own session, so it
outlives the caller), waited for its ready line and a status answer. The daemon's output goes to a log
file beside its socket. A daemon that dies or does not get ready in time raises ``AutostartError`` with
the end of that log. The parts are public for a caller that supervises the daemon it starts (the HTTP
gateway): ``daemon_answers``, ``spawn_daemon`` (start, do not wait) and ``start_daemon`` (start and wait;
returns the process, which stays the caller's child to reap). This module never imports mlx.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from .client import Client
from .endpoints import ensure_private_dir, pid_file

DEFAULT_START_TIMEOUT_S = 180.0


class AutostartError(RuntimeError):
    """The daemon could not be started."""


def log_file(endpoint: str) -> Path:
    return pid_file(endpoint).with_suffix(".log")


def ensure_daemon(
    endpoint: str,
    model: str | None = None,
    extra_args: list[str] | None = None,
    timeout_s: float = DEFAULT_START_TIMEOUT_S,
) -> bool:
    """Make sure a daemon answers at ``endpoint``.

    Args:
        endpoint: where the daemon listens (or will).
        model: the model to load if a daemon has to be started (None: the daemon's default model).
        extra_args: further ``mlxd`` options for a daemon started here.
        timeout_s: how long to wait for a started daemon to answer.
    Returns:
        True if this call started the daemon, False if one already answered.
    Raises:
        AutostartError: the daemon exited or did not answer in time.
    """
    if daemon_answers(endpoint):
        return False
    start_daemon(endpoint, model, extra_args, timeout_s)
    return True


def daemon_answers(endpoint: str) -> bool:
    """True when a daemon answers a ping at ``endpoint`` within a second."""
    with Client(endpoint, timeout_s=2.0) as client:
        return client.ping(1.0)


def spawn_daemon(endpoint: str, model: str | None = None, extra_args: list[str] | None = None) -> subprocess.Popen:
    """Start ``python -m mlxd_daemon`` at ``endpoint``, detached, its output appended to its log file.

    Args:
        endpoint: Where it listens.
        model: The model to load (None: the daemon's default).
        extra_args: Further ``mlxd`` options.

    Returns:
        The process (not waited for: it may still be loading, or about to fail).
    """
    ensure_private_dir(endpoint)
    command = [sys.executable, "-m", "mlxd_daemon", "--endpoint", endpoint, *(extra_args or [])]
    if model:
        command += ["--model", str(model)]
    with open(log_file(endpoint), "ab") as log:
        return subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True
        )


def start_daemon(
    endpoint: str,
    model: str | None = None,
    extra_args: list[str] | None = None,
    timeout_s: float = DEFAULT_START_TIMEOUT_S,
) -> subprocess.Popen:
    """``spawn_daemon``, then wait until it answers.

    Returns:
        The process, answering.

    Raises:
        AutostartError: It exited or did not answer within ``timeout_s``.
    """
    process = spawn_daemon(endpoint, model, extra_args)
    log_path = log_file(endpoint)
    deadline = time.monotonic() + timeout_s
    with Client(endpoint, timeout_s=2.0) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise AutostartError(f"mlxd exited with status {process.returncode}:\n{_tail(log_path)}")
            if client.ping(0.5):
                return process
            time.sleep(0.1)
    raise AutostartError(f"mlxd did not answer within {timeout_s:.0f}s (log: {log_path}):\n{_tail(log_path)}")


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
