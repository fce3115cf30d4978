"""The tick trace: what the scheduler did in each tick, for mlx-inspect-tick and for tests.

Contract: one ``TickRecord`` per tick that did any work; plain data (JSON- and msgpack-friendly via
``as_dict``). Row actions: "prefill" (a prompt chunk), "first-token" (prefill finished), "prime" (a lookahead step was
submitted, nothing read yet), "decode" (took the batched step; ``detail`` says "declined-gate" or
"declined-governor" when a prompt-lookup row was held back), "verify" (ran a verify round; with
drafted/accepted), and "finished" (with the reason in ``detail``).
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
