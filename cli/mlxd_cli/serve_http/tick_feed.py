"""The scheduler live: one daemon's tick trace, shared by every viewer of ``/ui/ticks``, in batches.

Contract: a ``TickFeed`` holds one subscription to its daemon's tick trace (``AsyncClient.subscribe_ticks``,
the same socket and frames as mlx-inspect-tick's ``Client.subscribe_ticks``) while at least one viewer
watches, and none otherwise (the daemon publishes only while someone subscribes): however many viewers,
the daemon sends each tick once. Every ``FEED_INTERVAL_S`` each viewer gets one update (``feed_update``):
the interval's ticks as compact rows, the last few in full (what each row did), and the daemon's last
Status figures (queue, KV, prefix cache: as old as the pool's last health probe, at most
``Settings.health_interval_s``). A viewer that falls behind loses its oldest updates; it never holds the
feed up. At most ``MAX_VIEWERS`` watch one daemon (``ViewersFull`` beyond).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import asdict

from mlxd_protocol import DaemonError, Tick

from .daemon_pool import DaemonHandle

FEED_INTERVAL_S = 0.25  # four updates a second: smooth plots, little work for the gateway and the page
MAX_VIEWERS = 8  # viewers of one daemon at once
VIEWER_BACKLOG = 16  # updates a viewer may fall behind (4 s) before its oldest are dropped
RECENT_TICKS = 8  # ticks per update sent whole, rows and all (the page's table)
# One tick as a compact row: the field order of the lists in an update's "ticks".
TICK_COLUMNS = ("tick", "batch", "pipelined", "steps", "duration_ms", "tokens", "drafted", "accepted", "prefill")

log = logging.getLogger(__name__)


class ViewersFull(Exception):
    """The daemon already has ``MAX_VIEWERS`` viewers."""


def tick_tokens(tick: Tick) -> int:
    """Tokens the tick gave its rows: a decode its step(s), a verify its accepted drafts and the next token,
    a prefill's last chunk its first token (a primed lookahead step is read, and counted, by a later tick)."""
    total = 0
    for row in tick.rows:
        if row.action == "decode":
            total += row.tokens or 1
        elif row.action == "verify":
            total += (row.accepted or 0) + 1
        elif row.action == "first-token":
            total += 1
    return total


def tick_row(tick: Tick) -> list:
    """A tick as one compact row (``TICK_COLUMNS``)."""
    verified = [row for row in tick.rows if row.action == "verify"]
    return [
        tick.tick,
        tick.batch,
        int(tick.pipelined),
        tick.steps,
        round(tick.duration_ms, 3),
        tick_tokens(tick),
        sum(row.drafted or 0 for row in verified),
        sum(row.accepted or 0 for row in verified),
        tick.prefill_tokens,
    ]


def tick_detail(tick: Tick) -> dict:
    """A tick whole: its fields, and each row without the fields it left unset (as mlx-inspect-tick --json)."""
    return {
        "tick": tick.tick,
        "batch": tick.batch,
        "pipelined": tick.pipelined,
        "steps": tick.steps,
        "duration_ms": round(tick.duration_ms, 3),
        "prefill_tokens": tick.prefill_tokens,
        "rows": [
            {key: value for key, value in asdict(row).items() if value is not None and key != "request_id"}
            | {"request": row.request_id.rsplit(":", 1)[-1][:8]}
            for row in tick.rows
        ],
    }


def status_figures(handle: DaemonHandle) -> dict | None:
    """What the page plots of the daemon's last Status: rows running and queued, KV and prefix cache use."""
    status = handle.status
    if status is None:
        return None
    kv = dict(status.memory.get("kv") or {})
    prefix_cache = kv.pop("prefix_cache", None)
    return {
        "up": handle.up,
        "active": status.active,
        "queued": status.queued,
        "max_batch": status.options.get("max_batch"),
        "kv": kv,
        "prefix_cache": prefix_cache,
    }


def feed_update(ticks: list[Tick], handle: DaemonHandle, interval_s: float, error: str | None = None) -> dict:
    """One update for the viewers: the interval's ticks and the daemon's status figures."""
    update = {
        "time": time.time(),
        "interval_s": interval_s,
        "columns": TICK_COLUMNS,
        "ticks": [tick_row(tick) for tick in ticks],
        "recent": [tick_detail(tick) for tick in ticks[-RECENT_TICKS:]],
        "status": status_figures(handle),
    }
    if error is not None:
        update["error"] = error
    return update


class TickFeed:
    """One daemon's tick trace for its viewers; see the module docstring.

    Args:
        handle: The daemon (its client opens the subscription).
        interval_s: Seconds between updates.
    """

    def __init__(self, handle: DaemonHandle, interval_s: float = FEED_INTERVAL_S) -> None:
        self.handle = handle
        self.interval_s = interval_s
        self._viewers: set[asyncio.Queue] = set()
        self._task: asyncio.Task | None = None

    @property
    def viewers(self) -> int:
        return len(self._viewers)

    def join(self) -> asyncio.Queue:
        """A new viewer's queue of updates (the subscription starts with the first viewer).

        Raises:
            ViewersFull: ``MAX_VIEWERS`` already watch.
        """
        if len(self._viewers) >= MAX_VIEWERS:
            raise ViewersFull
        queue: asyncio.Queue = asyncio.Queue(maxsize=VIEWER_BACKLOG)
        self._viewers.add(queue)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="mlxd-tick-feed")
        return queue

    async def leave(self, queue: asyncio.Queue) -> None:
        """A viewer went; the subscription ends with the last one."""
        self._viewers.discard(queue)
        if not self._viewers and self._task is not None:
            task, self._task = self._task, None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _publish(self, update: dict) -> None:
        for queue in self._viewers:
            if queue.full():
                queue.get_nowait()  # a viewer that does not keep up loses its oldest update
            queue.put_nowait(update)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        subscription = self.handle.client.subscribe_ticks()
        try:
            ticks: list[Tick] = []
            due = loop.time() + self.interval_s
            while True:
                error = None
                try:
                    tick = await subscription.receive(timeout_s=max(0.0, due - loop.time()))
                except DaemonError as failure:  # a frame the protocol refuses: say so, keep watching
                    tick, error = None, failure.message
                    log.warning("tick trace: %s", failure.message)
                if tick is not None:
                    ticks.append(tick)
                if loop.time() >= due or error is not None:
                    self._publish(feed_update(ticks, self.handle, self.interval_s, error))
                    ticks = []
                    due += self.interval_s
                    if due < loop.time():  # fell behind (a slow loop): count the next interval from now
                        due = loop.time() + self.interval_s
        finally:
            subscription.close()
