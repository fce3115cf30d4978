"""In-process client: the real scheduler driven from the caller's thread, without sockets.

Contract: ``InProcessClient(scheduler)`` ticks the scheduler itself whenever a caller waits for an event
that has not arrived yet, so several ``generate`` iterators may be interleaved on one thread and their
requests are batched together exactly as in the daemon. No thread is started: MLX work stays on the
caller's thread (arrays made on a helper thread must not outlive it, which is easy to get wrong).
Leaving a ``generate`` iteration early cancels its request. Used by tests and library users that want
scheduler events; ``mlx-generate --local`` uses ``mlxd_protocol.LocalClient`` (wire messages, the daemon's
whole core) instead.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from .request import Event, FinishEvent, Request
from .scheduler import BatchScheduler


class InProcessClient:
    def __init__(self, scheduler: BatchScheduler):
        self.scheduler = scheduler
        self._queues: dict[str, deque] = {}

    def submit(self, request: Request) -> None:
        """Queue a request; its events are collected until ``events`` or ``generate`` reads them."""
        queue: deque = deque()
        self.scheduler.submit(request, queue.append)
        self._queues[request.request_id] = queue

    def events(self, request_id: str) -> Iterator[Event]:
        """Yield a submitted request's events, ticking the scheduler while none is waiting."""
        queue = self._queues[request_id]
        try:
            while True:
                while not queue:
                    if not self.scheduler.has_work:
                        raise RuntimeError(f"request {request_id} ended without a finish event")
                    self.scheduler.tick()
                event = queue.popleft()
                yield event
                if isinstance(event, FinishEvent):
                    return
        finally:
            if self._queues.pop(request_id, None) is not None and request_id in self.scheduler.by_id:
                self.cancel(request_id)

    def generate(self, request: Request) -> Iterator[Event]:
        """Submit ``request`` and yield its events until (and including) the FinishEvent."""
        self.submit(request)
        return self.events(request.request_id)

    def run(self, requests: list[Request]) -> dict[str, list[Event]]:
        """Run several requests together (one batch) to completion; events per request id."""
        for request in requests:
            self.submit(request)
        return {request.request_id: list(self.events(request.request_id)) for request in requests}

    def cancel(self, request_id: str) -> bool:
        cancelled = self.scheduler.cancel(request_id)
        while cancelled and request_id in self.scheduler.by_id:
            self.scheduler.tick()
        return cancelled
