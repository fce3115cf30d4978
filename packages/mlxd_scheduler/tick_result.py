"""What one execute step of the tick produced, for the scheduler's update step (``BatchScheduler._update``).

Contract: the execute step (``DecodeLoop``'s steps, the prompt-lookup arm's ``execute``, a prefill chunk)
only runs forwards and fills a ``TickResult``; the update step applies it in order, and is the one place
that changes requests, rows, drafters and the figures that price the next plan: the tokens, the
failures, the plan's verdicts on the drafts (``DraftVerdicts``: retractions, pacing), and what
the forwards cost (``forwards`` to ``engine.forward_cost``; ``waited_ms``, ``pipelined_step_ms`` and
``steady_rows`` to the decode loop's step figures, ``DecodeLoop.learn``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mlxd_engine import Emitted, ForwardSample, RoundOutcome

from .request import RequestState


@dataclass
class DraftVerdicts:
    """The plan's verdicts on the drafts it weighed, which the update step applies to the drafters
    (``apply``): the plan only asks for proposals."""

    declined: list[tuple[RequestState, int, bool]] = field(default_factory=list)  # (row, output count, long match)
    verified: list[RequestState] = field(default_factory=list)  # drafts the plan verifies: the declines end
    proposed: list[RequestState] = field(default_factory=list)  # drafts kept past a lookahead read (rule 4)
    quiet: list[RequestState] = field(default_factory=list)  # drafting rows of a pipelined tick without a proposal

    def apply(self) -> None:
        """A declined draft is retracted (no miss) and its row paused from its output count at the plan;
        the pacing of every other row learns the tick (``mlxd_drafters.pacing``)."""
        for state, emitted, long_match in self.declined:
            state.drafter.retract_draft()
            state.drafter.pacing.declined(emitted, long_match)
        for state in self.verified:
            state.drafter.pacing.verified()
        for state in self.proposed:
            state.drafter.pacing.proposed()
        for state in self.quiet:
            state.drafter.pacing.quiet_tick()


@dataclass
class TickResult:
    """What one execute step produced, for the scheduler's update step to apply in order."""

    # a prefilled row's first token, with its trace detail (a prefix cache hit)
    first_tokens: list[tuple[RequestState, Emitted, str | None]] = field(default_factory=list)

    rounds: list[tuple[RequestState, RoundOutcome]] = field(default_factory=list)  # verify rounds
    emitted: list[tuple[RequestState, Emitted]] = field(default_factory=list)  # plain tokens, in order
    details: dict[RequestState, str] = field(default_factory=dict)  # trace detail of a plain row
    failed: list[tuple[RequestState, str]] = field(default_factory=list)
    explore_ms: float = 0.0  # what the plan's exploring rows are estimated to lose (the cost model's budget)
    declined: int = 0  # proposals the gate declined (the cost model's tick overheads)
    carried: dict[RequestState, list[int]] | None = None  # rule 4: proposals to settle after the read
    carried_forced: set[RequestState] = field(default_factory=set)  # carried proposals verified whatever they cost
    carried_from: dict[RequestState, int] = field(default_factory=dict)  # the row's token count its draft follows
    carried_steps: int = 1  # the most chained steps the scheduler allowed this tick
    verdicts: DraftVerdicts = field(default_factory=DraftVerdicts)  # the plan's, for the drafters

    # what the forwards cost, measured by the execute step and applied by the update step:
    forwards: list[ForwardSample] = field(default_factory=list)  # synchronous steps, verify rounds, in order
    waited_ms: float = 0.0  # waits on forwards no sample times (teardowns' reads, a failed step's recovery)
    pipelined_step_ms: float | None = None  # a pipelined tick's time per step (None: no step was read)
    steady_rows: int = 0  # > 0: that time is also a plain step of this many rows (the verify gate's price)

    def merge(self, other: TickResult) -> None:
        """Append ``other``'s tokens, failures, forwards and waits after this result's (one execute, two parts)."""
        self.emitted.extend(other.emitted)
        self.failed.extend(other.failed)
        self.forwards.extend(other.forwards)
        self.waited_ms += other.waited_ms
