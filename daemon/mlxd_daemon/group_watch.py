"""Noticing a lost rank while MLX waits for it: a thread that watches the group's TCP connections.

Why: when a rank dies, the ring backend fails the collectives pending at that moment, but a collective
queued later (an ``async_eval``'d step, the next plan) waits for ever, inside MLX, with the GIL released.
So the loss cannot always come back as an exception. The kernel knows, though: the dead rank's end of
every connection is closed (a killed or crashed process: at once; a machine that loses power: only
when TCP gives up), and our end leaves ESTABLISHED.

Contract: ``GroupWatch()`` is built right after the group is joined, when the process's only TCP
connections are the backend's (ring: one or more per neighbour). ``start()`` runs a daemon thread that
checks them every ``POLL_S`` and calls ``handler(reason)`` once, from that thread, when one of them is no
longer ESTABLISHED. The first handler ends the process (a rank lost while the model loads); the serving
code puts its own in place once it can answer clients. A backend without TCP connections of its own (RDMA) is
watched by progress instead: ``busy()`` says since when the caller has been inside a collective, and ``STALL_S``
(``MLXD_DISTRIBUTED_STALL_S``, default 120) without progress counts as lost. ``stop()`` before a clean
shutdown (the other ranks then close their ends on purpose).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

import psutil

log = logging.getLogger("mlxd.distributed")

POLL_S = 0.2
STALL_S = float(os.environ.get("MLXD_DISTRIBUTED_STALL_S", "120"))


def _established() -> set[tuple]:
    return {
        (c.laddr, c.raddr)
        for c in psutil.Process().net_connections(kind="tcp")
        if c.status == psutil.CONN_ESTABLISHED and c.raddr
    }


LOAD_GRACE_S = 3.0  # a rank refusing the model exits at once; the others get this long to say why too


def _exit_now(reason: str) -> None:
    log.error("distributed group lost: %s; exiting", reason)
    logging.shutdown()
    os._exit(1)


class GroupWatch:
    def __init__(self):
        self.connections = _established()
        self.busy: Callable[[], float | None] = lambda: None
        self.handler: Callable[[str], None] = _exit_now
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def describe(self) -> str:
        if self.connections:
            return f"{len(self.connections)} TCP connections of the group"
        return f"progress (no TCP connections of the group: lost after {STALL_S:.0f}s stuck in a collective)"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="mlxd-group-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def lost_reason(self) -> str | None:
        """Why the group is lost, or None while it looks whole."""
        if self.connections:
            closed = self.connections - _established()
            if closed:
                local, remote = sorted(closed)[0]
                return f"the connection to the rank at {remote.ip}:{remote.port} closed (a rank exited or was killed)"
            return None
        since = self.busy()
        if since is not None and time.monotonic() - since > STALL_S:
            return f"no progress for {STALL_S:.0f}s inside a collective (a rank is gone or stuck)"
        return None

    def _run(self) -> None:
        while not self._stopped.wait(POLL_S):
            try:
                reason = self.lost_reason()
            except psutil.Error as error:  # never take the daemon down for the watch itself
                log.debug("group watch: %s", error)
                continue
            if reason is not None and not self._stopped.is_set():
                handler = self.handler
                if handler is _exit_now and self._stopped.wait(LOAD_GRACE_S):
                    return  # this rank stopped on its own meanwhile (it refused the model too)
                handler(reason)
                return
