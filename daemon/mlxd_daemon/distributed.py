"""mlxd over ``mx.distributed``: rank 0 serves, every other rank mirrors its engine operations.

Contract: with ``mlxd --distributed tensor|pipeline`` started on every rank (``mlx.launch``), each rank
loads its part of the model (``mlxd_engine.loading.sharding``: mlx-lm's ``shard`` / ``pipeline``) and builds the
same ``Engine`` with its own KV storage (for its heads, or its layers). Rank 0 alone owns the socket, the
scheduler and the drafters; its engine is a ``Leader``, which forwards every call to the real engine and
tells the other ranks what to replay. A follower (``follow``) runs no scheduler: it replays the plan.

The plan travels as msgpack bytes broadcast by rank 0 with ``all_sum`` (the followers add zeros), one
broadcast per forward (``prefill``, ``submit_step``, ``verify_rows``, an unwind that forwards recurrent state
again) carrying the operations queued since the last one: admissions, releases, commits, unwinds, step
reads, and the tokens rank 0 recorded for each row since it last said. Every rank then runs the same
forward on its shard; the model's own collectives keep the ranks in step. Sampling happens once, on
rank 0: a step's tokens are shared with one more ``all_sum`` inside the step's graph (so lookahead still
pipelines), prefill and verify tokens reach the followers with the next plan. So every rank holds the
same tokens and the output is rank 0's. Followers sample nothing they keep (their rows are greedy).

A rank that dies breaks the group. MLX raises for the collectives pending at that moment but may wait for
ever on one queued later, so ``group_watch.GroupWatch`` (a thread watching the group's TCP connections)
notices too. Either way the ``Leader`` marks itself lost (every later forward raises ``GroupLost``
without touching the group) and calls ``on_lost`` (the daemon stops, fails every request with the reason
and exits 1); when the main thread is stuck inside MLX, the watch thread answers the clients itself
after ``GRACE_S`` and exits the process (``abort_serving``). A follower whose rank 0 is gone exits 1. An
idle rank 0 sends an empty plan every ``HEARTBEAT_S``. Any failure inside a mirrored forward counts as a
lost group: the ranks may be out of step.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import msgpack
import numpy as np

from .engine_setup import build_engine
from .step_tuning import StepSettings

log = logging.getLogger("mlxd.distributed")

MODES = ("tensor", "pipeline")
BACKENDS = ("any", "ring", "jaccl", "mpi", "nccl")
PLAN_BYTES = 4096  # the first broadcast of a plan; a longer plan sends its remainder in a second one
HEARTBEAT_S = 1.0  # an idle rank 0 checks the group this often
KEEP_HANDLES = 64  # followers forget step handles rank 0 never read after this many newer ones
# engine methods that only read (the scheduler's admission checks); every other method must be mirrored
LOCAL_METHODS = frozenset({"fits", "can_admit", "check_request"})  # read the engine, forward nothing
GRACE_S = 1.5  # a lost group: how long the main thread has to answer the clients before the watch does


class GroupLost(RuntimeError):
    """A rank of the group is gone (or out of step): nothing more can be computed."""


@dataclass(frozen=True)
class GroupInfo:
    mode: str
    backend: str
    size: int
    rank: int

    def summary(self) -> dict:
        return {"ranks": self.size, "mode": self.mode, "backend": self.backend, "rank": self.rank}


def join_group(mode: str, backend: str = "any") -> tuple[Any, GroupInfo]:
    """Join the process group ``mlx.launch`` set up. Raises ValueError with what to do when there is none."""
    if mode not in MODES:
        raise ValueError(f"--distributed {mode!r}: expected {' or '.join(MODES)}")
    try:
        group = mx.distributed.init(strict=True, backend=backend)
    except RuntimeError as error:
        raise ValueError(
            f"--distributed {mode}: cannot join a group over the {backend} backend ({error}); "
            f"start every rank with mlx.launch, e.g. mlx.launch --backend ring --hosts "
            f"127.0.0.1,127.0.0.1 mlxd -m MODEL --distributed {mode}"
        ) from error
    if group.size() < 2:
        raise ValueError(f"--distributed {mode}: the group has one rank; start two or more with mlx.launch")
    return group, GroupInfo(mode, backend, group.size(), group.rank())


def _bytes_array(data: bytes) -> mx.array:
    return mx.array(np.frombuffer(data, dtype=np.uint8))


class PlanChannel:
    """Rank 0's plans to every rank: msgpack bytes summed over the group (the others add zeros)."""

    def __init__(self, group):
        self.group = group
        self.leader = group.rank() == 0
        self._last = None  # rank 0's latest broadcast, kept until the stream has run it

    def send(self, ops: list) -> None:
        # rank 0 only; async: the broadcast runs in stream order, before the forward built after it
        payload = msgpack.packb(ops, use_bin_type=True)
        head = len(payload).to_bytes(4, "little") + payload[: PLAN_BYTES - 4]
        parts = [mx.distributed.all_sum(_bytes_array(head.ljust(PLAN_BYTES, b"\0")), group=self.group)]
        if len(payload) > PLAN_BYTES - 4:
            parts.append(mx.distributed.all_sum(_bytes_array(payload[PLAN_BYTES - 4 :]), group=self.group))
        for part in parts:  # one call each: within one eval MLX may run independent collectives in any order
            mx.async_eval(part)
        self._last = parts

    def receive(self) -> list:
        summed = mx.distributed.all_sum(mx.zeros((PLAN_BYTES,), dtype=mx.uint8), group=self.group)
        # evaluates: waits for rank 0's next plan (MLX arrays export the buffer protocol; their stubs do not say so)
        head = bytes(memoryview(summed))  # type: ignore[arg-type]
        length = int.from_bytes(head[:4], "little")
        payload = head[4 : 4 + length]
        if length > PLAN_BYTES - 4:
            rest = mx.distributed.all_sum(mx.zeros((length - (PLAN_BYTES - 4),), dtype=mx.uint8), group=self.group)
            payload += bytes(memoryview(rest))  # type: ignore[arg-type]
        return msgpack.unpackb(payload, raw=False)

    def share(self, tokens: mx.array) -> mx.array:
        """Rank 0's sampled tokens on every rank (lazy: part of the step's graph)."""
        return mx.distributed.all_sum(tokens if self.leader else mx.zeros_like(tokens), group=self.group)


