"""Host work off the loop thread: decoding large frames, chat templates, tokenizing, grammar compilation.

Contract: ``HostWork(workers)`` starts ``workers`` threads. ``submit(work, finish)`` runs ``work()`` on one
of them and later, on the loop thread, ``finish(future)`` with a finished ``concurrent.futures.Future``
(its ``result()`` returns what ``work`` returned or raises what it raised, whatever it was). Finishes run
only inside ``collect()``, which the loop calls every turn, so everything the daemon's state is made of
(scheduler, reply streams, sockets) stays on the loop thread and still needs no lock. ``wake_fd`` becomes
readable whenever a finish is due: the socket loop polls it beside its sockets, so an idle loop picks a
result up at once. ``pending`` counts submitted work whose finish has not run.

Why threads and not processes: the work needs the loaded tokenizer and llguidance's tokenizer, which
live here. The tokenizer library and llguidance drop the GIL while they compute, and Python code (chat
templates) gives it up every switch interval, so the loop keeps ticking while a worker computes.
Worker threads get a large stack (``WORKER_STACK_BYTES``): grammar compilation recurses in native code.
"""

from __future__ import annotations

import logging
import os
import queue
import select
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

log = logging.getLogger("mlxd")

WORKER_STACK_BYTES = 64 * 1024 * 1024

Finish = Callable[[Future], None]


class HostWork:
    """See the module docstring.

    Args:
        workers: Threads to start (at least 1).
    """

    def __init__(self, workers: int):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._finished: deque[tuple[Future, Finish]] = deque()  # appended by workers, emptied by collect
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        self.pending = 0
        self._closed = False
        self._live = max(1, workers)  # workers not stopped yet
        self._live_lock = threading.Lock()
        previous = threading.stack_size(WORKER_STACK_BYTES)
        try:
            self._threads = [
                threading.Thread(target=self._serve, name=f"mlxd-host-{index}", daemon=True)
                for index in range(max(1, workers))
            ]
            for thread in self._threads:
                thread.start()
        finally:
            threading.stack_size(previous)

    @property
    def wake_fd(self) -> int:
        return self._wake_read

    def submit(self, work: Callable[[], Any], finish: Finish) -> None:
        """Run ``work`` on a worker; ``finish(future)`` runs on the loop thread in a later ``collect``."""
        self.pending += 1
        self._jobs.put((work, finish))

    def collect(self) -> int:
        """Run the finishes that are due (on the caller's thread). Returns how many ran."""
        if self._closed:
            return 0
        try:
            while os.read(self._wake_read, 4096):
                pass
        except BlockingIOError:
            pass
        ran = 0
        while self._finished:
            future, finish = self._finished.popleft()
            self.pending -= 1
            ran += 1
            finish(future)
        return ran

    def wait(self, timeout_s: float) -> None:
        """Block up to ``timeout_s`` until a finish is due (for a driver without a poller of its own)."""
        if not self._finished and not self._closed:
            select.select([self._wake_read], [], [], timeout_s)

    def close(self) -> None:
        """Stop the workers once they finish what they run (their results are dropped). The last worker
        to stop closes the wake pipe's write end, so no worker can write to a descriptor reused since."""
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._jobs.put(None)
        os.close(self._wake_read)

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                with self._live_lock:
                    self._live -= 1
                    if self._live == 0:
                        os.close(self._wake_write)
                return
            work, finish = job
            future: Future = Future()
            try:
                future.set_result(work())
            except BaseException as error:  # noqa: BLE001 - a native panic too: the loop thread answers it
                future.set_exception(error)
            self._finished.append((future, finish))
            try:
                os.write(self._wake_write, b"\0")
            except OSError:
                pass  # the pipe is full (a wake-up is already due) or its reader is gone (shutting down)
