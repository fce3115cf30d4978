"""The daemons behind the gateway: health, least-busy choice, and failover.

Contract:
    * ``DaemonPool(endpoints)`` keeps one ``AsyncClient`` per daemon. ``start()`` probes them once,
      then one health task per daemon asks it for its Status every ``health_interval_s`` (at once
      again after a miss). A daemon is *up* after one answer, *down* after ``DOWN_AFTER_MISSES``
      misses in a row, and *stalled* when no probe sent in the last ``STALLED_DAEMON_TIMEOUT_S``
      seconds was answered on an open connection (a daemon that hangs with its socket open): then its
      client is closed, which fails every request still waiting on it with ``client_closed`` (a stream
      ends with an error event, a plain answer is a 503), and a fresh client is opened. That one value
      is the whole stalled-daemon timeout: it counts time, not probes, so probes made for /health do
      not shorten it, and no per-call timeout fires before it (``REPLY_TIMEOUT_S`` is only a backstop
      for a daemon that answers probes yet never replies to one request).
      Down only stops new requests (a daemon busy with a long prefill may answer probes late). A new
      request that finds no daemon up waits for one that is only *late* (its connection open, probes
      unanswered but not yet for the stalled-daemon timeout) instead of failing: a single daemon whose
      tick outlasts two probes, or that the machine's other work starves, then delays requests the way
      a busy server does, and they fail only once it counts as stalled (or its connection drops).
    * A daemon that exits or is killed is noticed at once, not after missed probes: its client's
      socket monitor reports the dropped connection, which fails the requests waiting on it with
      ``disconnected`` (a stream then ends with an error event) and marks the daemon down. While
      the connection is down a probe misses without waiting (so /health answers 503 at once) and the
      health task waits for ZeroMQ's reconnection instead of probing.
    * ``pick`` chooses among up daemons the one with the fewest requests in flight through this
      gateway; ties go round-robin.
    * ``open_stream(make_request)`` sends a Generate and waits for its first reply. If, before that
      reply, the daemon goes down while another daemon is up, or the daemon times out or is
      shutting down, the request is cancelled there and sent to the next up daemon: nothing has
      reached the client yet. Once a reply came, failures are the caller's. "overloaded" (a full
      queue, or a daemon draining for shutdown) moves on to an untried up daemon and is raised
      when none is left; other daemon errors (invalid request) are raised at once.
    * ``open_generation`` / ``call_daemon`` are the same with failures mapped to HTTP errors.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from mlxd_protocol import (
    OVERLOADED,
    AsyncClient,
    Chunk,
    DaemonError,
    DaemonTimeout,
    Done,
    Generate,
    Progress,
    ProtocolError,
    Status,
)

from .draft_keys import with_draft_key
from .errors import UNAVAILABLE_CODES, NoDaemonAvailable, from_daemon_failure

log = logging.getLogger("mlx-serve-http")

DOWN_AFTER_MISSES = 2  # one late answer under load is not an outage
# A daemon whose open connection answered no probe for this long is stalled: its requests fail (503 or
# an SSE error event) and its client is replaced. A daemon answers probes only between ticks, so this is
# far above a busy daemon's longest tick (docs/benchmark_results/code_notes.md#stalled-daemon).
STALLED_DAEMON_TIMEOUT_S = 30.0
PROBE_TIMEOUT_S = 1.0
LATE_DAEMON_POLL_S = 0.05  # how often a request waiting for a late daemon looks again
# Per-reply wait on the protocol client: a backstop far above STALLED_DAEMON_TIMEOUT_S, for a daemon that
# answers probes but never replies to one request. A stalled or dead daemon is noticed well before this.
REPLY_TIMEOUT_S = 600.0


@dataclass
class DaemonHandle:
    """One daemon as the gateway sees it."""

    endpoint: str
    client: AsyncClient
    up: bool = False
    in_flight: int = 0
    misses: int = 0
    status: Status | None = None  # the last Status it answered
    last_error: str = "not probed yet"  # why it is down, as clients may read it (no endpoint, no path)
    unanswered_since: float | None = None  # loop time the first unanswered probe of this run was sent
    went_down: asyncio.Event = field(default_factory=asyncio.Event)  # set while down; new one when up

    @property
    def sampling_defaults(self) -> dict:
        """The daemon's default sampling settings (from its Status)."""
        return dict(self.status.options.get("sampling") or {}) if self.status else {}

    @property
    def context_bound(self) -> int | None:
        """Most tokens (prompt + output) one sequence may hold on this daemon."""
        return self.status.options.get("max_kv_size") if self.status else None

    @property
    def shifts_context(self) -> bool:
        """Whether this daemon shifts a full context instead of ending the generation (``--context-shift``)."""
        return bool(self.status.options.get("context_shift")) if self.status else False