class Leader:
    """Rank 0's engine: the real ``Engine``, with every operation told to the followers (module docstring).

    Everything that is not an operation (``storage``, ``loaded``, ``fits``, ...) is the engine's own."""

    def __init__(self, engine, group, info: GroupInfo):
        self.engine = engine
        self.channel = PlanChannel(group)
        self.info = info
        self.lost: str | None = None
        self.on_lost: Callable[[str], None] | None = None
        self._queued: list = []
        self._rows: dict[int, Any] = {}  # seq_id -> Sequence, live rows
        self._told: dict[int, int] = {}  # seq_id -> how many of its tokens the followers have been told
        self._handle_ids = itertools.count()
        self._replays_forward = bool(getattr(engine.storage, "recurrent", None))  # row_storage.py
        self._last_sent = time.monotonic()
        self._busy_since: float | None = None  # inside a collective since (for a watch by progress)
        self._watch = None
        self.abort_lock = threading.Lock()  # whoever holds it answers the clients of a lost group
        self.settled = threading.Event()  # the main thread has answered them and closed the daemon

    def __getattr__(self, name):
        value = getattr(self.engine, name)
        if callable(value) and name not in LOCAL_METHODS:
            # a new engine operation might forward or change rows: run unmirrored, the ranks would part
            raise AttributeError(f"Engine.{name} is not mirrored across the ranks of a group (distributed.Leader)")
        return value

    def group_summary(self) -> dict:
        return {**self.info.summary(), "lost": self.lost}

    # -- the plan ---------------------------------------------------------------------------------
    def _token_updates(self) -> list:
        updates = []
        for seq_id, seq in self._rows.items():
            told = self._told[seq_id]
            if len(seq.tokens) != told:
                updates.append(["tokens", seq_id, told, seq.tokens[told:]])
                self._told[seq_id] = len(seq.tokens)
        return updates

    def _broadcast(self, op: list | None) -> None:
        if self.lost is not None:
            raise GroupLost(self.lost)
        plan = self._queued + self._token_updates() + ([op] if op is not None else [])
        self._queued = []
        self._guarded(self.channel.send, plan)
        self._last_sent = time.monotonic()

    def _guarded(self, call, *args, **kwargs):
        if self.lost is not None:
            raise GroupLost(self.lost)
        self._busy_since = time.monotonic()
        try:
            return call(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - any failure mid-forward leaves the ranks out of step
            if self.lost is None:
                self._lose(f"distributed group of {self.info.size} ranks lost: {type(error).__name__}: {error}")
            raise GroupLost(self.lost) from error
        finally:
            self._busy_since = None

    def mark_lost(self, error: BaseException) -> None:
        """A forward's result could not be read (the collective failed while it was evaluated, outside the
        operations this class guards): the ranks are out of step, as for any failure mid-forward."""
        if self.lost is None:
            self._lose(f"distributed group of {self.info.size} ranks lost: {type(error).__name__}: {error}")

    def _lose(self, reason: str) -> None:
        self.lost = reason
        log.error("%s", reason)
        if self.on_lost is not None:
            self.on_lost(reason)

    def watch_group(self, watch, abort: Callable[[str], None]) -> None:
        """Take over ``watch`` (``group_watch.GroupWatch``, running): ``abort(reason)`` answers every client
        and ends the process, for when the main thread stays stuck inside MLX."""
        self._watch = watch
        watch.busy = lambda: self._busy_since
        watch.handler = lambda reason: self._lost_by_watch(reason, abort)

    def _lost_by_watch(self, reason: str, abort: Callable[[str], None]) -> None:
        # the watch thread: the main thread may be waiting inside MLX for a collective that never ends
        if self.lost is None:
            self._lose(f"distributed group of {self.info.size} ranks lost: {reason}")
        if self.settled.wait(GRACE_S):
            return
        if self.abort_lock.acquire(blocking=False):
            abort(self.lost)  # type: ignore[arg-type]  # set above (_lose)
        elif self.settled.wait(GRACE_S):
            return
        os._exit(1)

    def heartbeat(self) -> None:
        """Called while idle: an empty plan now and then finds a lost rank before a request does."""
        if self.lost is None and time.monotonic() - self._last_sent >= HEARTBEAT_S:
            try:
                self._broadcast(None)
                self._guarded(mx.eval, self.channel._last)
            except GroupLost:
                pass

    def close(self) -> None:
        """Tell the followers to exit (a clean shutdown)."""
        if self._watch is not None:
            self._watch.stop()  # the followers now close their connections on purpose
        if self.lost is None:
            try:
                self._broadcast(["stop"])
                self._guarded(mx.eval, self.channel._last)
            except GroupLost:
                pass

    # -- operations that wait for the next plan ---------------------------------------------------
    def add_sequence(self, prompt, params=None, max_new_tokens=None, **options):
        # options (cache_prompt, ...) are plain values the followers' engines take as they are
        seq = self.engine.add_sequence(prompt, params, max_new_tokens, **options)
        self._queued.append(["add", seq.seq_id, list(prompt), max_new_tokens, options])
        self._rows[seq.seq_id] = seq
        self._told[seq.seq_id] = len(prompt)
        return seq

    def release(self, seq, **options) -> None:
        self.engine.release(seq, **options)
        if self._rows.pop(seq.seq_id, None) is not None:
            self._told.pop(seq.seq_id, None)
            self._queued.append(["release", seq.seq_id, options])

    def commit_appends(self, seq, n: int) -> None:
        self.engine.commit_appends(seq, n)
        self._queued.append(["commit", seq.seq_id, n])

    def unwind_pending(self, seq) -> None:
        if seq.kv.pending:
            self.unwind_appends(seq, seq.kv.pending)  # mirrored like any unwind

    def unwind_appends(self, seq, n: int, kept=None) -> None:
        if self._replays_forward:  # recurrent state: the unwind forwards kept tokens again, on every rank
            # ``kept``: the verify round's tokens, not recorded yet, so not among the rows' told tokens
            self._broadcast(["unwind", seq.seq_id, n, list(kept or [])])
            return self._guarded(self.engine.unwind_appends, seq, n, kept)
        self.engine.unwind_appends(seq, n)
        self._queued.append(["unwind", seq.seq_id, n])

    def read_step(self, handle):
        emitted = self._guarded(self.engine.read_step, handle)
        self._queued.append(["read", handle.mirror_id])
        return emitted

    # -- forwards: one broadcast each ---------------------------------------------------------------
    def prefill(self, seq, max_tokens=None):
        self._broadcast(["prefill", seq.seq_id, max_tokens])
        return self._guarded(self.engine.prefill, seq, max_tokens)

    def submit_step(self, rows, lookahead=None):
        handle_id = next(self._handle_ids)
        self._broadcast(["submit", handle_id, [seq.seq_id for seq in rows], getattr(lookahead, "mirror_id", None)])
        handle = self._guarded(self.engine.submit_step, rows, lookahead)
        handle.tokens = self.channel.share(handle.tokens)
        handle.mirror_id = handle_id
        mx.async_eval(handle.tokens)
        return handle

    def step(self, rows):
        return self.read_step(self.submit_step(rows))

    def verify(self, seq, tokens):
        return self.verify_rows([seq], [tokens])[0]

    def verify_rows(self, rows, token_lists):
        self._broadcast(["verify", [seq.seq_id for seq in rows], [list(tokens) for tokens in token_lists]])
        return self._guarded(self.engine.verify_rows, rows, token_lists)


class Follower:
    """A rank other than 0: replays rank 0's plans on its own engine (no sockets, no scheduler)."""

    def __init__(self, engine, group):
        from mlxd_engine import SamplingParams

        self.engine = engine
        self.channel = PlanChannel(group)
        self.greedy = SamplingParams  # followers' rows sample nothing they keep
        self.rows: dict[int, Any] = {}  # rank 0's seq_id -> this rank's Sequence
        self.handles: OrderedDict[int, Any] = OrderedDict()
        self.done = threading.Event()
        self.replay = {
            "add": self._add,
            "release": self._release,
            "commit": self._commit,
            "unwind": self._unwind,
            "tokens": self._tokens,
            "read": self._read,
            "prefill": self._prefill,
            "submit": self._submit,
            "verify": self._verify,
        }

    def run(self, watch=None) -> int:
        """Replay plans until rank 0 says stop (0) or the group breaks (1)."""
        if watch is not None:
            watch.handler = self._lost_by_watch
        try:
            return self._replay_plans()
        finally:
            self.done.set()
            if watch is not None:
                watch.stop()

    def _lost_by_watch(self, reason: str) -> None:
        if self.done.wait(GRACE_S):  # rank 0 said stop and went: not a loss
            return
        log.error("rank %d: distributed group lost: %s; exiting", self.channel.group.rank(), reason)
        logging.shutdown()
        os._exit(1)

    def _replay_plans(self) -> int:
        while True:
            try:
                plan = self.channel.receive()
            except Exception as error:  # noqa: BLE001
                log.error(
                    "rank %d: lost rank 0 (%s: %s); exiting", self.channel.group.rank(), type(error).__name__, error
                )
                return 1
            for op in plan:
                if op[0] == "stop":
                    return 0
                try:
                    self.replay[op[0]](*op[1:])
                except Exception as error:  # noqa: BLE001 - out of step with rank 0: nothing can go on
                    log.error(
                        "rank %d: replaying %s failed (%s: %s); exiting",
                        self.channel.group.rank(),
                        op[0],
                        type(error).__name__,
                        error,
                    )
                    return 1

    def _add(self, seq_id, prompt, max_new_tokens, options):
        self.rows[seq_id] = self.engine.add_sequence(prompt, self.greedy(), max_new_tokens, **options)

    def _release(self, seq_id, options):
        self.engine.release(self.rows.pop(seq_id), **options)

    def _commit(self, seq_id, n):
        self.engine.commit_appends(self.rows[seq_id], n)

    def _unwind(self, seq_id, n, kept=None):
        self.engine.unwind_appends(self.rows[seq_id], n, kept)

    def _tokens(self, seq_id, start, tail):
        self.rows[seq_id].record(tail, start)  # rank 0's tokens: this rank's forwards record none

    def _read(self, handle_id):
        handle = self.handles.pop(handle_id, None)
        if handle is not None:
            self.engine.read_step(handle)

    def _prefill(self, seq_id, max_tokens):
        self.engine.prefill(self.rows[seq_id], max_tokens)

    def _submit(self, handle_id, seq_ids, lookahead_id):
        lookahead = self.handles.get(lookahead_id) if lookahead_id is not None else None
        handle = self.engine.submit_step([self.rows[i] for i in seq_ids], lookahead)
        handle.tokens = self.channel.share(handle.tokens)
        mx.async_eval(handle.tokens)
        self.handles[handle_id] = handle
        while len(self.handles) > KEEP_HANDLES:
            self.handles.popitem(last=False)

    def _verify(self, seq_ids, token_lists):
        mx.eval(self.engine.verify_rows([self.rows[i] for i in seq_ids], token_lists))


def fixed_step_settings():
    """Step settings without timing (timings could differ between ranks, which must run the same
    forwards): ``MLXD_BLAS_THREADS`` where given, never compiled steps."""
    from mlxd_fast_blas import explicit_blas_threads, set_blas_threads

    threads = explicit_blas_threads()
    if threads is not None and set_blas_threads(threads):
        return StepSettings(threads, f"{threads} (set by the environment)", "off (distributed)")
    return StepSettings(None, "library default (not timed in a distributed group)", "off (distributed)")


def abort_serving(server, reason: str) -> None:
    """From the watch thread, with rank 0's main thread stuck inside MLX: fail every request with
    ``reason``, give ZeroMQ a moment to send the errors, remove the pid file and sockets, exit 1."""
    from mlxd_protocol.endpoints import socket_path, trace_endpoint

    log.error(
        "the main thread is waiting for the lost rank inside MLX: failing %d requests and exiting",
        len(server.scheduler.by_id),
    )
    server.scheduler.fail_all(reason)
    time.sleep(0.3)
    for path in (
        getattr(server, "pid_path", None),
        socket_path(server.endpoint),
        socket_path(trace_endpoint(server.endpoint)),
    ):
        if path is not None and path.exists():
            path.unlink()
    print(f"mlxd: {reason}", file=__import__("sys").stderr, flush=True)
    os._exit(1)


def serve_follower(loaded, options, watch=None) -> int:
    """A rank other than 0: build the same engine as rank 0 and replay its plans until it stops."""
    engine = build_engine(loaded, options)
    group = loaded.group
    steps = fixed_step_settings()
    log.info(
        "rank %d of %d following rank 0: model=%s blas_threads=%s",
        group.rank(),
        group.size(),
        loaded.path,
        steps.blas_detail,
    )
    code = Follower(engine, group).run(watch)
    log.info("rank %d stopped (%s)", group.rank(), "rank 0 stopped" if code == 0 else "group lost")
    return code
