"""What the scheduler keeps per request, and the events it reports.

Contract: a ``Request`` is everything a client asked for, already tokenized at the edge (prompt token
ids, sampling parameters, limits, stop strings with a ``TextStream`` built from the tokenizer). The
scheduler owns a ``RequestState`` per admitted request: its engine sequence, its phase, its drafter
(when prompt lookup runs) and its timings. It reports ``TokenEvent`` (new tokens and the text safe to
show) and ``FinishEvent`` (finish reason, usage, timings) through the callback given at submission.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mlxd_engine import SamplingParams, Sequence

from .kinds import Phase
from .text_stream import TextStream


@dataclass
class SpeculativeRequest:
    """Per-request speculative settings: ``enabled`` None means the daemon's default."""

    enabled: bool | None = None
    max_draft: int | None = None


@dataclass
class Request:
    request_id: str
    prompt: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = 256
    text: TextStream | None = None  # None: no text (token ids only), no stop strings
    speculative: SpeculativeRequest = field(default_factory=SpeculativeRequest)
    ignore_eos: bool = False
    prediction: list[int] | None = None  # a predicted output's tokens: prompt lookup drafts from them first
    cache_prompt: bool = (
        True  # reuse a cached prefix of the prompt, and leave this one in the cache (llama-server's name)
    )
    # draft from the shared store of earlier requests' tokens, and add this one's when done (False: neither)
    shared_drafts: bool = True
    draft_key: str | None = None  # whose shared store: an API key's id (None: the store of a server without keys)
    # context shift (context_shift.py, when the scheduler runs with it): how many leading tokens a shift
    # keeps and how many after them it drops (0: half)
    context_keep: int = 0
    context_discard: int = 0


@dataclass
class TokenEvent:
    request_id: str
    tokens: list[int]
    text: str
    logprobs: list[dict] | None = None


@dataclass
class FinishEvent:
    request_id: str
    finish_reason: str  # "stop", "length", "cancelled", "error"
    tokens: list[int]
    text: str
    usage: dict[str, int]
    timings: dict[str, Any]
    error: str | None = None
    truncated: bool = False  # the row's context was shifted at least once (context_shift.py)


Event = TokenEvent | FinishEvent
EventSink = Callable[[Event], None]


@dataclass
class Timings:
    """Per-request clock readings (perf_counter seconds) and counts, reported with llama-server names."""

    queued: float = field(default_factory=time.perf_counter)
    prefill_started: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    draft_n: int = 0
    draft_n_accepted: int = 0
    draft_verify_n: int = 0
    speculated: bool = False
    # per draft source (mlxd_drafters.DRAFT_SOURCES): [drafted, accepted] in verify rounds
    draft_sources: dict[str, list[int]] = field(default_factory=dict)

    def count_source(self, source: str | None, drafted: int, accepted: int) -> None:
        """One verify round's counts, under the source its draft came from."""
        counts = self.draft_sources.setdefault(source or "output", [0, 0])
        counts[0] += drafted
        counts[1] += accepted

    def report(self, prompt_n: int, predicted_n: int, cache_n: int = 0) -> dict[str, Any]:
        """llama-server's timings: ``prompt_n`` prompt tokens prefilled, ``cache_n`` taken from the prefix cache."""
        start = self.prefill_started or self.queued
        prompt_ms = ((self.first_token or start) - start) * 1000.0
        predicted_ms = ((self.last_token or 0.0) - (self.first_token or 0.0)) * 1000.0 if predicted_n > 1 else 0.0
        decoded = max(predicted_n - 1, 0)  # the first token comes from prefill
        # unrounded, as llama-server sends them: a client may recompute a rate from its parts
        report: dict[str, Any] = {
            "cache_n": cache_n,
            "prompt_n": prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": 1e3 / prompt_ms * prompt_n if prompt_ms > 0 else 0.0,
            "predicted_n": predicted_n,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / decoded if decoded else 0.0,
            "predicted_per_second": 1e3 / predicted_ms * decoded if predicted_ms > 0 else 0.0,
            "queue_ms": (start - self.queued) * 1000.0,
        }
        if self.speculated:
            report.update(
                draft_kind="prompt-lookup",
                draft_n=self.draft_n,
                draft_n_accepted=self.draft_n_accepted,
                draft_verify_n=self.draft_verify_n,
                draft_sources={
                    source: {"draft_n": counts[0], "draft_n_accepted": counts[1]}
                    for source, counts in sorted(self.draft_sources.items())
                },
            )
        return report


@dataclass(eq=False)  # identity: states are dict keys and list members, never compared by value
class RequestState:
    """A request inside the scheduler."""

    request: Request
    sink: EventSink
    # None until the scheduler admits the request (_admit); the scheduler reads it only past "waiting", so it
    # is typed as set (finishing, which also sees requests that never ran, checks for None)
    seq: Sequence = None  # type: ignore[assignment]
    phase: Phase = Phase.WAITING
    timings: Timings = field(default_factory=Timings)
    drafter: Any = None  # PromptLookupDrafter when prompt lookup runs for this request
    cancel_requested: bool = False
    finish_reason: str | None = None
    emitted: int = 0  # output tokens reported so far
    # context shift (context_shift.py): output given before the latest shift, which ``seq`` no longer holds
    # as output, and how many shifts the row made
    shifted_output: list[int] = field(default_factory=list)
    context_shifts: int = 0

    def output_tokens(self) -> list[int]:
        """Every output token reported so far, across context shifts."""
        own = list(self.seq.output) if self.seq is not None else []
        return (self.shifted_output + own)[: self.emitted]

    @property
    def request_id(self) -> str:
        return self.request.request_id
