"""A plain ZeroMQ socket served by an asyncio loop's own readiness callback.

Contract:
    * ``LoopSocket(socket, on_frame, on_failure)``: once ``start()``ed in a running loop, every frame the
      socket receives is handed to ``on_frame`` (``recv_multipart`` parts when ``multipart``), in order, from
      the loop's reader callback: no task, no future, no poller per message. A handler that raises is logged,
      and the frames after it are still handed over (the descriptor would not signal them again).
    * ``await send(frame)`` never blocks the loop: a send the socket refuses for now (its high-water mark)
      waits until the socket reports it writable.
    * A receive failing with anything but EAGAIN (the socket was closed under it) calls ``on_failure`` once,
      and reading stops; ``stop()`` removes the reader (before the socket is closed).

ZeroMQ's file descriptor is edge-triggered: it signals that the socket's state changed, not that a message
waits, and any send or receive may take the signal for messages already queued. So each wake reads until
EAGAIN, and each send schedules one more read. zmq.asyncio's sockets do the same, but build a future, and a
poller a wait, for every message: most of the gateway's CPU a streamed token (code_notes.md#stream-chunks).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import zmq

# Plain ints: pyzmq's constants are enum flags, and ``int & flag`` builds a new flag object each time.
EVENTS, POLLIN, POLLOUT, NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.POLLOUT), int(zmq.NOBLOCK)

log = logging.getLogger(__name__)


class LoopSocket:
    """See the module docstring."""

    def __init__(
        self,
        socket: zmq.Socket,
        on_frame: Callable,
        on_failure: Callable[[zmq.ZMQError], None],
        multipart: bool = False,
    ) -> None:
        self.socket = socket
        self._on_frame = on_frame
        self._on_failure = on_failure
        self._multipart = multipart
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fd: int | None = None
        self._writers: list[asyncio.Future] = []

    def start(self) -> None:
        """Read from the running loop (once; later calls do nothing)."""
        if self._loop is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._fd = int(self.socket.getsockopt(zmq.FD))
        self._loop.add_reader(self._fd, self.drain)
        self._loop.call_soon(self.drain)  # frames that came before the reader was added

    def stop(self) -> None:
        """Stop reading (call before closing the socket); wakes senders waiting for room."""
        if self._loop is not None and self._fd is not None:
            self._loop.remove_reader(self._fd)
            self._fd = None
        self._wake_writers()

    def drain(self) -> None:
        """Hand every frame waiting now to ``on_frame``; wake senders once there is room."""
        if self._fd is None:
            return
        receive = self.socket.recv_multipart if self._multipart else self.socket.recv
        try:
            # Asking for EVENTS also re-arms the descriptor; cheaper than a receive failing with EAGAIN.
            while (events := int(self.socket.getsockopt(EVENTS))) & POLLIN:
                frame = receive(NOBLOCK)
                try:
                    self._on_frame(frame)
                except Exception:  # noqa: BLE001 - one handler's failure must not leave later frames unread
                    log.exception("handling a frame from %s failed", self.socket)
                if self._fd is None:  # on_frame stopped this reader
                    return
        except zmq.ZMQError as error:
            self.stop()
            self._on_failure(error)
            return
        if self._writers and events & POLLOUT:
            self._wake_writers()

    def try_send(self, frame: bytes) -> bool:
        """Send one frame now if the socket has room.

        Returns:
            False when it has none (nothing was sent).

        Raises:
            zmq.ZMQError: The socket failed or was closed.
        """
        try:
            self.socket.send(frame, NOBLOCK)
        except zmq.Again:
            return False
        if self._loop is not None:
            self._loop.call_soon(self.drain)  # the send may have taken the signal for queued frames
        return True

    async def send(self, frame: bytes) -> None:
        """Send one frame, waiting (without blocking the loop) while the socket has no room.

        Raises:
            zmq.ZMQError: The socket failed or was closed.
        """
        self.start()
        while not self.try_send(frame):
            room: asyncio.Future = asyncio.get_running_loop().create_future()
            self._writers.append(room)
            await room
            if self._fd is None:
                raise zmq.ZMQError(zmq.ENOTSOCK, "the socket was closed while a send waited")

    def _wake_writers(self) -> None:
        writers, self._writers = self._writers, []
        for room in writers:
            if not room.done():
                room.set_result(None)
