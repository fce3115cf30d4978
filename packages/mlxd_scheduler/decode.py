"""Batched decode with lookahead pipelining.

Contract: ``DecodeLoop.tick(rows)`` gives every decoding row one token per call (after the first call
of a pipelined run, which only primes) and returns a ``TickResult`` of ``(state, Emitted)`` pairs and
what its forwards took for the scheduler's update step, which records the tokens on the rows, runs the
finish step and gives the times to the figures (``learn``; ``engine.forward_cost``): the loop never
writes a row's tokens nor a figure while it runs; it keeps only the steps it has in flight.

Lookahead (steady decode): step n+1 is submitted with ``mx.async_eval`` before step n is read, so the
model runs while Python detokenizes, checks stops and streams step n's tokens. With ``steps`` > 1 a
tick submits that many chained steps (each started as soon as it is built) and then reads the ones the
previous tick left in flight: the tick's fixed Python cost (reading, the finish step's bookkeeping, the
trace, the daemon's socket turn) is paid once per ``steps`` tokens instead of once per token. The
scheduler asks for more than one step only in plain steady decode (see ``BatchScheduler``). The rules
that keep the in-flight steps right when the batch changes:

1. Admission: a row that finished prefill joins the next submission with its own last token; rows
   that were in the in-flight steps take their still-unread tokens. No teardown is needed.
2. Completion: a row found finished when a step is read is already inside the later in-flight steps.
   Its slot is released at once (MLX orders those steps' writes before any later forward's) and its
   later tokens are dropped when those steps are read (a released sequence's tokens are never reported;
   a row rebuilt by a context shift has a new sequence, and the steps in flight for its old one are
   dropped alike).
3. Cancellation: as completion, at the next tick boundary.
4. Teardown: ``teardown()`` reads and discards nothing: it reads the in-flight steps (committing their
   appends and keeping their tokens) so every row again has exactly one token outside storage. Callers
   that need synchronous rows (a verify round, an error retry) tear down first.
5. Errors: if a batched step fails, the in-flight work is abandoned, every row's pending appends are
   unwound and each row that got no token this tick is retried alone (one that did keeps its tokens and
   steps next tick, once the update step has recorded them); a row that fails alone is reported failed,
   the others go on.
6. Rows whose sampler reads their history (penalties) see it through the newest in-flight step only,
   so a tick with such a row submits one step (the scheduler sees to it). A logit bias or a per-request
   seed needs no history: each chained step draws in order, as single steps would.
7. Rows with a grammar (structured output) need the token of step n to compute the mask of step n+1,
   so a tick with such a row steps synchronously (the scheduler tears the in-flight steps down first);
   the engine still starts each step's forward before building the grammar rows' masks.

With ``lookahead=False`` every tick submits and reads its own single step (the unpipelined baseline).
"""

from __future__ import annotations

import logging
import time

from mlxd_engine import Emitted, Engine, StepHandle, kv_room, release_cached_memory, timed_step

from .recent_timings import RecentTimings
from .request import RequestState
from .tick_result import TickResult

log = logging.getLogger("mlxd.scheduler")
STEP_SAMPLES = 9  # steady ticks a batch size's plain step is the median of
STEP_SAMPLES_NEEDED = 3
STEP_MS_WEIGHT = 0.2  # each step's share of the moving average of the plain step's time (step_ms)


def runs_by_row(emitted: list[tuple[RequestState, Emitted]]) -> list[tuple[RequestState, list[int], list[dict]]]:
    """A tick's tokens grouped per row, in order: (state, tokens, logprob records of the tokens that carry
    them). The finish step takes each row's run at once (one event per row and tick)."""
    runs: dict[int, tuple[RequestState, list[int], list[dict]]] = {}
    for state, out in emitted:
        run = runs.get(id(state))
        if run is None:
            run = runs[id(state)] = (state, [], [])
        run[1].append(out.token)
        if out.logprob is not None:
            run[2].append({"token": out.token, "logprob": out.logprob, "top": out.top_logprobs})
    return list(runs.values())


