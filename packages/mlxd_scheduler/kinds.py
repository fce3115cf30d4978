"""The scheduler's kinds as string enums: a request's phase, a tick plan's mode and verify layout, and the
actions of the tick trace. Each member equals its wire string ("decode" == Phase.DECODE), so the trace and
replies carry the same text as before.
"""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    """A request's phase: waiting → prefill → decode → finished."""

    WAITING = "waiting"
    PREFILL = "prefill"
    DECODE = "decode"
    FINISHED = "finished"


class PlanMode(StrEnum):
    """What a decode tick does (tick_plan.py's docstring)."""

    PIPELINED = "pipelined"
    READ = "read"
    SYNCHRONOUS = "synchronous"


class VerifyLayout(StrEnum):
    """How a synchronous tick's verify rows run beside the others."""

    BESIDE = "beside"  # one verify forward for them, one batched step for the rest
    PADDED = "padded"  # one forward for every row, each padded to the widest


class RowKind(StrEnum):
    """A row's action in the tick trace (trace.py's docstring)."""

    PREFILL = "prefill"
    FIRST_TOKEN = "first-token"
    PRIME = "prime"
    DECODE = "decode"
    VERIFY = "verify"
    FINISHED = "finished"
