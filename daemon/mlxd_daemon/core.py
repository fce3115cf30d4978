"""The daemon without its sockets: the scheduler as mlxd builds it, the handler table and the reply streams.

Contract: ``DaemonCore(loaded, options, send)`` builds the engine, the speculative dispatch and the
scheduler from ``DaemonOptions`` exactly as ``mlxd`` serves them (``build_scheduler``), and answers decoded
requests. ``handle(identity, message)`` returns the reply to send now, an Error for bad input or a failed
handler, or None (replies come later through ``send``, as for Generate, or never, as for Cancel);
``turn()`` picks up finished host work, runs one scheduler tick when there is work, one forward of a queued
Embed (``embeddings.EmbeddingQueue``) and sends the streamed chunks that are due; ``has_work`` says whether a
turn would do anything (``busy``: anything but waiting for host work). Host work that is not small (templates,
tokenizing, grammars: ``host_limits``) runs on the worker threads of ``host_work.HostWork`` (``offload``); its results
are handled inside ``turn()``, so the loop thread still owns all state and nothing needs a lock. Every failure of one
request, in its handler, its host work or its finish, becomes that request's Error reply (``failure_reply``): an
exception's name and text go to the log, never to the client.

Two drivers, one core, so they cannot drift: the socket loop (``server.DaemonServer``: decoding, auth,
ROUTER and trace sockets) and the in-process ``mlxd_protocol.LocalClient`` (``local.local_client``, behind
``mlx-generate --local``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from mlxd_drafters import SharedStoreConfig
from mlxd_engine import Engine, LoadedModel
from mlxd_protocol import (
    FINISH_CANCELLED,
    INTERNAL,
    INVALID,
    UNKNOWN_TYPE,
    Done,
    Error,
    Message,
    ProtocolError,
    error_reply,
)
from mlxd_scheduler import BatchScheduler, SchedulerOptions, TickRecord

from .distributed import GroupInfo, Leader
from .embeddings import EmbeddingQueue
from .engine_setup import build_engine
from .handlers import HANDLERS, HandlerContext
from .host_work import HostWork
from .options import DaemonOptions
from .speculative import SpeculativeDispatch, resolve_speculative
from .streams import ReplyStreams, Send

log = logging.getLogger("mlxd")


def build_scheduler(
    loaded: LoadedModel,
    options: DaemonOptions,
    trace_sink: Callable[[TickRecord], None] | None = None,
) -> tuple[Engine, SpeculativeDispatch, BatchScheduler]:
    """The engine, speculative dispatch and scheduler for ``options`` (the only place they are built).

    Raises:
        ValueError: the speculative options do not go together (see ``resolve_speculative``), or the
            storage backend is unknown.
    """
    engine = build_engine(loaded, options)
    if loaded.group is not None:  # rank 0 of a group: every operation is mirrored to the other ranks
        group = loaded.group
        # a Leader stands in for the Engine (what it does not mirror to the followers it forwards); a group
        # exists only with --distributed, so options.distributed is set
        info = GroupInfo(
            options.distributed,  # type: ignore[arg-type]
            options.distributed_backend,
            group.size(),
            group.rank(),
        )
        engine = Leader(engine, group, info)  # type: ignore[assignment]
    speculative = resolve_speculative(options.draft_kind, options.draft_model, options.draft_block_size)
    scheduler_options = SchedulerOptions(
        max_batch=options.max_batch,
        prefill_chunk=options.prefill_chunk,
        lookahead=options.lookahead,
        max_decode_steps=options.decode_steps,
        max_queue=options.max_queue,
        prompt_lookup=speculative.config,
        prompt_lookup_cap=speculative.cap,
        shared_drafts=SharedStoreConfig(
            max_tokens=options.shared_draft_tokens, include_prompts=options.shared_draft_prompts
        )
        if options.shared_drafts
        else None,
        context_shift=options.context_shift,
    )
    if options.prompt_lookup_max_batch is not None:
        scheduler_options.prompt_lookup_max_batch = options.prompt_lookup_max_batch
    return engine, speculative, BatchScheduler(engine, scheduler_options, trace_sink=trace_sink)


def failure_reply(error: BaseException, what: str, request_id: str | None) -> Error:
    """The Error reply for a request that failed with ``error`` (logged here when it is not the client's)."""
    if isinstance(error, ProtocolError):
        return error.to_reply(request_id)
    if isinstance(error, (KeyboardInterrupt, SystemExit)):
        raise error
    if isinstance(error, RecursionError):
        return error_reply(INVALID, "the request is nested too deeply to process", request_id)
    if isinstance(error, MemoryError):
        return error_reply(INVALID, "the request needs more memory than the daemon has", request_id)
    log.error("%s failed", what, exc_info=error)
    return error_reply(INTERNAL, f"{what} failed inside the daemon (its log has the details)", request_id)


class DaemonCore:
    """See the module docstring.

    Args:
        loaded: The model, loaded by ``model_setup.load_for_serving``.
        options: The daemon's options.
        send: Where replies that come later go: ``send(identity, message)``.
        trace_sink: Gets every tick's ``TickRecord`` (the socket loop publishes it).
        endpoint: Reported in the options summary.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        options: DaemonOptions,
        send: Send,
        trace_sink: Callable[[TickRecord], None] | None = None,
        endpoint: str | None = None,
    ):
        self.loaded = loaded
        self.options = options
        self.endpoint = endpoint
        self.engine, self.speculative, self.scheduler = build_scheduler(loaded, options, trace_sink)
        self.streams = ReplyStreams(send, options.stream_interval_s, self.scheduler.by_id.get)
        self.started = time.monotonic()
        self.stop_reason: str | None = None  # set by a Shutdown message (or the server)
        self.draining = False  # no new generations (the server sets it on SIGTERM)
        self.send = send
        self.host = HostWork(options.host_workers)
        self.embeddings = EmbeddingQueue(
            loaded,
            self.engine.max_kv_size,
            options.pooling,
            options.prefill_chunk,
            send,
            failure_reply,
            max_queue=options.max_queue,
        )
        # how long a turn with nothing but host work in flight waits for it (the socket loop sets 0: it
        # polls ``host.wake_fd`` itself)
        self.host_wait_s = 0.05
        self.context = HandlerContext(
            loaded=loaded,
            scheduler=self.scheduler,
            streams=self.streams,
            sampling=options.sampling,
            started=self.started,
            options_summary=self.options_summary,
            kv_usage=self.kv_usage,
            request_stop=self.request_stop,
            is_draining=lambda: self.draining,
            limits=options.limits,
            grammar_limits=options.limits.grammar(),
            offload=self.offload,
            embeddings=self.embeddings,
            reasoning=options.reasoning,
        )

    def kv_usage(self) -> dict:
        """The KV storage's occupancy, and the prefix cache's entries, bytes, hits and tokens saved."""
        usage = dict(self.engine.storage.usage())
        if self.engine.prefix_cache is not None:
            usage["prefix_cache"] = self.engine.prefix_cache.stats()
        return usage

    @property
    def busy(self) -> bool:
        """The scheduler has work, a stream keeps tokens or embeddings are queued: the loop must not sleep."""
        return self.scheduler.has_work or self.streams.keeping or self.embeddings.pending > 0

    @property
    def has_work(self) -> bool:
        return self.busy or self.host.pending > 0

    def request_stop(self, reason: str) -> None:
        self.stop_reason = reason

    def handle(self, identity: bytes, message: Message) -> Message | None:
        """Run the handler for a decoded request; see the module docstring."""
        request_id = getattr(message, "id", None)
        handler = HANDLERS.get(type(message))
        try:
            if handler is None:
                raise ProtocolError(UNKNOWN_TYPE, f"{message.TYPE!r} is not a request")
            return handler(self.context, identity, message)
        except BaseException as error:  # noqa: BLE001 - no request may take the daemon down
            return failure_reply(error, message.TYPE, request_id)

    def offload(self, identity: bytes, request_id: str | None, work: Callable, finish: Callable) -> None:
        """Run ``work`` on a host-work thread; ``finish(future)`` later, on the loop thread, gives the reply
        (or None); a failure of either is the request's Error."""

        def answer(done) -> None:
            try:
                reply = finish(done)
            except BaseException as error:  # noqa: BLE001 - a native panic too: it fails this request only
                reply = failure_reply(error, "host work", request_id)
            if reply is not None:
                self.send(identity, reply)

        self.host.submit(work, answer)

    def turn(self) -> None:
        """Finished host work, one scheduler tick (when there is work), one embedding forward (when one is
        queued), then the streamed chunks that are due."""
        self.host.collect()
        if self.scheduler.has_work:
            self.scheduler.tick()
            self.streams.send_progress()
        else:
            self.engine.heartbeat()  # a distributed rank 0 checks its group while idle
        if self.embeddings.pending:
            self.embeddings.advance()
        if self.streams.keeping:
            self.streams.send_due(time.monotonic())
        if not self.busy and self.host.pending and self.host_wait_s > 0:
            self.host.wait(self.host_wait_s)
            self.host.collect()

    def close(self) -> None:
        """Cancel every request still running; their clients get a cancelled Done (also those whose host
        work is still running)."""
        for running in list(self.scheduler.by_id):
            self.scheduler.cancel(running)
        if self.scheduler.by_id:
            self.scheduler.tick()  # settles the cancellations
        for preparing in list(self.context.preparing.values()):
            self.send(preparing.identity, Done(id=preparing.client_id, finish_reason=FINISH_CANCELLED))
        self.context.preparing.clear()
        self.embeddings.cancel_all()
        self.host.close()

    def options_summary(self) -> dict:
        summary = self.options.as_dict()
        summary["endpoint"] = self.endpoint
        summary["max_kv_size"] = self.engine.max_kv_size
        summary["context_length"] = self.loaded.context_length  # the model's own (llama-server's n_ctx_train)
        summary["eos_token_ids"] = sorted(self.loaded.eos_token_ids)
        summary["fused_cpu_layers"] = self.engine.fused_layers
        summary["speculative"] = self.speculative.summary()
        summary["prompt_lookup_max_batch"] = self.scheduler.options.prompt_lookup_max_batch
        if self.loaded.group is not None:
            summary["group"] = self.engine.group_summary()  # type: ignore[attr-defined]  # the Leader's
        return summary
