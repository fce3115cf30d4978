"""The daemon's socket loop: ROUTER for requests, XPUB for the tick trace, the scheduler in between.

Contract: one thread does everything (sockets, scheduler, MLX), so nothing needs a lock. Each turn of
the loop reads as four steps: receive (drain every waiting frame and run its handler), pick up trace
subscriptions, run one scheduler tick when there is work, and publish the tick to subscribers. While the
scheduler has work the loop never blocks on the sockets; idle, it waits up to 100 ms.

A malformed frame, an unknown type or a wrong version is answered with an Error; a handler that fails
unexpectedly is answered with an internal Error. Nothing a client sends can stop the loop.
"""

from __future__ import annotations

import hmac
import logging
import os
import signal
import time
from collections import OrderedDict

import msgpack
import zmq

from mlxd_engine import Engine, LoadedModel
from mlxd_protocol import (
    INTERNAL, MAX_FRAME_BYTES, Hello, Message, ProtocolError, decode, encode, error_reply)
from mlxd_protocol.messages import UNAUTHORIZED
from mlxd_protocol.endpoints import check_bind_address, ensure_private_dir, pid_file, socket_path, trace_endpoint
from mlxd_scheduler import BatchScheduler, SchedulerOptions, TickRecord

from .chunking import ChunkBuffer
from .handlers import HANDLERS
from .options import DaemonOptions
from .speculative import resolve_speculative

MAX_FRAMES_PER_TURN = 256
MAX_AUTHENTICATED = 10_000  # connections remembered as authenticated (least recently used dropped)


def pool_tokens(loaded: LoadedModel, options: DaemonOptions) -> int | None:
    """Paged pool size in tokens: --kv-pool-tokens, else --kv-memory-fraction of this machine's memory."""
    if options.kv_pool_tokens:
        return options.kv_pool_tokens
    if options.kv_memory_fraction:
        import psutil

        from mlxd_engine.engine import kv_bytes_per_token

        return int(psutil.virtual_memory().total * options.kv_memory_fraction) // kv_bytes_per_token(loaded)
    return None