class DecodeLoop:
    def __init__(self, engine: Engine, lookahead: bool = True):
        self.engine = engine
        self.lookahead = lookahead
        # submitted, unread steps, oldest first: (handle, the rows it was submitted for)
        self.in_flight: list[tuple[StepHandle, list[RequestState]]] = []
        self.step_ms: float | None = None  # moving average of one step's time, from pipelined ticks
        self.last_step_ms: float | None = None  # the last pipelined tick's time per step
        self.step_ms_by_rows: dict[int, float] = {}  # step_ms by batch size (the verify gate's plain step)
        # whether a steady tick's time is a plain step's (``begin_tick``): not while a prompt is prefilled
        # beside the decode (the admission and the prefill forward land in the steps' wait); the gate's
        # plain step is then left as it was
        self.steady_batch = True
        self._step_samples: dict[int, RecentTimings] = {}  # recent steady ticks' step times, by batch size
        # time spent waiting on forwards outside pipelined ticks (synchronous steps, teardowns), summed: what
        # the verify gate's tick overheads leave out (prompt_lookup_arm.TickOverheads)
        self.waited_ms = 0.0
        # step_ms, last_step_ms, step_ms_by_rows and waited_ms are written by ``learn`` only (the update step)

    @property
    def pipelined(self) -> bool:
        return bool(self.in_flight)

    def begin_tick(self, prefilling: bool) -> None:
        """The scheduler's decode tick starts; ``prefilling``: a prompt is prefilled beside it."""
        self.steady_batch = not prefilling

    def tick(self, rows: list[RequestState], steps: int = 1) -> TickResult:
        """One decode tick of ``steps`` chained steps. Returns the emitted tokens in order, the failed rows
        and what the forwards took (a pipelined tick's time per step; a synchronous step's sample)."""
        if not rows or (self.in_flight and any(kv_room(s.seq) < 1 for s in rows)):
            # (or: the steps in flight fill a row's storage; one more would pass its bound) read, submit nothing
            return self.teardown()
        result = TickResult()  # tokens of steps read (and committed) before any failure are still reported
        try:
            if not self.lookahead or any(s.seq.chain.grammar is not None for s in rows):
                assert not self.in_flight, "tear down the in-flight steps before a synchronous step (rule 7)"
                emitted, sample = timed_step(self.engine, [s.seq for s in rows])
                return TickResult(emitted=self._pairs(rows, emitted), forwards=[sample])
            started = time.perf_counter()
            states = list(rows)  # the chained steps share it: their rows are the same
            seqs = [s.seq for s in states]
            previous = self.in_flight[-1][0] if self.in_flight else None
            submitted = []
            for _ in range(max(1, steps)):
                previous = self.engine.submit_step(seqs, lookahead=previous)
                submitted.append((previous, states))
            unread, self.in_flight = self.in_flight, submitted
            for handle, states in unread:
                result.emitted.extend(self._read(handle, states))
            if unread:
                # each submission waits while MLX works off the queue, so a pipelined tick lasts about as
                # long as the most steps it submitted or read
                result.pipelined_step_ms = (time.perf_counter() - started) * 1000.0 / max(len(submitted), len(unread))
                if (
                    self.steady_batch
                    and len(unread) == len(submitted)
                    and all(len(read) == len(seqs) for _, read in unread)
                ):
                    result.steady_rows = len(seqs)
            return result
        except Exception as error:  # noqa: BLE001 - a failed forward must not take the daemon down
            log.warning("batched step failed (%s); retrying rows one by one", error)
            got = {state for state, _ in result.emitted}  # their tokens are not recorded yet: no step may follow
            recovered = self._recover([s for s in rows if s not in got], rows)
            recovered.emitted[:0] = result.emitted
            return recovered

    def learn(self, result: TickResult) -> None:
        """The update step's share of a result: its waits and its pipelined step time into the figures the
        plan reads (``step_ms``, ``last_step_ms``, ``step_ms_by_rows``, ``waited_ms``)."""
        self.waited_ms += result.waited_ms
        ms = result.pipelined_step_ms
        if ms is None:
            return
        self._measure(ms)
        self.last_step_ms = ms
        if result.steady_rows:
            self._measure_batch(result.steady_rows, ms)

    def _measure_batch(self, rows: int, ms: float) -> None:
        """A steady tick's step time (as many steps read as submitted, of this batch): the gate's plain step
        at this batch size is the lower median of the last ``STEP_SAMPLES`` such ticks, once there are
        ``STEP_SAMPLES_NEEDED``. The first ticks at a batch size that just changed can take several times a
        step (a row that finished leaves a gap in the slots until a new request fills it:
        docs/benchmark_results/code_notes.md#slot-gaps); a moving average kept such a figure for many ticks
        and priced plain decode far above what it costs."""
        samples = self._step_samples.setdefault(rows, RecentTimings(STEP_SAMPLES))
        samples.add(ms)
        median = samples.lower_median()
        if len(samples) >= STEP_SAMPLES_NEEDED and median is not None:
            self.step_ms_by_rows[rows] = median
        # else the gate prices this size from the nearest measured one meanwhile

    def _measure(self, ms: float) -> None:
        self.step_ms = ms if self.step_ms is None else (1 - STEP_MS_WEIGHT) * self.step_ms + STEP_MS_WEIGHT * ms

    def step_synchronously(self, rows: list[RequestState]) -> TickResult:
        """One unpipelined batched step (nothing may be in flight): its tokens, failures, samples and the
        wait beside them (``waited_ms`` holds only what no sample times: a step's time goes to the cost model
        once, through ``forwards``)."""
        assert not self.in_flight, "tear down the in-flight steps first"
        started = time.perf_counter()
        try:
            emitted, sample = timed_step(self.engine, [s.seq for s in rows])
            result = TickResult(emitted=self._pairs(rows, emitted), forwards=[sample])
        except Exception as error:  # noqa: BLE001
            log.warning("batched step failed (%s); retrying rows one by one", error)
            result = self._recover(rows, rows)
        elapsed = (time.perf_counter() - started) * 1000.0
        result.waited_ms = max(0.0, elapsed - sum(sample.ms for sample in result.forwards))
        return result

    def drop_in_flight(self) -> None:
        """Forget the in-flight steps unread (the engine can compute no more: ``BatchScheduler.fail_all``)."""
        self.in_flight = []

    def teardown(self) -> TickResult:
        """Read the in-flight steps, if any, so no step is left in flight: their tokens and the wait."""
        unread, self.in_flight = self.in_flight, []
        result = TickResult()
        started = time.perf_counter()
        try:
            for handle, states in unread:
                result.emitted.extend(self._read(handle, states))
        except Exception as error:  # noqa: BLE001
            log.warning("in-flight step failed at teardown (%s)", error)
            self._unwind_all([s for _, states in unread for s in states])
        result.waited_ms = (time.perf_counter() - started) * 1000.0
        return result

    def _pairs(self, states: list[RequestState], emitted: list[Emitted]) -> list[tuple[RequestState, Emitted]]:
        return [(s, e) for s, e in zip(states, emitted) if not s.seq.released]

    def _read(self, handle: StepHandle, states: list[RequestState]) -> list[tuple[RequestState, Emitted]]:
        """Read a step in flight: its rows' tokens, none of a sequence released since it was submitted
        (finished, or rebuilt by a context shift: the row's ``seq`` is then another sequence)."""
        emitted = self.engine.read_step(handle)
        return [(s, e) for s, seq, e in zip(states, handle.rows, emitted) if not seq.released and s.seq is seq]

    def _unwind_all(self, states: list[RequestState]) -> None:
        for state in {id(s): s for s in states}.values():
            seq = state.seq
            # a read commits its append and the update step records its token, so dropping the unread
            # appends leaves every row, once its read tokens are recorded, with exactly its last token
            # outside storage again
            if not seq.released:
                self.engine.unwind_pending(seq)

    def _recover(self, rows: list[RequestState], tick_rows: list[RequestState]) -> TickResult:
        """Unwind every pending append of ``tick_rows`` and the steps in flight; step each of ``rows`` alone."""
        states = tick_rows + [s for _, in_flight_states in self.in_flight for s in in_flight_states]
        self.in_flight = []
        self._unwind_all(states)
        release_cached_memory()
        result = TickResult()
        for state in rows:
            try:
                emitted, sample = timed_step(self.engine, [state.seq])
            except Exception as error:  # noqa: BLE001
                self._unwind_all([state])
                result.failed.append((state, f"{type(error).__name__}: {error}"))
                continue
            result.emitted.extend(self._pairs([state], emitted))
            result.forwards.append(sample)
        return result
