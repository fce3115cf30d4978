"""BatchScheduler: continuous batching over the engine, one tick at a time.

Contract: no sockets and no threads. Callers ``submit`` requests (already tokenized) with an event sink,
``cancel`` them by id, and call ``tick()`` while ``has_work``; each tick reads as four steps:

1. settle cancellations (rows leave at the tick boundary; their slots are freed),
2. admit waiting requests while slots and the batch limit allow,
3. decode, as plan -> execute -> update: one batched step for every decoding row (lookahead-pipelined,
   see ``decode.py``), or the prompt-lookup arm's plan (``prompt_lookup_arm.py``) run on the engine;
   what came back (a ``TickResult``) goes through ``_update``, the one step that changes the rows (each
   token recorded on its sequence and through the finish step, verify outcomes to the drafters) and the
   figures the plan reads (the forwards' times to ``engine.forward_cost`` and the decode loop's step
   times, the verify gate's cost model fed); in plain steady decode a tick may chain several steps (below),
4. prefill: one chunk of at most ``prefill_chunk`` prompt tokens for the oldest admitted request, so
   a long prompt never stalls the decoding rows for more than a chunk; the first token it gives goes
   through ``_update`` too.

Every tick that did work leaves a ``TickRecord`` for the trace sink.

Steps per tick: with ``max_decode_steps`` > 1 a tick in plain steady decode (no prompt to admit or
prefill, no sampler that reads the row's history, such as penalties; prompt-lookup rows only where the
arm allows it, see ``prompt_lookup_arm.py``) submits several chained steps and reads the previous
tick's, so the tick's fixed cost is shared by several tokens. The count is the most that
fits ``tick_budget_ms`` at the measured step time (so a large model, whose steps are long, keeps one step
per tick and streams as before), and never more than any row may still produce or hold: no step is
wasted at max_tokens and none runs past the KV bound. Tokens stay the same as with one step per tick.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from mlxd_drafters import (
    DRAFT_SOURCES,
    PromptLookupConfig,
    PromptLookupDrafter,
    SharedDraftStores,
    SharedStoreConfig,
)
from mlxd_engine import Emitted, Engine, KVStorageFull, kv_room, prompt_lookup_eligibility
from mlxd_protocol import serving_defaults

from .context_shift import can_shift, shift_row
from .decode import DecodeLoop, runs_by_row
from .finishing import Finisher
from .kinds import Phase, RowKind
from .prompt_lookup_arm import ArmPlan, PromptLookupArm
from .request import EventSink, Request, RequestState
from .tick_result import TickResult
from .trace import TickRecord

log = logging.getLogger("mlxd.scheduler")


# Verify bound default: none; the verify gate weighs every draft against its measured cost
# (prompt_lookup_arm.py, tick_plan.py).
DEFAULT_PROMPT_LOOKUP_MAX_BATCH = None


@dataclass
class SchedulerOptions:
    """The batching defaults are mlxd's own: both read them from ``mlxd_protocol.serving_defaults``."""

    max_batch: int = serving_defaults.MAX_BATCH
    prefill_chunk: int = serving_defaults.PREFILL_CHUNK
    lookahead: bool = serving_defaults.LOOKAHEAD
    max_queue: int = serving_defaults.MAX_QUEUE
    prompt_lookup: PromptLookupConfig | None = None  # on by default for every eligible request when set
    prompt_lookup_cap: PromptLookupConfig = field(default_factory=PromptLookupConfig)  # for per-request opt-in
    prompt_lookup_max_batch: int | None = DEFAULT_PROMPT_LOOKUP_MAX_BATCH  # largest batch that verifies (None: any)
    max_decode_steps: int = serving_defaults.DECODE_STEPS  # most chained decode steps per tick (see above)
    tick_budget_ms: float = 5.0  # ... and only as many as fit this long at the measured step time
    # the shared draft store (mlxd_drafters.shared_store): finished requests' tokens, one store per key,
    # a prompt-lookup source for later requests; None: off
    shared_drafts: SharedStoreConfig | None = field(default_factory=SharedStoreConfig)
    # llama-server's --context-shift: a row whose context fills drops part of it and goes on
    # (context_shift.py); off: it ends with "length"
    context_shift: bool = False


class QueueFull(RuntimeError):
    """The waiting queue is at its limit; the client should retry later."""


