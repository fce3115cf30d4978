"""The daemon's socket loop: ROUTER for requests, XPUB for the tick trace, the daemon's core in between.

Contract: one thread does everything (sockets, scheduler, MLX), so nothing needs a lock. Each turn of
the loop reads as four steps: receive (drain every waiting frame, decode it, check auth, hand it to the
core), pick up trace subscriptions, let the core take its turn (one scheduler tick, due chunks), and
publish the tick to subscribers as a typed ``Tick``. While the core has work the loop never blocks on the
sockets; idle, it waits up to 100 ms, or until host work finishes (the core's ``host.wake_fd`` is polled
beside the sockets). A frame over ``DECODE_OFF_LOOP_BYTES`` is decoded on a host-work thread.

What the requests do is the core's (``core.DaemonCore``: the handlers, the scheduler, the reply streams);
this module adds only what needs a socket: framing, connection identities and their authentication,
the trace publisher, the pid file and signals. A malformed frame, an unknown type or a wrong version is
answered with an Error, and so is a reply that cannot be encoded (one past the protocol's limits: the
request gets an invalid_request Error in its place); nothing a client sends can stop the loop: every
request's failure is caught where the request is handled, and a failed scheduler tick fails the
requests in it, not the daemon.
"""

from __future__ import annotations

import hmac
import logging
import os
import signal
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

import zmq

from mlxd_engine import LoadedModel
from mlxd_protocol import (
    BAD_FRAME,
    INTERNAL,
    INVALID,
    MAX_FRAME_BYTES,
    TICK_TOPIC,
    UNAUTHORIZED,
    Error,
    Hello,
    Message,
    ProtocolError,
    decode,
    encode,
    error_reply,
)
from mlxd_protocol.endpoints import (
    TRACE_USER,
    check_bind_address,
    ensure_private_dir,
    pid_file,
    socket_path,
    trace_endpoint,
)
from mlxd_scheduler import TickRecord

from .core import DaemonCore
from .edge import tick_message
from .options import DaemonOptions

if TYPE_CHECKING:
    from zmq.auth.thread import ThreadAuthenticator

MAX_FRAMES_PER_TURN = 256
DECODE_OFF_LOOP_BYTES = 256 * 1024  # larger frames are decoded on a host-work thread
MAX_AUTHENTICATED = 10_000  # connections remembered as authenticated (least recently used dropped)


