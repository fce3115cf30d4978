"""The prompt-lookup arm of the decode tick: verify rounds without giving up lookahead.

Contract: ``PromptLookupArm.tick(rows, record)`` replaces the plain decode tick whenever a decoding row
has a drafter. Every token still goes through the scheduler's finish step (``emit_decoded``, ``emit_run``:
each row's tokens of a tick as one run, logprobs included); each proposing row runs the engine's shared
verify round at most once per tick.

The tick, in the order the rules are applied:
1. Gate: when the active batch is above ``max_batch`` no row drafts this tick (no ``draft_block`` call,
   so no miss is recorded); its drafter keeps observing tokens and resumes when the batch shrinks.
   The active batch counts the decoding rows and the rows still in prefill, which join within a few
   ticks: while a burst of requests is admitted, the first rows do not start verify rounds (measured:
   docs/benchmark_results/code_notes.md#gate-counts-prefill).
   A row whose governor grants no budget is "declined by governor".
2. While step n is in flight, every gated-in drafter is asked for a proposal on its committed tokens.
3. No proposal anywhere: step n+1 is primed and the tick pipelines exactly as plain decode does. A
   drafter sees tokens only when they are read, so chaining several steps per tick (the scheduler's
   ``steps``, see ``scheduler.py``) delays its next look by that many tokens. The chain therefore backs
   off: a row that has gone q pipelined ticks without proposing allows 2**q steps (1, 2, 4, 8, ...), the
   tick takes the least any drafting row allows, and a proposal resets the row to one step. A row that
   copies keeps finding its matches at once; one that never matches soon decodes as fast as a plain row.
   Ticks where the gate holds every drafter back chain ``steps`` at once.
4. Some row proposes: no prime is submitted; step n is read and committed (tokens to the finish step),
   the proposals made before it are retracted (they predate its token), and the tick goes on
   synchronously: the rows that propose on their now-current tokens run their verify rounds together, in
   one forward (``verify_rows``: each row its own draft length, the shorter padded), and every other row
   takes one batched step.
5. From a synchronous state, a tick re-primes (submits a lookahead step and returns) only when no row
   proposes and every prompt-lookup row's ``pipelines_plain_rounds()`` is true (or its proposal was
   just declined by rule 6); otherwise it stays synchronous with one batched step.
6. Short proposals beside other rows: with more than one decoding row, a proposal of fewer than
   ``MIN_DRAFT_BESIDE_OTHERS`` tokens is retracted (declined, not a miss) and the row takes the batched
   step. A proposal as long as its governor allowed, where the governor allowed less than the row's
   ``max_draft``, is never declined so (a probe, or a small budget while the governor's window recovers:
   the only way a governor that turned off sees the row copying again); a retracted probe goes back to
   the governor (offered again next time). Each verify round is a forward of its own, so beside other rows it pays only when it checks a
   long draft (measured: docs/benchmark_results/code_notes.md#short-proposals).
7. Structured output: a row with a grammar never pipelines (its mask needs its last token read), and
   its proposal is cut at the first token the grammar forbids (the verify round cuts it, and masks
   every position); a proposal whose first token is forbidden is retracted (no round, no miss).
A verify forward that fails fails only its row: a failed batched forward is unwound and retried row by
row; a row whose own forward fails finishes with an error; the other rows go on.
"""

from __future__ import annotations

import logging
from typing import Callable

from mlxd_engine import Engine, verify_round, verify_rows

from .decode import DecodeLoop
from .request import RequestState
from .trace import TickRecord

log = logging.getLogger("mlxd.scheduler")

# Rule 6: the shortest proposal a row verifies while other rows decode beside it.
MIN_DRAFT_BESIDE_OTHERS = 4

EmitDecoded = Callable[[list, TickRecord, dict | None], None]  # steps' (state, Emitted) pairs, trace actions by row id
EmitRun = Callable[[RequestState, list, TickRecord, list, str], None]  # a row's tokens, logprobs, trace action
Fail = Callable[[RequestState, str, TickRecord], None]