class BatchScheduler:
    def __init__(
        self,
        engine: Engine,
        options: SchedulerOptions | None = None,
        trace_sink: Callable[[TickRecord], None] | None = None,
    ):
        self.engine = engine
        self.options = options or SchedulerOptions()
        self.trace_sink = trace_sink
        self.finisher = Finisher(engine)
        self.decode_loop = DecodeLoop(engine, lookahead=self.options.lookahead)
        self.prompt_lookup = PromptLookupArm(engine, self.decode_loop, self.options.prompt_lookup_max_batch)
        shared = self.options.shared_drafts
        self.shared_drafts = SharedDraftStores(shared) if shared is not None else None
        self.waiting: deque[RequestState] = deque()
        self.prefilling: list[RequestState] = []
        self.decoding: list[RequestState] = []
        self.by_id: dict[str, RequestState] = {}
        self.tick_number = 0
        self.totals = {
            "requests": 0,
            "finished": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "draft_tokens": 0,
            "draft_accepted": 0,
            # the same per draft source (prompt, output, prediction, shared): draft_tokens_shared, ...
            **{f"draft_{kind}_{source}": 0 for source in DRAFT_SOURCES for kind in ("tokens", "accepted")},
        }

    # -- client side ---------------------------------------------------------------------------
    def submit(self, request: Request, sink: EventSink) -> None:
        """Queue a request. Raises ValueError for a request that can never run (``Engine.check_request``, the
        one admissibility check), QueueFull when full."""
        if request.request_id in self.by_id:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        self.engine.check_request(len(request.prompt), request.max_tokens, request.params)
        if len(self.waiting) >= self.options.max_queue:
            raise QueueFull(f"{len(self.waiting)} requests are waiting")
        state = RequestState(request, sink)
        self.waiting.append(state)
        self.by_id[request.request_id] = state
        self.totals["requests"] += 1

    def cancel(self, request_id: str) -> bool:
        """Ask for a request to stop at the next tick boundary. Returns False for an unknown id."""
        state = self.by_id.get(request_id)
        if state is None:
            return False
        state.cancel_requested = True
        return True

    def fail_all(self, error: str) -> None:
        """End every request, waiting or running, with ``error`` (the engine can compute no more: a
        distributed rank was lost). Nothing is forwarded; in-flight steps are dropped unread."""
        self.decode_loop.drop_in_flight()
        for state in list(self.by_id.values()):
            if state in self.waiting:
                self.waiting.remove(state)
            self._finish(state, "error", None, error)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.decoding or self.decode_loop.pipelined)

    @property
    def active(self) -> int:
        return len(self.prefilling) + len(self.decoding)

    # -- the tick ------------------------------------------------------------------------------
    def tick(self) -> TickRecord | None:
        started = time.perf_counter()
        self.tick_number += 1
        record = TickRecord(self.tick_number, batch=len(self.decoding), pipelined=self.decode_loop.pipelined)
        self._settle_cancellations(record)
        self._admit()
        self._decode(record)
        self._prefill(record)
        record.duration_ms = round((time.perf_counter() - started) * 1000.0, 3)
        if not record.rows:
            return None
        if self.trace_sink is not None:
            self.trace_sink(record)
        return record

    def run_until_idle(self, max_ticks: int = 1_000_000) -> None:
        for _ in range(max_ticks):
            if not self.has_work:
                return
            self.tick()
        raise RuntimeError("scheduler did not go idle")

    # -- steps ---------------------------------------------------------------------------------
    def _settle_cancellations(self, record: TickRecord) -> None:
        for state in [s for s in self.by_id.values() if s.cancel_requested]:
            if state in self.waiting:
                self.waiting.remove(state)
            self._finish(state, "cancelled", record)

    def _admit(self) -> None:
        while self.waiting and self.active < self.options.max_batch and self.engine.storage.free_slots:
            head = self.waiting[0]
            if not self.engine.can_admit(len(head.request.prompt), head.request.max_tokens):
                return  # the pool is full: wait (first come, first served) until a sequence frees room
            state = self.waiting.popleft()
            try:
                state.seq = self.engine.add_sequence(
                    state.request.prompt,
                    state.request.params,
                    state.request.max_tokens,
                    cache_prompt=state.request.cache_prompt,
                )
            except (KVStorageFull, ValueError) as error:
                self._finish(state, "error", None, str(error))
                continue
            state.phase = Phase.PREFILL
            state.timings.prefill_started = time.perf_counter()
            self.prefilling.append(state)

    def _decode(self, record: TickRecord) -> None:
        """Plan, execute, update: a plain tick (``DecodeLoop.tick``) or the prompt-lookup arm's plan and
        execute; each result goes through ``_update``, the one step that changes the rows. A prompt-lookup
        tick that read its lookahead step plans again, synchronously, once that read is applied."""
        rows = [s for s in self.decoding if s.phase == Phase.DECODE]
        if not rows and not self.decode_loop.pipelined:
            return
        if self.decode_loop.pipelined and any(s.seq.chain.grammar is not None for s in rows):
            # a grammar row's mask needs its last token read: settle the steps in flight first; while such
            # a row decodes, the decode loop steps synchronously (decode.py, rule 7)
            self._update(self.decode_loop.teardown(), record)
            rows = [s for s in rows if s.phase == Phase.DECODE]
        was_pipelined = self.decode_loop.pipelined
        self.decode_loop.begin_tick(prefilling=bool(self.prefilling))  # a prefill beside the steps skews their time
        record.pipelined = self.decode_loop.lookahead and was_pipelined and bool(rows)
        if any(s.drafter is not None for s in rows):
            started, timed = time.perf_counter(), self._forward_ms_so_far()
            arm = self.prompt_lookup
            plan: ArmPlan | None = arm.plan(rows, prefilling=len(self.prefilling), steps=self._steps_this_tick(rows))
            while plan is not None:
                result = arm.execute(plan, record)
                again = self._update(result, record)
                # the tick read its lookahead step (rule 4): the rest of it is synchronous
                plan = (
                    arm.plan_after_read([s for s in rows if s.phase == Phase.DECODE], again, result)
                    if result.carried is not None
                    else None
                )
            # what the tick cost beyond its forwards, for the verify gate (prompt_lookup_arm.MeasuredCosts)
            arm.cost_model.observe_tick(
                len(rows),
                was_pipelined,
                record.steps,
                (time.perf_counter() - started) * 1000.0,
                self._forward_ms_so_far() - timed,
            )
            record.pipelined = record.pipelined and self.decode_loop.pipelined
        else:
            record.steps = self._steps_this_tick(rows)
            self._update(self.decode_loop.tick(rows, record.steps), record)
        if self.decode_loop.pipelined and not was_pipelined:
            for state in rows:  # a lookahead step was submitted and nothing read: show it in the trace
                record.add(state.request_id, RowKind.PRIME)

    def _forward_ms_so_far(self) -> float:
        """Milliseconds of forwards timed so far: verify forwards and synchronous steps (their samples, in
        ``engine.forward_cost``) and the waits no sample times, teardowns' reads (``decode_loop.waited_ms``); a
        tick's overhead for the verify gate is its wall minus them."""
        return self.engine.forward_cost.spent_ms + self.decode_loop.waited_ms

    def _steps_this_tick(self, rows: list[RequestState]) -> int:
        """How many chained steps this plain decode tick submits (see the module docstring)."""
        most = self.options.max_decode_steps
        if most <= 1 or not self.decode_loop.lookahead or self.prefilling:
            return 1
        if self.waiting and self.active < self.options.max_batch:
            return 1  # someone may be admitted: keep ticks short
        step_ms = self.decode_loop.step_ms
        if step_ms is not None and step_ms > 0:
            most = min(most, int(self.options.tick_budget_ms / step_ms))
        unread = len(self.decode_loop.in_flight)
        for state in rows:
            seq = state.seq
            if seq.chain.needs_history:
                return 1
            left = state.request.max_tokens - state.emitted - unread  # tokens the row may still take
            room = kv_room(seq)  # appends the row may still make
            most = min(most, left, room)
        return max(1, most)

    # -- update: the one step that changes the rows ------------------------------------------------
    def _update(self, result: TickResult, record: TickRecord) -> list[RequestState]:
        """Apply one execute step's result: what its forwards took to the figures the next plans read (the
        forward cost model, the decode loop's step times), the cost model's share of the plan, each verify
        round's outcome to its drafter, timings and trace, then every row's tokens recorded and through the
        finish step (prefill's first tokens, verify rounds' runs, plain tokens), then failures. For a tick
        that read its lookahead step (``result.carried``), the proposals made before that read are settled
        against the tokens it gave; returns the rows whose proposals it agreed with throughout (they propose
        again, ``PromptLookupArm.plan_after_read``)."""
        self.engine.forward_cost.observe_samples(result.forwards)
        self.decode_loop.learn(result)
        self.prompt_lookup.learn(result)
        for state, outcome in result.rounds:
            source = state.drafter.outstanding_source
            state.timings.count_source(source, outcome.drafted, outcome.accepted)
            state.drafter.accept_verified_tokens(outcome.drafted, outcome.accepted)
            state.timings.draft_n += outcome.drafted
            state.timings.draft_n_accepted += outcome.accepted
            state.timings.draft_verify_n += 1
            record.add(
                state.request_id, RowKind.VERIFY, drafted=outcome.drafted, accepted=outcome.accepted, detail=source
            )
        for state, first, detail in result.first_tokens:
            self._take_first_token(state, first, record, detail)
        for state, outcome in result.rounds:
            self._emit_run(state, outcome.emitted, record, None, "")  # the trace shows them as the verify
        self._emit_decoded(result.emitted, record, result.details)
        for state, error in result.failed:
            if state.drafter is not None:
                state.drafter.retract_draft()  # a failed verify's draft (no-op when none is outstanding)
            self._fail(state, error, record)
        return self._settle_carried(result) if result.carried is not None else []

    def _settle_carried(self, read: TickResult) -> list[RequestState]:
        """Rule 4 of ``prompt_lookup_arm.py``: each proposal made while the steps were in flight, against
        the tokens those steps gave (already applied): a step that disagreed is the round's rejection; a
        proposal they agreed with throughout is a round accepted so far. Returns the rows of the latter."""
        assert read.carried is not None
        again = []
        for state, proposal in read.carried.items():
            if state.phase != Phase.DECODE:
                state.drafter.retract_draft()  # the row finished in the steps read
                continue
            given = state.seq.tokens[read.carried_from[state] :]  # what the steps read gave (one or more)
            agreed = 0
            while agreed < min(len(given), len(proposal)) and given[agreed] == proposal[agreed]:
                agreed += 1
            if agreed < min(len(given), len(proposal)):
                state.drafter.accept_verified_tokens(agreed + 1, agreed)  # a step rejected a draft token
            else:
                state.drafter.accept_verified_tokens(agreed, agreed)  # the steps gave all the draft checked
                again.append(state)
        return again

    def _emit_decoded(self, emitted: list, record: TickRecord, details: dict[RequestState, str]) -> None:
        """Steps' tokens, (state, Emitted) pairs in order: each row's run through ``_emit_run``, its trace
        action from ``details`` ("decode" when absent)."""
        for state, tokens, logprobs in runs_by_row(emitted):
            self._emit_run(state, tokens, record, logprobs or None, details.get(state, RowKind.DECODE))

    def _emit_run(
        self,
        state: RequestState,
        tokens: list[int],
        record: TickRecord,
        logprobs: list | None,
        action: str = RowKind.DECODE,
    ) -> None:
        """A decoding row's tokens of one tick, in order: recorded on its sequence, then one finish-step call
        and one event for them. ``action``: "decode", a decline detail for the trace, or "" for tokens the
        trace shows otherwise."""
        if state.phase != Phase.DECODE:
            return
        state.seq.record(tokens)  # all of them: storage holds their appends (the finish step may end the row)
        judged, _, reason = self.finisher.accept_run(state, tokens, logprobs)
        if action:
            record.add_decode(state.request_id, detail=action if action != RowKind.DECODE else None, count=judged)
        if state.drafter is not None:
            state.drafter.observe(tokens[:judged])
        if reason == "length" and self.options.context_shift and can_shift(state):
            self._shift_context(state, record)
        elif reason is not None:
            self._finish(state, reason, record)

    def _shift_context(self, state: RequestState, record: TickRecord) -> None:
        """The row's context is full: rebuild it from the tokens a shift keeps and prefill it again, first
        in line (``context_shift.py``); its next token comes from that prefill."""
        self.decoding.remove(state)
        try:
            kept, dropped = shift_row(self.engine, state)
        except (KVStorageFull, ValueError) as error:
            self._fail(state, f"context shift: {error}", record)
            return
        log.debug("request %s: context shift kept %d tokens, dropped %d", state.request_id, kept, dropped)
        state.phase = Phase.PREFILL
        self.prefilling.insert(0, state)

    def _fail(self, state: RequestState, error: str, record: TickRecord) -> None:
        self._finish(state, "error", record, error)

    def _start_drafter(self, state: RequestState) -> str | None:
        """At prefill completion: give an eligible prompt-lookup request its drafter. Returns why a request
        that asked for prompt lookup may not have it (None otherwise)."""
        wanted = state.request.speculative
        default = self.options.prompt_lookup
        predicted = bool(state.request.prediction)  # a predicted output asks for prompt lookup itself
        if wanted.enabled is False or (wanted.enabled is None and default is None and not predicted):
            return None
        verdict = prompt_lookup_eligibility(state.request.params, storage_can_unwind=self.engine.can_unwind)
        if not verdict:
            log.debug("request %s decodes plainly: %s", state.request_id, verdict.reason)
            return verdict.reason
        config = default or self.options.prompt_lookup_cap
        if wanted.max_draft:
            config = config.with_max_draft(wanted.max_draft)
        state.drafter = PromptLookupDrafter(
            config, prediction=state.request.prediction, shared=self._shared_store(state)
        )
        state.drafter.prime(state.seq.tokens)  # the whole prompt, cached prefix included
        state.timings.speculated = True
        return None

    def _shared_store(self, state: RequestState):
        """The shared draft store of the request's key, or None (off, or the request opted out)."""
        if self.shared_drafts is None or not state.request.shared_drafts:
            return None
        return self.shared_drafts.store(state.request.draft_key)

    def _feed_shared_store(self, state: RequestState, reason: str) -> None:
        """A finished request's tokens into its key's shared store: not a failed one's, nor where no request
        drafts (prompt lookup off by default and this one did not ask for it)."""
        if reason == "error" or state.seq is None or state.emitted == 0:
            return
        if self.options.prompt_lookup is None and state.drafter is None:
            return
        store = self._shared_store(state)
        if store is not None:
            assert self.shared_drafts is not None  # a store came from it
            self.shared_drafts.add(state.request.draft_key, state.request.prompt, state.output_tokens())

    def _prefill(self, record: TickRecord) -> None:
        """Execute one prompt chunk of the oldest admitted request; ``_update`` applies a failure or the
        first token."""
        if not self.prefilling:
            return
        state = self.prefilling[0]
        before = state.seq.kv.written
        try:
            first = self.engine.prefill(state.seq, self.options.prefill_chunk)
        except Exception as error:  # noqa: BLE001 - one bad prompt must not stop the others
            self._update(TickResult(failed=[(state, f"{type(error).__name__}: {error}")]), record)
            return
        record.prefill_tokens = state.seq.kv.written - before
        hit = f"prefix cache hit: {state.seq.cached_tokens} tokens" if before == state.seq.cached_tokens > 0 else None
        if first is None:
            record.add(state.request_id, RowKind.PREFILL, detail=hit)
            return
        self._update(TickResult(first_tokens=[(state, first, hit)]), record)

    def _take_first_token(self, state: RequestState, first: Emitted, record: TickRecord, hit: str | None) -> None:
        """A prefilled row's first token: the row starts decoding, the token is recorded and goes through the
        finish step, and an eligible row gets its drafter (``hit``: the prefix cache's trace detail)."""
        self.prefilling.remove(state)
        record.add(state.request_id, RowKind.FIRST_TOKEN, detail=hit)
        first_token_action = record.rows[-1]
        state.phase = Phase.DECODE
        self.decoding.append(state)
        state.seq.record([first.token])
        logprobs = (
            {"token": first.token, "logprob": first.logprob, "top": first.top_logprobs}
            if first.logprob is not None
            else None
        )
        reason = self.finisher.accept(state, first.token, logprobs)
        if reason is not None:
            self._finish(state, reason, record)
        else:
            declined = self._start_drafter(state)
            if declined is not None:
                first_token_action.detail = "; ".join(filter(None, [hit, f"prompt lookup off: {declined}"]))

    def _finish(self, state: RequestState, reason: str, record: TickRecord | None, error: str | None = None) -> None:
        if state.phase == Phase.FINISHED:
            return
        state.phase = Phase.FINISHED
        state.finish_reason = reason
        for group in (self.prefilling, self.decoding):
            if state in group:
                group.remove(state)
        self.by_id.pop(state.request_id, None)
        self._feed_shared_store(state, reason)
        self.finisher.finish(state, reason, error)
        self.totals["finished"] += 1
        self.totals["prompt_tokens"] += len(state.request.prompt)
        self.totals["completion_tokens"] += state.emitted
        self.totals["draft_tokens"] += state.timings.draft_n
        self.totals["draft_accepted"] += state.timings.draft_n_accepted
        for source, (drafted, accepted) in state.timings.draft_sources.items():
            self.totals[f"draft_tokens_{source}"] = self.totals.get(f"draft_tokens_{source}", 0) + drafted
            self.totals[f"draft_accepted_{source}"] = self.totals.get(f"draft_accepted_{source}", 0) + accepted
        if record is not None:
            record.add(state.request_id, RowKind.FINISHED, detail=reason)