class DaemonServer:
    def __init__(self, loaded: LoadedModel, options: DaemonOptions, endpoint: str):
        self.loaded = loaded
        self.options = options
        self.endpoint = endpoint
        self.log = logging.getLogger("mlxd")
        self.core = DaemonCore(loaded, options, self.send, trace_sink=self._publish_tick, endpoint=endpoint)
        self.core.host_wait_s = 0.0  # the loop polls the host work's wake-up descriptor itself
        self._drain_deadline: float | None = None  # set by SIGTERM: finish in-flight work until then
        self._drain_reason = ""
        self._subscribers = 0
        self._authenticated: OrderedDict[bytes, None] = OrderedDict()  # identities that sent the token
        self.context: zmq.Context = zmq.Context.instance()
        self.router = self.context.socket(zmq.ROUTER)
        self.trace = self.context.socket(zmq.XPUB)
        self._authenticator: ThreadAuthenticator | None = None  # the trace socket's login check, with an auth token

    # the core's parts, for start-up logging and status
    @property
    def engine(self):
        return self.core.engine

    @property
    def scheduler(self):
        return self.core.scheduler

    @property
    def speculative(self):
        return self.core.speculative

    # -- lifecycle ----------------------------------------------------------------------------
    def bind(self) -> None:
        check_bind_address(self.endpoint, self.options.allow_public)
        ensure_private_dir(self.endpoint)
        path = socket_path(self.endpoint)
        if path is not None and path.exists():
            path.unlink()  # the caller checked that no daemon answers there
        for sock in (self.router, self.trace):
            sock.setsockopt(zmq.LINGER, 0)
        self.router.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 0)
        self.router.bind(self.endpoint)
        self.trace.setsockopt(zmq.XPUB_VERBOSE, 1)
        if self.options.auth_token:
            self._require_trace_login(self.options.auth_token)
        self.trace.bind(trace_endpoint(self.endpoint))
        if path is not None:
            os.chmod(path, 0o600)
            trace_path = socket_path(trace_endpoint(self.endpoint))
            if trace_path is not None:
                os.chmod(trace_path, 0o600)
        self.pid_path = pid_file(self.endpoint)
        self.pid_path.write_text(f"{os.getpid()}\n")

    def _require_trace_login(self, token: str) -> None:
        """The trace socket takes only subscribers that log in with the auth token (ZeroMQ PLAIN; the
        authenticator is pyzmq's ZAP handler thread)."""
        from zmq.auth.thread import ThreadAuthenticator

        self._authenticator = ThreadAuthenticator(self.context, log=logging.getLogger("mlxd.zap"))
        self._authenticator.start()
        self._authenticator.configure_plain(domain="*", passwords={TRACE_USER: token})
        self.trace.plain_server = True

    def request_stop(self, reason: str) -> None:
        self.core.request_stop(reason)

    def request_drain(self, reason: str) -> None:
        """Stop taking new generations; stop once the running ones finish or the grace period ends.
        A second signal stops at once."""
        if self._drain_deadline is not None:
            self.request_stop(reason)
            return
        self.log.info(
            "%s: draining %d requests for up to %.0fs", reason, len(self.scheduler.by_id), self.options.drain_timeout_s
        )
        self._drain_deadline = time.monotonic() + self.options.drain_timeout_s
        self._drain_reason = reason
        self.core.draining = True

    @property
    def draining(self) -> bool:
        return self._drain_deadline is not None

    def install_signal_handlers(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda number, frame: self.request_drain(signal.Signals(number).name))

    def close(self) -> None:
        self.core.close()  # clients get their Done
        self.router.close()
        self.trace.close()
        if self._authenticator is not None:
            self._authenticator.stop()
        for path in (
            getattr(self, "pid_path", None),
            socket_path(self.endpoint),
            socket_path(trace_endpoint(self.endpoint)),
        ):
            if path is not None and path.exists():
                path.unlink()

    def options_summary(self) -> dict:
        return self.core.options_summary()

    # -- the loop -----------------------------------------------------------------------------
    def serve_forever(self) -> str:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self.trace, zmq.POLLIN)
        poller.register(self.core.host.wake_fd, zmq.POLLIN)
        core = self.core
        while core.stop_reason is None:
            ready = dict(poller.poll(0 if core.busy else 100))
            if self.router in ready:
                self._receive()
            if self.trace in ready:
                self._track_subscriptions()
            self._turn()
            if self._drain_deadline is not None and (
                not self.scheduler.by_id or time.monotonic() > self._drain_deadline
            ):
                core.request_stop(self._drain_reason)
        return core.stop_reason

    def _receive(self) -> None:
        for _ in range(MAX_FRAMES_PER_TURN):
            try:
                frames = self.router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 2:
                self.log.debug("dropping a message of %d frames", len(frames))
                if frames:
                    self.send(frames[0], error_reply(BAD_FRAME, "send exactly one msgpack frame per message"))
                continue
            identity, frame = frames
            self._handle(identity, frame)

    def _turn(self) -> None:
        """The core's turn; a failure there (a bug) fails the requests in flight, never the loop."""
        try:
            self.core.turn()
        except Exception:  # noqa: BLE001 - the daemon keeps serving the requests that come next
            self.log.exception("a scheduler turn failed; failing the requests in flight")
            self.scheduler.fail_all("generation failed inside the daemon (its log has the details)")

    def _handle(self, identity: bytes, frame: bytes) -> None:
        if len(frame) > DECODE_OFF_LOOP_BYTES:
            self.core.offload(
                identity, None, lambda: decode(frame), lambda decoded: self._answer(identity, decoded.result())
            )
            return
        try:
            message = decode(frame)
        except ProtocolError as error:
            self.send(identity, error.to_reply())
            return
        self._answer(identity, message)

    def _answer(self, identity: bytes, message: Message) -> None:
        """Check a decoded request's authentication, hand it to the core and send the reply it has now."""
        try:
            self._check_auth(identity, message)
        except ProtocolError as error:
            self.send(identity, error.to_reply(getattr(message, "id", None)))
            return
        reply = self.core.handle(identity, message)  # catches every failure of its own
        if reply is not None:
            self.send(identity, reply)

    def _check_auth(self, identity: bytes, message: Message) -> None:
        """With an auth token, a connection's requests need a prior Hello carrying it."""
        token = self.options.auth_token
        if not token:
            return
        if isinstance(message, Hello):
            given = message.token if isinstance(message.token, str) else ""
            if hmac.compare_digest(given.encode(), token.encode()):
                self._authenticated[identity] = None
                self._authenticated.move_to_end(identity)
                while len(self._authenticated) > MAX_AUTHENTICATED:
                    self._authenticated.popitem(last=False)
                return
            self._authenticated.pop(identity, None)
            self.log.warning("hello with a wrong auth token from connection %s", identity.hex())
            raise ProtocolError(UNAUTHORIZED, "wrong auth token")
        if identity in self._authenticated:
            self._authenticated.move_to_end(identity)
            return
        raise ProtocolError(UNAUTHORIZED, "this daemon requires authentication: send a hello with its token first")

    def send(self, identity: bytes, message: Message) -> None:
        """Send one reply; one that cannot be encoded is replaced by an Error for its request."""
        try:
            frame = encode(message)
        except ProtocolError as error:  # past the protocol's limits: the request fails, not the daemon
            request_id = getattr(message, "id", None)
            self.log.warning("reply %s to request %r cannot be sent: %s", message.TYPE, request_id, error.message)
            if isinstance(message, Error):
                message = Error(
                    id=request_id if isinstance(request_id, str) and request_id else None,
                    code=INTERNAL,
                    message="the reply could not be encoded",
                )
            else:
                message = Error(
                    id=request_id,
                    code=INVALID,
                    message=f"the reply is larger than the protocol carries ({error.message})",
                )
            try:
                frame = encode(message)
            except ProtocolError:
                frame = encode(Error(id=None, code=INTERNAL, message="the reply could not be encoded"))
        try:
            self.router.send_multipart([identity, frame], zmq.NOBLOCK)
        except zmq.ZMQError as error:  # the peer is gone or its queue is full: drop, never block
            self.log.debug("could not send %s: %s", message.TYPE, error)

    # -- tick trace ----------------------------------------------------------------------------
    def _track_subscriptions(self) -> None:
        while True:
            try:
                event = self.trace.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if event[:1] == b"\x01":
                self._subscribers += 1
            elif event[:1] == b"\x00":
                self._subscribers = max(0, self._subscribers - 1)

    def _publish_tick(self, record: TickRecord) -> None:
        if self._subscribers == 0:
            return  # nobody watches: not even the Tick is built
        try:
            self.trace.send_multipart([TICK_TOPIC, encode(tick_message(record))], zmq.NOBLOCK)
        except ProtocolError as error:  # a trace the protocol cannot carry is a bug here, never a reason to stop
            self.log.warning("tick %d not published: %s", record.tick, error)
        except zmq.ZMQError:
            pass