class DaemonServer:
    def __init__(self, loaded: LoadedModel, options: DaemonOptions, endpoint: str):
        self.loaded = loaded
        self.options = options
        self.endpoint = endpoint
        self.log = logging.getLogger("mlxd")
        self.engine = Engine(loaded, max_sequences=options.max_batch, max_kv_size=options.max_kv_size,
                             storage=options.storage_backend, kv_block_size=options.kv_block_size,
                             kv_pool_tokens=pool_tokens(loaded, options))
        self.speculative = resolve_speculative(options.draft_kind, options.draft_model, options.draft_block_size)
        scheduler_options = SchedulerOptions(max_batch=options.max_batch, prefill_chunk=options.prefill_chunk,
                                             lookahead=options.lookahead, max_decode_steps=options.decode_steps,
                                             max_queue=options.max_queue,
                                             prompt_lookup=self.speculative.config,
                                             prompt_lookup_cap=self.speculative.cap)
        if options.prompt_lookup_max_batch is not None:
            scheduler_options.prompt_lookup_max_batch = options.prompt_lookup_max_batch
        self.scheduler = BatchScheduler(self.engine, scheduler_options, trace_sink=self._publish_tick)
        self.routes: dict[str, str] = {}  # internal request id -> client's id
        # internal request id -> (identity, ChunkBuffer) for buffers keeping tokens (and only those)
        self.chunks_waiting: dict[str, tuple[bytes, ChunkBuffer]] = {}
        self.started = time.monotonic()
        self._stop_reason: str | None = None
        self._drain_deadline: float | None = None  # set by SIGTERM: finish in-flight work until then
        self._subscribers = 0
        self._authenticated: OrderedDict[bytes, None] = OrderedDict()  # identities that sent the token
        self.context = zmq.Context.instance()
        self.router = self.context.socket(zmq.ROUTER)
        self.trace = self.context.socket(zmq.XPUB)

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
        self.trace.bind(trace_endpoint(self.endpoint))
        if path is not None:
            os.chmod(path, 0o600)
            trace_path = socket_path(trace_endpoint(self.endpoint))
            if trace_path is not None:
                os.chmod(trace_path, 0o600)
        self.pid_path = pid_file(self.endpoint)
        self.pid_path.write_text(f"{os.getpid()}\n")

    def request_stop(self, reason: str) -> None:
        self._stop_reason = reason

    def request_drain(self, reason: str) -> None:
        """Stop taking new generations; stop once the running ones finish or the grace period ends.
        A second signal stops at once."""
        if self._drain_deadline is not None:
            self.request_stop(reason)
            return
        self.log.info("%s: draining %d requests for up to %.0fs", reason, len(self.scheduler.by_id),
                      self.options.drain_timeout_s)
        self._drain_deadline = time.monotonic() + self.options.drain_timeout_s
        self._drain_reason = reason

    @property
    def draining(self) -> bool:
        return self._drain_deadline is not None

    def install_signal_handlers(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda number, frame: self.request_drain(signal.Signals(number).name))

    def close(self) -> None:
        for internal_id in list(self.scheduler.by_id):
            self.scheduler.cancel(internal_id)
        if self.scheduler.by_id:
            self.scheduler.tick()  # settles the cancellations: clients get their Done
        self.router.close()
        self.trace.close()
        for path in (getattr(self, "pid_path", None), socket_path(self.endpoint), socket_path(trace_endpoint(self.endpoint))):
            if path is not None and path.exists():
                path.unlink()

    def options_summary(self) -> dict:
        summary = self.options.as_dict()
        summary["endpoint"] = self.endpoint
        summary["max_kv_size"] = self.engine.max_kv_size
        summary["fused_cpu_layers"] = self.engine.fused_layers
        summary["speculative"] = self.speculative.summary()
        summary["prompt_lookup_max_batch"] = self.scheduler.options.prompt_lookup_max_batch
        return summary

    # -- the loop -----------------------------------------------------------------------------
    def serve_forever(self) -> str:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self.trace, zmq.POLLIN)
        while self._stop_reason is None:
            busy = self.scheduler.has_work
            ready = dict(poller.poll(0 if busy else 100))
            if self.router in ready:
                self._receive()
            if self.trace in ready:
                self._track_subscriptions()
            if self.scheduler.has_work:
                self.scheduler.tick()
            if self.chunks_waiting:
                self._send_due_chunks()
            if self._drain_deadline is not None and (not self.scheduler.by_id or time.monotonic() > self._drain_deadline):
                self._stop_reason = self._drain_reason
        return self._stop_reason

    def _receive(self) -> None:
        for _ in range(MAX_FRAMES_PER_TURN):
            try:
                frames = self.router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 2:
                self.log.debug("dropping a message of %d frames", len(frames))
                if frames:
                    self.send(frames[0], error_reply("bad_frame", "send exactly one msgpack frame per message"))
                continue
            identity, frame = frames
            self._handle(identity, frame)

    def _handle(self, identity: bytes, frame: bytes) -> None:
        request_id = None
        try:
            message = decode(frame)
            request_id = getattr(message, "id", None)
            handler = HANDLERS.get(type(message))
            if handler is None:
                raise ProtocolError("unknown_type", f"{message.TYPE!r} is a reply, not a request")
            self._check_auth(identity, message)
            reply = handler(self, identity, message)
        except ProtocolError as error:
            reply = error.to_reply(request_id)
        except Exception as error:  # noqa: BLE001 - no request may take the daemon down
            self.log.exception("handler failed")
            reply = error_reply(INTERNAL, f"{type(error).__name__}: {error}", request_id)
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
        try:
            self.router.send_multipart([identity, encode(message)], zmq.NOBLOCK)
        except zmq.ZMQError as error:  # the peer is gone or its queue is full: drop, never block
            self.log.debug("could not send %s: %s", message.TYPE, error)

    def send_kept_chunk(self, internal_id: str) -> None:
        """Send the tokens a request's ChunkBuffer is keeping (it leaves ``chunks_waiting``)."""
        identity, chunks = self.chunks_waiting.pop(internal_id)
        self.send(identity, chunks.take(time.monotonic()))

    def _send_due_chunks(self) -> None:
        now = time.monotonic()
        for internal_id, (_, chunks) in list(self.chunks_waiting.items()):
            if chunks.due(now):
                self.send_kept_chunk(internal_id)

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
            return
        try:
            self.trace.send_multipart([b"tick", msgpack.packb(record.as_dict(), use_bin_type=True)], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
