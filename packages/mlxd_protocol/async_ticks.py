"""The daemon's tick trace for asyncio: ``AsyncTickSubscription`` (``AsyncClient.subscribe_ticks`` makes one).

Contract: the same SUB socket and frames as the blocking ``client.TickSubscription``
(``client_common.connect_trace``, ``client_common.read_tick``), awaited instead of blocking.
"""

import asyncio

import zmq.asyncio

from .client_common import connect_trace, read_tick
from .messages import Tick


class AsyncTickSubscription:
    """The daemon's tick trace, as ``Tick`` messages, for asyncio (see ``AsyncClient.subscribe_ticks``).

    Args:
        context: A ``zmq.asyncio.Context``.
        endpoint: The daemon's trace endpoint.
        auth_token: The daemon's auth token, when it has one (as ``client.TickSubscription`` takes it).
    """

    def __init__(self, context: zmq.asyncio.Context, endpoint: str, auth_token: str | None = None) -> None:
        self.endpoint = endpoint
        self._socket = connect_trace(context, endpoint, auth_token)

    async def receive(self, timeout_s: float | None = None) -> Tick | None:
        """The next tick, or None when none came within ``timeout_s`` (None: wait on).

        Raises:
            DaemonError: A trace frame the protocol refuses (e.g. a daemon speaking another version).
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while True:
            wait_ms = None if deadline is None else max(0, int((deadline - loop.time()) * 1000))
            if not await self._socket.poll(wait_ms):
                return None
            tick = read_tick(await self._socket.recv_multipart())
            if tick is not None:
                return tick

    def close(self) -> None:
        """Unsubscribe; safe to call twice."""
        if not self._socket.closed:
            self._socket.close()
