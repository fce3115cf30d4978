"""The tick trace: what the scheduler did in each tick, for mlx-inspect-tick and for tests.

Contract: one ``TickRecord`` per tick that did any work; plain data (JSON- and msgpack-friendly via
``as_dict``). Row actions: "prefill" (a prompt chunk), "first-token" (prefill finished), "decode" (took
the batched step), "verify" (ran a verify round; with drafted/accepted), "declined-gate",
"declined-governor", and "finished" (with the reason).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class RowAction:
    request_id: str
    action: str
    drafted: int | None = None
    accepted: int | None = None
    detail: str | None = None


@dataclass
class TickRecord:
    tick: int
    batch: int  # decoding rows this tick
    pipelined: bool  # a lookahead step was in flight while this tick's step was read
    rows: list[RowAction] = field(default_factory=list)
    duration_ms: float = 0.0
    prefill_tokens: int = 0

    def add(self, request_id: str, action: str, **details) -> None:
        self.rows.append(RowAction(request_id, action, **details))

    def as_dict(self) -> dict:
        record = asdict(self)
        record["rows"] = [{k: v for k, v in row.items() if v is not None} for row in record["rows"]]
        return record
