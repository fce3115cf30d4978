"""Supervising the daemon a gateway started: notice its exit, reap it, start it again with back-off.

Contract:
    * ``DaemonSupervisor(endpoint, model, extra_args, process)`` takes over a daemon this gateway
      started (``process``: its ``Popen`` from ``autostart.start_daemon``, a child of the gateway).
      ``run(someone_answers)``, a task for the app's lifetime, polls the process every ``EXIT_POLL_S``;
      the poll reaps an exited daemon, so it never stays a zombie.
    * After an exit (a crash, ``kill -9``, an OOM kill) it starts the daemon again with the same command,
      after ``RESTART_DELAYS_S[n]`` for the n-th exit in a row of a daemon that ran less than
      ``STABLE_RUN_S`` (the first restart is at once; a daemon that cannot start is retried ever more
      slowly, not in a loop). While ``someone_answers()`` (another daemon serves the endpoint now) it
      starts none: mlxd refuses to start beside a daemon that answers.
    * Requests in flight on the dead daemon are failed by the pool at once (the dropped connection:
      503, or an SSE error event); the pool reconnects to the new daemon by itself, and /health turns
      200 again as soon as it answers.
    * A daemon the gateway did not start (``--daemon``, or one that already answered) has no
      supervisor: the pool only waits for it to come back.
    * Cancelling ``run`` ends supervision; the daemon keeps running (it was started detached and
      outlives the gateway, as autostarted daemons do).
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import time
from collections.abc import Callable

from mlxd_protocol.autostart import spawn_daemon

log = logging.getLogger("mlx-serve-http")

EXIT_POLL_S = 0.1  # an exit is noticed (and the process reaped) within this
RESTART_DELAYS_S = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0)  # by exits in a row; the last one repeats
STABLE_RUN_S = 60.0  # a daemon that ran this long before exiting restarts at once again
ANSWER_POLL_S = 0.2


class DaemonSupervisor:
    """Restarts the daemon this gateway started; see the module docstring.

    Args:
        endpoint: The daemon's endpoint.
        model: Its ``--model`` (None: the default).
        extra_args: Its other options.
        process: The running daemon.
    """

    def __init__(self, endpoint: str, model: str | None, extra_args: list[str], process: subprocess.Popen) -> None:
        self.endpoint = endpoint
        self.model = model
        self.extra_args = list(extra_args)
        self.process = process
        self.started_at = time.monotonic()
        self.restarts = 0
        self.quick_exits = 0  # exits in a row of daemons that ran less than STABLE_RUN_S

    async def run(self, someone_answers: Callable[[], bool]) -> None:
        """Watch the daemon and restart it whenever it exits (until cancelled).

        Args:
            someone_answers: True while a daemon answers at the endpoint (the pool's view).
        """
        while True:
            await asyncio.sleep(EXIT_POLL_S)
            status = self.process.poll()  # reaps it when it exited
            if status is None:
                continue
            ran_s = time.monotonic() - self.started_at
            self.quick_exits = 0 if ran_s >= STABLE_RUN_S else self.quick_exits + 1
            delay = RESTART_DELAYS_S[min(self.quick_exits, len(RESTART_DELAYS_S) - 1)]
            log.warning(
                "mlxd (pid %d) at %s exited with status %s after %.1f s; starting it again in %g s",
                self.process.pid,
                self.endpoint,
                status,
                ran_s,
                delay,
            )
            await asyncio.sleep(delay)
            while someone_answers():  # another daemon took the endpoint: not ours to replace
                await asyncio.sleep(ANSWER_POLL_S)
            self.started_at = time.monotonic()
            try:
                self.process = spawn_daemon(self.endpoint, self.model, self.extra_args)
            except OSError as error:  # the old, exited process stays: the next poll counts a quick exit
                log.error("cannot start mlxd at %s: %s", self.endpoint, error)
                continue
            self.restarts += 1
            log.info("started mlxd again at %s (pid %d, restart %d)", self.endpoint, self.process.pid, self.restarts)
