"""The processes a served target's command leaves behind outside its process group, found and stopped.

Why: ``stop()`` ends the command's process group, but a process the command starts in a session of its
own outlives it; mlx-serve-http's autostarted daemon does so by design (it outlives the gateway). Left
running after a run, such a daemon keeps the model in memory and takes CPU from whatever is measured next.

Contract:
- ``MARKER_ENV``: the variable ``ServedTarget`` puts in the command's environment, a fresh ``new_marker()``
  per start; every process the command starts inherits it, whatever its session.
- ``marked_processes(marker)``: the pids whose environment holds it, read from ``/proc`` (Linux); where
  there is no ``/proc`` (macOS), none: such leftovers stay, as without this module.
- ``stop_marked(marker, grace_s)``: SIGTERM to each marked process, SIGKILL to those still there after
  ``grace_s``; returns how many it found.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

MARKER_ENV = "MLX_BENCH_SERVED"


def new_marker() -> str:
    return uuid.uuid4().hex


def marked_processes(marker: str) -> list[int]:
    wanted = f"{MARKER_ENV}={marker}".encode()
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        if wanted in environ.split(b"\0") and int(entry.name) != os.getpid():
            found.append(int(entry.name))
    return found


def stop_marked(marker: str, grace_s: float = 10.0) -> int:
    pids = marked_processes(marker)
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + wait_s
        while (alive := [pid for pid in pids if _alive(pid)]) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not alive:
            break
        pids = alive
    return len(pids)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has exited; its parent (not this process) reaps it
