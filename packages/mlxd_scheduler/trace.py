"""The tick trace: what the scheduler did in each tick, for mlx-inspect-tick and for tests.

Contract: one ``TickRecord`` per tick that did any work; plain data (JSON- and msgpack-friendly via
``as_dict``). Row actions: "prefill" (a prompt chunk), "first-token" (prefill finished; a request that
asked for prompt lookup and may not have it says why in ``detail``: "prompt lookup off: <reason>"),
"prime" (a lookahead step was submitted, nothing read yet), "decode" (took the batched step; ``tokens``
counts them when a tick of several steps gave the row more than one; ``detail`` says "declined-gate",
"declined-governor" or "declined-cost" when a prompt-lookup row was held back: by the batch bound, its
governor, or the verify gate's cost estimate), "verify" (ran a verify round; with
drafted/accepted, and the draft's source in ``detail``: "prompt", "output", "prediction" or "shared"),
and "finished" (with the reason in ``detail``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .kinds import RowKind


@dataclass
class RowAction:
    request_id: str
    action: str
    drafted: int | None = None
    accepted: int | None = None
    detail: str | None = None
    tokens: int | None = None  # decode: tokens this tick, when more than one

    def __post_init__(self) -> None:
        self.action = str(self.action)  # a RowKind arrives as its plain string: the wire codec takes no subclass


@dataclass
class TickRecord:
    tick: int
    batch: int  # decoding rows this tick
    pipelined: bool  # a lookahead step was in flight while this tick's step was read
    rows: list[RowAction] = field(default_factory=list)
    duration_ms: float = 0.0
    prefill_tokens: int = 0
    steps: int = 1  # chained decode steps this tick submitted (its rows' tokens come from the previous tick's)
    _decoding: dict = field(default_factory=dict, repr=False)  # (request id, detail) -> its decode action

    def add(self, request_id: str, action: str, **details) -> None:
        self.rows.append(RowAction(request_id, action, **details))

    def add_decode(self, request_id: str, detail: str | None = None, count: int = 1) -> None:
        """``count`` decoded tokens of a row: the row's decode action for this tick counts them."""
        row = self._decoding.get((request_id, detail))
        if row is None:
            row = self._decoding[(request_id, detail)] = RowAction(request_id, RowKind.DECODE, detail=detail)
            self.rows.append(row)
            count -= 1
        if count:
            row.tokens = (row.tokens or 1) + count

    def as_dict(self) -> dict:
        record = asdict(self)
        del record["_decoding"]
        record["rows"] = [{k: v for k, v in row.items() if v is not None} for row in record["rows"]]
        return record