@dataclass
class GenerationStream:
    """A generation in flight on one daemon: an async iterator of its first reply, then the rest."""

    handle: DaemonHandle
    first: Chunk | Progress | Done
    replies: AsyncGenerator[Chunk | Progress | Done, None]
    _first_taken: bool = field(default=False, repr=False)
    _closed: bool = field(default=False, repr=False)

    def __aiter__(self) -> GenerationStream:
        return self

    async def __anext__(self) -> Chunk | Progress | Done:
        # A plain iterator, not an async generator: no extra generator frame is left suspended
        # when the consumer goes away, so aclose() reaches the protocol client directly.
        if not self._first_taken:
            self._first_taken = True
            return self.first
        if self._closed or isinstance(self.first, Done):
            raise StopAsyncIteration
        return await anext(self.replies)

    async def aclose(self) -> None:
        """End the stream: cancels the generation on the daemon if it is still running."""
        if self._closed:
            return
        self._closed = True
        self.handle.in_flight -= 1
        await self.replies.aclose()


class _FailOver(Exception):
    """The daemon went down before the first reply; another daemon is up."""


class DaemonPool:
    """The daemons behind one gateway; see the module docstring.

    Args:
        endpoints: The daemons' endpoints (at least one).
        health_interval_s: Seconds between two health probes of each daemon.
    """

    def __init__(self, endpoints: list[str], health_interval_s: float = 1.0) -> None:
        if not endpoints:
            raise ValueError("the pool needs at least one daemon endpoint")
        self.handles = [DaemonHandle(endpoint, self._new_client(endpoint)) for endpoint in endpoints]
        for handle in self.handles:
            handle.went_down.set()  # down until a probe says otherwise
            self._watch_connection(handle)
        self.health_interval_s = health_interval_s
        self._round_robin = itertools.count()
        self._watchers: list[asyncio.Task] = []

    @staticmethod
    def _new_client(endpoint: str) -> AsyncClient:
        return AsyncClient(endpoint, timeout_s=REPLY_TIMEOUT_S)

    def _watch_connection(self, handle: DaemonHandle) -> None:
        client = handle.client

        def dropped(reason: str) -> None:
            if handle.client is client:  # not a client already replaced by a fresh one
                log.warning("daemon %s: %s", handle.endpoint, reason)
                self.mark_down(handle, "its connection dropped (it exited or was killed)")

        client.on_disconnect(dropped)

    # ---- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Probe every daemon once, then keep probing each in the background."""
        for handle in self.handles:
            handle.client.start()  # connection events flow from now on, requests or not
        await self.probe_all()
        loop = asyncio.get_running_loop()
        self._watchers = [
            loop.create_task(self._watch(handle), name=f"mlxd-health {handle.endpoint}") for handle in self.handles
        ]

    async def stop(self) -> None:
        """Stop probing and close every client (requests still waiting fail with client_closed)."""
        for watcher in self._watchers:
            watcher.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        for handle in self.handles:
            await handle.client.aclose()

    async def _watch(self, handle: DaemonHandle) -> None:
        while True:
            try:
                answered = await self._probe(handle)
            except Exception:  # a probe bug must not end health checking for good
                log.exception("health probe of %s failed", handle.endpoint)
                answered = False
            if answered:
                await asyncio.sleep(self.health_interval_s)
            elif handle.client.connection_lost:
                # nothing can answer before ZeroMQ reconnects: wait for that instead of probing
                await handle.client.wait_connected(self.health_interval_s)
            else:
                # After a miss, ask again at once: an outage is then confirmed (or not) within ~1 s.
                await asyncio.sleep(0.05)

    async def probe_all(self) -> None:
        """Ask every daemon for its Status at once and mark each up or down."""
        await asyncio.gather(*(self._probe(handle) for handle in self.handles))

    async def _probe(self, handle: DaemonHandle) -> bool:
        if handle.client.connection_lost:
            self.mark_down(handle, "its connection dropped (it exited or was killed) and is not back yet")
            return False  # at once: a probe could only time out
        loop = asyncio.get_running_loop()
        sent_at = loop.time()
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                status = await handle.client.status()
        except (DaemonError, DaemonTimeout, TimeoutError) as error:
            handle.misses += 1
            if handle.unanswered_since is None:
                handle.unanswered_since = sent_at
            log.debug("no answer from %s: %s", handle.endpoint, str(error) or type(error).__name__)
            if handle.misses >= DOWN_AFTER_MISSES or not handle.up:
                self.mark_down(handle, "it does not answer (busy, loading or stalled)")
            if loop.time() - handle.unanswered_since >= STALLED_DAEMON_TIMEOUT_S:
                handle.unanswered_since = None  # the fresh client starts a new count
                await self._reset_client(handle)
            return False
        handle.status = status
        handle.misses = 0
        handle.unanswered_since = None
        if not handle.up:
            log.info("daemon %s is up (model %s)", handle.endpoint, status.model)
            handle.up = True
            handle.went_down = asyncio.Event()
        return True

    def mark_down(self, handle: DaemonHandle, reason: str) -> None:
        """Stop sending new requests to a daemon and fail over those waiting for a first reply.

        Args:
            handle: The daemon.
            reason: Why, for the log and /health.
        """
        handle.last_error = reason
        if handle.up:
            log.warning("daemon %s is down: %s", handle.endpoint, reason)
        handle.up = False
        handle.went_down.set()

    async def _reset_client(self, handle: DaemonHandle) -> None:
        """Close a dead daemon's client (waking everything waiting on it) and open a fresh one."""
        log.warning(
            "daemon %s answered no probe for %g s (stalled); failing its requests",
            handle.endpoint,
            STALLED_DAEMON_TIMEOUT_S,
        )
        old_client, handle.client = handle.client, self._new_client(handle.endpoint)
        self._watch_connection(handle)
        handle.client.start()
        await old_client.aclose()

    # ---- choosing ------------------------------------------------------------------------------

    def up_handles(self) -> list[DaemonHandle]:
        """The daemons that answered their last probe."""
        return [handle for handle in self.handles if handle.up]

    def _late(self, handle: DaemonHandle) -> bool:
        """Down only because its probes go unanswered on an open connection, not yet for the stalled timeout."""
        return not handle.up and not handle.client.connection_lost and handle.unanswered_since is not None

    async def choose(self, exclude: set[str] | frozenset[str] = frozenset()) -> DaemonHandle:
        """``pick``, except that with no daemon up it waits while one not in ``exclude`` is late (see the module
        docstring); raises ``NoDaemonAvailable`` as ``pick`` once none is."""
        while True:
            try:
                return self.pick(exclude)
            except NoDaemonAvailable:
                if not any(self._late(handle) for handle in self.handles if handle.endpoint not in exclude):
                    raise
            await asyncio.sleep(LATE_DAEMON_POLL_S)

    def pick(self, exclude: set[str] | frozenset[str] = frozenset()) -> DaemonHandle:
        """The up daemon with the fewest requests in flight; ties go round-robin.

        Args:
            exclude: Endpoints already tried for this request.

        Returns:
            The chosen daemon.

        Raises:
            NoDaemonAvailable: No daemon is up (or every up one is excluded).
        """
        candidates = [handle for handle in self.up_handles() if handle.endpoint not in exclude]
        if not candidates:
            raise NoDaemonAvailable(self.down_reasons() or "every daemon was tried")
        turn = next(self._round_robin)
        count = len(self.handles)
        order = {handle.endpoint: index for index, handle in enumerate(self.handles)}
        return min(candidates, key=lambda handle: (handle.in_flight, (order[handle.endpoint] - turn) % count))

    def down_reasons(self) -> str:
        """Why the daemons that are down are down, as clients may read it (numbered, never an endpoint)."""
        down = [(number, handle) for number, handle in enumerate(self.handles, 1) if not handle.up]
        if len(self.handles) == 1:
            return "; ".join(handle.last_error for _, handle in down)
        return "; ".join(f"daemon {number}: {handle.last_error}" for number, handle in down)

    # ---- forwarding ----------------------------------------------------------------------------

    async def open_stream(self, make_request: Callable[[DaemonHandle], Generate]) -> GenerationStream:
        """Send a Generate to the least busy daemon and wait for its first reply, failing over.

        Args:
            make_request: Builds the request for the chosen daemon (its defaults and context bound
                may shape it); called again, with a fresh id, for each daemon tried.

        Returns:
            The stream, its first reply already received; ``aclose()`` it when done.

        Raises:
            NoDaemonAvailable: No daemon could take the request.
            DaemonError: The daemon refused the request (e.g. invalid_request, overloaded).
            ProtocolError: The request breaks a protocol rule (nothing was sent).
        """
        tried: set[str] = set()
        while True:
            handle = await self.choose(tried)
            tried.add(handle.endpoint)
            replies = handle.client.generate(with_draft_key(make_request(handle)))
            handle.in_flight += 1
            try:
                first = await self._first_reply(handle, replies, tried)
            except BaseException as error:
                handle.in_flight -= 1
                await replies.aclose()
                if isinstance(error, _FailOver):
                    continue  # nothing reached the client yet: try the next daemon
                if _daemon_unavailable(error):
                    log.warning("daemon %s failed a request: %s", handle.endpoint, error)
                    self.mark_down(handle, "it stopped answering")
                    continue
                if isinstance(error, DaemonError) and error.code == OVERLOADED and self._untried(tried):
                    continue  # a full queue (or a draining daemon) here; another daemon may have room
                raise
            return GenerationStream(handle, first, replies)

    async def _first_reply(
        self, handle: DaemonHandle, replies: AsyncIterator, tried: set[str]
    ) -> Chunk | Progress | Done:
        """The first reply, unless the daemon goes down first while another one is up."""
        reply_task = asyncio.ensure_future(anext(replies))
        try:
            down_task = asyncio.ensure_future(handle.went_down.wait())
            try:
                await asyncio.wait({reply_task, down_task}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                down_task.cancel()
            if not reply_task.done() and self._untried(tried):
                raise _FailOver()
            # Alone (or the reply came): wait on; a dead daemon's reset client ends the wait.
            return await reply_task
        finally:
            if not reply_task.done():
                reply_task.cancel()  # the protocol client then sends Cancel to that daemon
                await asyncio.wait({reply_task})

    def _untried(self, tried: set[str]) -> bool:
        return any(handle.endpoint not in tried for handle in self.up_handles())

    async def call(self, operation: Callable[[AsyncClient], Awaitable[Any]]) -> Any:
        """Run one request/reply call (tokenize, detokenize) on the least busy daemon.

        Args:
            operation: Takes the daemon's client and returns the awaitable to run.

        Returns:
            What the operation returned.

        Raises:
            NoDaemonAvailable, DaemonError: as for ``open_stream``.
        """
        tried: set[str] = set()
        while True:
            handle = await self.choose(tried)
            tried.add(handle.endpoint)
            handle.in_flight += 1
            try:
                # No timeout of its own: a stalled daemon's calls end with the stalled-daemon rule.
                return await operation(handle.client)
            except (DaemonError, DaemonTimeout) as error:
                if not _daemon_unavailable(error):
                    raise
                log.warning("daemon %s failed a call: %s", handle.endpoint, error)
                self.mark_down(handle, "it stopped answering")
            finally:
                handle.in_flight -= 1

    async def statuses(self) -> list[tuple[DaemonHandle, Status | None]]:
        """Each daemon's current Status (None for one that is down or does not answer quickly)."""

        async def one(handle: DaemonHandle) -> Status | None:
            if not handle.up:
                return None
            try:
                async with asyncio.timeout(PROBE_TIMEOUT_S):
                    handle.status = await handle.client.status()
                return handle.status
            except (DaemonError, DaemonTimeout, TimeoutError):
                return None

        results = await asyncio.gather(*(one(handle) for handle in self.handles))
        return list(zip(self.handles, results))


def _daemon_unavailable(error: BaseException) -> bool:
    """True when the error says "this daemon cannot serve", so another daemon may."""
    if isinstance(error, (DaemonTimeout, TimeoutError)):
        return True
    return isinstance(error, DaemonError) and error.code in UNAVAILABLE_CODES


async def open_generation(pool: DaemonPool, make_request: Callable[[DaemonHandle], Generate]) -> GenerationStream:
    """``pool.open_stream`` with daemon failures turned into the HTTP errors to answer.

    Args:
        pool: The daemons.
        make_request: Builds the Generate for the chosen daemon.

    Returns:
        The open stream (its first reply received).

    Raises:
        ApiError: 400 / 429 / 503 / 500 as ``errors.from_daemon_failure`` maps them.
    """
    try:
        return await pool.open_stream(make_request)
    except (NoDaemonAvailable, DaemonError, DaemonTimeout, ProtocolError) as error:
        raise from_daemon_failure(error) from error


async def call_daemon(pool: DaemonPool, operation: Callable[[AsyncClient], Awaitable[Any]]) -> Any:
    """``pool.call`` with daemon failures turned into HTTP errors (see ``open_generation``).

    Args:
        pool: The daemons.
        operation: Takes a daemon's client and returns the awaitable to run.

    Returns:
        What the operation returned.

    Raises:
        ApiError: As for ``open_generation``.
    """
    try:
        return await pool.call(operation)
    except (NoDaemonAvailable, DaemonError, DaemonTimeout, ProtocolError) as error:
        raise from_daemon_failure(error) from error
