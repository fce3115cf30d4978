"""Batched decode with lookahead pipelining.

Contract: ``DecodeLoop.tick(rows)`` gives every decoding row one token per call (after the first call
of a pipelined run, which only primes) and returns ``(state, Emitted)`` pairs to the finish step.

Lookahead (steady decode): step n+1 is submitted with ``mx.async_eval`` before step n is read, so the
model runs while Python detokenizes, checks stops and streams step n's tokens. The rules that keep the
in-flight step right when the batch changes:

1. Admission: a row that finished prefill joins the next submission with its own last token; rows
   that were in the in-flight step take their still-unread tokens. No teardown is needed.
2. Completion: a row found finished when step n is read is already inside step n+1. Its slot is
   released at once (MLX orders step n+1's writes before any later forward's) and its step-n+1 token
   is dropped when that step is read.
3. Cancellation: as completion, at the next tick boundary.
4. Teardown: ``teardown()`` reads and discards nothing: it reads the in-flight step (committing its
   appends and keeping its tokens) so every row again has exactly one token outside storage. Callers
   that need synchronous rows (a verify round, an error retry) tear down first.
5. Errors: if a batched step fails, the in-flight work is abandoned, every row's pending appends are
   unwound and each row is retried alone; a row that fails alone is reported failed, the others go on.

With ``lookahead=False`` every tick submits and reads its own step (the unpipelined baseline).
"""

from __future__ import annotations

import logging

import mlx.core as mx

from mlxd_engine import Emitted, Engine, StepHandle

from .request import RequestState

log = logging.getLogger("mlxd.scheduler")


class DecodeLoop:
    def __init__(self, engine: Engine, lookahead: bool = True):
        self.engine = engine
        self.lookahead = lookahead
        self.in_flight: StepHandle | None = None
        self._in_flight_states: list[RequestState] = []

    @property
    def pipelined(self) -> bool:
        return self.in_flight is not None

    def tick(self, rows: list[RequestState]) -> tuple[list[tuple[RequestState, Emitted]], list[tuple[RequestState, str]]]:
        """One decode tick. Returns (emitted tokens, failed rows with their error)."""
        if not rows:
            return self.teardown(), []
        try:
            if not self.lookahead:
                return self._pairs(rows, self.engine.step([s.seq for s in rows])), []
            next_handle = self.engine.submit_step([s.seq for s in rows], lookahead=self.in_flight)
            previous, previous_states = self.in_flight, self._in_flight_states
            self.in_flight, self._in_flight_states = next_handle, list(rows)
            if previous is None:
                return [], []
            return self._pairs(previous_states, self.engine.read_step(previous)), []
        except Exception as error:  # noqa: BLE001 - a failed forward must not take the daemon down
            log.warning("batched step failed (%s); retrying rows one by one", error)
            return self._recover(rows)

    def step_synchronously(self, rows: list[RequestState]):
        """One unpipelined batched step (nothing may be in flight). Returns (emitted, failed)."""
        assert self.in_flight is None, "tear down the in-flight step first"
        try:
            return self._pairs(rows, self.engine.step([s.seq for s in rows])), []
        except Exception as error:  # noqa: BLE001
            log.warning("batched step failed (%s); retrying rows one by one", error)
            return self._recover(rows)

    def teardown(self) -> list[tuple[RequestState, Emitted]]:
        """Read the in-flight step, if any, so no step is left in flight."""
        if self.in_flight is None:
            return []
        handle, states = self.in_flight, self._in_flight_states
        self.in_flight, self._in_flight_states = None, []
        try:
            return self._pairs(states, self.engine.read_step(handle))
        except Exception as error:  # noqa: BLE001
            log.warning("in-flight step failed at teardown (%s)", error)
            self._unwind_all(states)
            return []

    def _pairs(self, states: list[RequestState], emitted: list[Emitted]) -> list[tuple[RequestState, Emitted]]:
        return [(s, e) for s, e in zip(states, emitted) if not s.seq.released]

    def _unwind_all(self, states: list[RequestState]) -> None:
        for state in states:
            seq = state.seq
            # tokens are recorded only when a step is read, so dropping the unread appends leaves
            # every row with exactly its last token outside storage again
            if not seq.released and seq.kv.pending:
                self.engine.unwind_appends(seq, seq.kv.pending)

    def _recover(self, rows: list[RequestState]):
        states = {id(s): s for s in rows + self._in_flight_states}.values()
        self.in_flight, self._in_flight_states = None, []
        self._unwind_all(list(states))
        mx.clear_cache()
        emitted, failed = [], []
        for state in rows:
            try:
                emitted.extend(self._pairs([state], self.engine.step([state.seq])))
            except Exception as error:  # noqa: BLE001
                self._unwind_all([state])
                failed.append((state, f"{type(error).__name__}: {error}"))
        return emitted, failed