class PromptLookupArm:
    def __init__(self, engine: Engine, decode_loop: DecodeLoop, max_batch: int, emit_decoded: EmitDecoded,
                 emit_run: EmitRun, fail: Fail):
        self.engine = engine
        self.decode_loop = decode_loop
        self.max_batch = max_batch
        # both go through the scheduler's finish step: steps' tokens grouped per row, and one row's run
        self.emit_decoded = emit_decoded
        self.emit_run = emit_run
        self.fail = fail
        self.counters = {"verify_rounds": 0, "declined_gate": 0, "declined_governor": 0, "declined_short": 0}

    def tick(self, rows: list[RequestState], record: TickRecord, prefilling: int = 0, steps: int = 1) -> None:
        """One decode tick over ``rows``; ``prefilling`` rows (admitted, prompt not yet in) count toward the gate;
        ``steps``: the most chained steps a plain tick may submit (rule 3)."""
        drafting = [s for s in rows if s.drafter is not None]
        batch = len(rows)  # decoding rows as the tick starts (rule 6)
        if len(rows) + prefilling > self.max_batch:
            self.counters["declined_gate"] += len(drafting)
            self._plain(rows, record, {id(s): "declined-gate" for s in drafting}, steps)
            return
        if self.decode_loop.pipelined:
            proposals, _ = self._propose(drafting, None, batch)
            if not proposals:  # rule 3: keep pipelining, chaining steps as the rows' quiet streaks allow
                allowed = min((2 ** min(s.quiet_ticks, 6) for s in drafting), default=steps)
                for state in drafting:
                    state.quiet_ticks += 1
                self._plain(rows, record, None, min(steps, allowed))
                return
            for state in proposals:
                state.quiet_ticks = 0
            # rule 4: read step n instead of priming n+1; the early proposals are stale now
            for state in proposals:
                state.drafter.retract_draft()
            self.emit_decoded(self.decode_loop.teardown(), record, {})
            rows = [s for s in rows if s.phase == "decode"]
            drafting = [s for s in drafting if s.phase == "decode"]
        self._synchronous(rows, drafting, record, batch)

    # -- pieces ---------------------------------------------------------------------------------
    def _propose(self, drafting: list[RequestState], record: TickRecord | None,
                 batch: int) -> tuple[dict[RequestState, list[int]], set[int]]:
        """Proposals to verify, and the ids of rows whose proposal rule 6 declined."""
        proposals, declined_short = {}, set()
        for state in drafting:
            granted = state.drafter.governor.peek_budget()
            if granted == 0:
                state.drafter.draft_block()  # counts toward the governor's probe spacing
                if record is not None:
                    self.counters["declined_governor"] += 1
                continue
            proposal = state.drafter.draft_block()
            grammar = state.seq.chain.grammar
            if proposal and grammar is not None and not grammar.allowed_prefix(proposal):
                state.drafter.retract_draft()  # rule 7: the grammar forbids even the first draft token
                continue
            if proposal and state.request.max_tokens - state.emitted <= 1:
                # one token left: the round would check no draft; a plain step gives that token
                state.drafter.retract_draft()
                continue
            # rule 6, for a proposal cut short by its match; one the governor sized (a probe, a small budget
            # while its window recovers) is verified, or the governor would never see the row copy again
            governor_sized = granted < state.drafter.governor.config.max_draft and len(proposal) >= granted
            if proposal and batch > 1 and len(proposal) < MIN_DRAFT_BESIDE_OTHERS and not governor_sized:
                state.drafter.retract_draft()  # rule 6: not worth a forward of its own beside other rows
                declined_short.add(id(state))
                if record is not None:
                    self.counters["declined_short"] += 1
                continue
            if proposal:
                proposals[state] = proposal
        return proposals, declined_short

    def _synchronous(self, rows: list[RequestState], drafting: list[RequestState], record: TickRecord,
                     batch: int) -> None:
        governor_off = {id(s) for s in drafting if s.drafter.governor.peek_budget() == 0}
        proposals, declined_short = self._propose(drafting, record, batch)
        if proposals:
            self._verify_all(proposals, record)
        rest = [s for s in rows if s not in proposals and s.phase == "decode"]
        if not rest:
            return
        details = {i: "declined-governor" for i in governor_off}
        # a row whose short proposal was declined would be declined again: it does not hold pipelining back
        if not proposals and all(id(s) in declined_short or s.drafter.pipelines_plain_rounds() for s in drafting):
            self._plain(rest, record, details)  # rule 5: re-prime (this tick only submits)
            return
        emitted, failed = self.decode_loop.step_synchronously(rest)
        for state, error in failed:
            self.fail(state, error, record)
        self.emit_decoded(emitted, record, details)

    def _verify_all(self, proposals: dict[RequestState, list[int]], record: TickRecord) -> None:
        """Every proposing row's verify round in one forward (``verify_rows``); if that forward fails, each
        row is retried alone, so a failure fails only its own row."""
        states = list(proposals)
        try:
            # EOS, max_tokens and the KV bound are cut inside the round; a stop string is found by the
            # finish step below, which ends the row at that token (the row's slot is then released)
            outcomes = verify_rows(self.engine, [s.seq for s in states], [proposals[s] for s in states],
                                   [max(s.request.max_tokens - s.emitted, 1) for s in states])
        except Exception as error:  # noqa: BLE001 - retried row by row below
            if len(states) == 1:
                self._verify_failed(states[0], error, record)
                return
            log.warning("batched verify of %d rows failed (%s); verifying them one by one", len(states), error)
            for state in states:
                if state.seq.kv.pending:
                    self.engine.unwind_appends(state.seq, state.seq.kv.pending)
            for state in states:
                self._verify(state, proposals[state], record)
            return
        for state, outcome in zip(states, outcomes):
            self._record(state, outcome, record)

    def _verify_failed(self, state: RequestState, error: Exception, record: TickRecord) -> None:
        seq = state.seq
        if seq.kv.pending:
            self.engine.unwind_appends(seq, seq.kv.pending)
        state.drafter.retract_draft()
        self.fail(state, f"verify failed: {type(error).__name__}: {error}", record)

    def _verify(self, state: RequestState, proposal: list[int], record: TickRecord) -> None:
        """One row's verify round alone (the fallback after a failed batched forward)."""
        try:
            outcome = verify_round(self.engine, state.seq, proposal, max(state.request.max_tokens - state.emitted, 1))
        except Exception as error:  # noqa: BLE001 - a failed verify fails only this row
            self._verify_failed(state, error, record)
            return
        self._record(state, outcome, record)

    def _record(self, state: RequestState, outcome, record: TickRecord) -> None:
        """A verify round's outcome: the drafter's governor, the row's timings, the trace, the finish step."""
        self.counters["verify_rounds"] += 1
        state.drafter.accept_verified_tokens(outcome.drafted, outcome.accepted)
        state.timings.draft_n += outcome.drafted
        state.timings.draft_n_accepted += outcome.accepted
        state.timings.draft_verify_n += 1
        record.add(state.request_id, "verify", drafted=outcome.drafted, accepted=outcome.accepted)
        self.emit_run(state, outcome.emitted, record, None, "")  # the trace shows them as the verify

    def _plain(self, rows: list[RequestState], record: TickRecord, details: dict[int, str] | None = None,
               steps: int = 1) -> None:
        record.steps = steps
        emitted, failed = self.decode_loop.tick(rows, steps)
        for state, error in failed:
            self.fail(state, error, record)
        self.emit_decoded(emitted, record, details)

