"""Prompt-lookup drafter: proposes draft tokens by copying from the context.

Contract (one drafter per generation request, single-threaded):
    * ``prime(prompt)`` observes and indexes the whole prompt once at the
      start; ``observe(tokens)`` then appends whatever each step commits.
    * ``draft_block()`` returns a proposal (possibly empty) sized by the
      governor's budget and capped by ``config.max_draft``. A non-empty
      proposal stays *outstanding* until the caller resolves it with exactly
      one of:

      - ``accept_verified_tokens(n_drafted, n_accepted)``: the target model
        verified it; the governor learns from the outcome. The caller then
        calls ``observe()`` with the committed tokens.
      - ``retract_draft()``: it was never verified (e.g. the scheduler's
        gate declined); stats are rolled back and no miss is recorded. The
        retracted draft is then *scored* against the tokens ``observe()``
        commits next: its first token that differs is where a verify would
        have rejected it (greedy decode gives the very tokens a verify
        accepts; sampled decode draws them from the same distribution), so
        the governor records that outcome as it would a verified round's.
        A draft the gate keeps declining still teaches the governor what it
        would accept, and the gate's estimate follows the row's real
        acceptance instead of staying at its prior. A score still open when
        the next ``draft_block()`` runs is recorded as far as it got (the
        tokens matched so far, no rejection seen).

    * ``pipelines_plain_rounds()`` tells a caller whether the next round is
      unlikely to carry a proposal, so a lookahead plain decode step can be
      kept in flight.

Worked example::

    >>> drafter = PromptLookupDrafter(PromptLookupConfig(max_draft=3))
    >>> drafter.prime([5, 6, 7, 8, 9, 5, 6])
    >>> drafter.draft_block()            # suffix (5, 6) seen before
    [7, 8, 9]
    >>> drafter.accept_verified_tokens(n_drafted=3, n_accepted=2)
    >>> drafter.observe([7, 8, 0])       # 2 accepted + the model's own token
    >>> drafter.stats.accepted_per_verify
    2.0
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from mlxd_drafters.config import PromptLookupConfig
from mlxd_drafters.governor import DraftGovernor
from mlxd_drafters.ngram_index import NgramIndex
from mlxd_drafters.pacing import DraftPacing
from mlxd_drafters.prediction import PredictionSource
from mlxd_drafters.shared_store import SharedDraftStore

# Where a proposal came from (``PromptLookupDrafter.outstanding_source``; reported per source in timings).
SOURCE_PROMPT = "prompt"  # the request's own prompt
SOURCE_OUTPUT = "output"  # the request's own output so far
SOURCE_PREDICTION = "prediction"  # its predicted output
SOURCE_SHARED = "shared"  # the shared store: earlier requests' tokens (shared_store.py)
DRAFT_SOURCES = (SOURCE_PROMPT, SOURCE_OUTPUT, SOURCE_PREDICTION, SOURCE_SHARED)
# A store proposal counts as a long match (the gate's copy prior) only where at least this many earlier
# occurrences continued it with its first token: a continuation seen once is a copy in an agent loop and
# chance in a reply that shares a phrase (docs/benchmark_results/code_notes.md#store-support)
LONG_MATCH_SUPPORT = 2


@dataclass
class PromptLookupStats:
    """Counters describing one drafter's life.

    Attributes:
        proposals: Non-empty proposals handed out and not retracted.
        drafted_tokens: Tokens in those proposals (adjusted to what was
            actually verified when the caller verified fewer).
        accepted_tokens: Draft tokens the target model accepted.
        verify_rounds: Calls to ``accept_verified_tokens``.
        misses: Verify rounds that accepted nothing.
        retracted: Proposals withdrawn before verification.
        scored_rounds: Retracted proposals scored against the tokens that
            followed them (recorded by the governor as verify rounds are).
    """

    proposals: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    verify_rounds: int = 0
    misses: int = 0
    retracted: int = 0
    scored_rounds: int = 0

    @property
    def accepted_per_verify(self) -> float:
        """Mean accepted draft tokens per verify round (0.0 before any)."""
        if self.verify_rounds == 0:
            return 0.0
        return self.accepted_tokens / self.verify_rounds

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens (0.0 before any drafting)."""
        if self.drafted_tokens == 0:
            return 0.0
        return self.accepted_tokens / self.drafted_tokens

    def as_dict(self) -> dict[str, int | float]:
        """All counters plus the derived rates, for logs and metrics.

        Returns:
            A new flat dictionary.
        """
        summary: dict[str, int | float] = dataclasses.asdict(self)
        summary["accepted_per_verify"] = self.accepted_per_verify
        summary["acceptance_rate"] = self.acceptance_rate
        return summary


class PromptLookupDrafter:
    """Drafts by n-gram lookup in the request's own context.

    Sources, in order: the predicted output (when given), then the request's own context (prompt and
    output), then the shared store (``shared``: earlier requests' tokens) when the own context found no
    match or a shorter one than the store's: the longer match wins, a tie goes to the own context, unless
    the store's drafts have had rounds in this request and its draft is expected to have fewer tokens
    accepted than the own one (each source's governor).

    The store's drafts have a governor of their own (``shared_governor``): it sizes them and learns only
    from their rounds, and ``governor`` only from the request's own drafts. A store whose drafts this
    request keeps rejecting (a copy of a new text, whose phrases earlier replies share only by chance) then
    drafts little or nothing, while the request's own prompt lookup keeps its budget; and a request whose
    own lookups fail (a new record in a known layout) still drafts from the store.

    Args:
        config: Drafting configuration; defaults to ``PromptLookupConfig()``.
        prediction: A predicted output's tokens.
        shared: The shared store of the request's key (None: not consulted).
    """

    def __init__(
        self,
        config: PromptLookupConfig | None = None,
        prediction: list[int] | None = None,
        shared: SharedDraftStore | None = None,
    ) -> None:
        self._config = config if config is not None else PromptLookupConfig()
        self.shared = shared
        self._prompt_length = 0  # tokens given to prime(): an own match ending before this is the prompt's
        self._source: str | None = None  # where the outstanding proposal came from
        self._shared_match_length = 0  # the outstanding shared proposal's match
        self._shared_support = 0  # ... and the occurrences that continued it with its first token
        # a predicted output (OpenAI's ``prediction``): looked up first, the context after it
        self.prediction = (
            PredictionSource(prediction, self._config.min_ngram, self._config.max_ngram) if prediction else None
        )
        self._index = NgramIndex(self._config.min_ngram, self._config.max_ngram)
        # Observed tokens wait here until the index is next read: a row the verify gate holds back
        # observes every token it decodes and may never propose (docs/benchmark_results/code_notes.md#lazy-indexing).
        self._unindexed: list[int] = []
        self._governor = DraftGovernor(self._config)  # the request's own drafts (prompt, output, prediction)
        self._shared_governor = DraftGovernor(self._config)  # the shared store's
        self._granted_by: DraftGovernor | None = None  # the governor that granted the outstanding proposal
        self._last_budget = 0  # what the last draft_block() was granted by the governors it asked
        self._stats = PromptLookupStats()
        self._outstanding: list[int] | None = None
        self._scoring: list[int] | None = None  # a retracted draft, compared with the tokens that follow it
        self._scoring_governor = self._governor  # ... the governor that learns its score
        self._scored_matches = 0  # ... its tokens matched so far
        # when the scheduler's verify gate asks this drafter again after declining it (pacing.py)
        self.pacing = DraftPacing()

    @property
    def config(self) -> PromptLookupConfig:
        """The configuration in use."""
        return self._config

    @property
    def stats(self) -> PromptLookupStats:
        """Live counters (mutated in place by the drafter)."""
        return self._stats

    @property
    def governor(self) -> DraftGovernor:
        """The governor of the request's own drafts (exposed for inspection and metrics)."""
        return self._governor

    @property
    def shared_governor(self) -> DraftGovernor:
        """The governor of the shared store's drafts."""
        return self._shared_governor

    @property
    def last_budget(self) -> int:
        """The budget the last ``draft_block()`` was granted (0: no governor it asked granted any)."""
        return self._last_budget

    @property
    def proposal_is_probe(self) -> bool:
        """Whether the outstanding proposal is a probe of a governor that turned off."""
        return self._outstanding is not None and self._granting_governor().probe_granted

    def acceptance_estimate(self) -> float:
        """Per-token acceptance expected of the outstanding proposal (its source's governor, a long match's
        prior where it continues one: ``DraftGovernor.acceptance_estimate``)."""
        return self._granting_governor().acceptance_estimate(self.last_match_is_long)

    def expected_accepted(self, n_drafted: int) -> float:
        """Draft tokens a verify round of the outstanding proposal's first ``n_drafted`` is expected to accept."""
        return self._granting_governor().expected_accepted(n_drafted, self.last_match_is_long)

    def _granting_governor(self) -> DraftGovernor:
        return self._granted_by if self._granted_by is not None else self._governor

    @property
    def index(self) -> NgramIndex:
        """The n-gram index over the observed context."""
        return self._indexed()

    @property
    def context_length(self) -> int:
        """Number of tokens observed so far."""
        return len(self._index) + len(self._unindexed)

    @property
    def last_match_is_long(self) -> bool:
        """Whether the outstanding context proposal continues a match of ``max_ngram`` tokens (a copy, more
        often than not; a prediction's proposal counts as one, a store's only with ``LONG_MATCH_SUPPORT``
        earlier occurrences behind its first token)."""
        if self.proposal_from_prediction:
            return True
        if self._source == SOURCE_SHARED:
            return self._is_long_store_match(self._shared_match_length, self._shared_support)
        return self._index.last_match_length >= self._config.max_ngram

    @property
    def outstanding_source(self) -> str | None:
        """Where the outstanding proposal came from (``DRAFT_SOURCES``), or None when none is outstanding."""
        return self._source if self._outstanding is not None else None

    @property
    def proposal_from_prediction(self) -> bool:
        """Whether the outstanding proposal came from the request's predicted output."""
        return self.prediction is not None and self.prediction.last_proposal_from_prediction

    @property
    def outstanding_draft(self) -> list[int] | None:
        """Copy of the unresolved proposal, or None."""
        return None if self._outstanding is None else list(self._outstanding)

    def observe(self, tokens: Iterable[int]) -> None:
        """Append committed tokens to the context.

        Args:
            tokens: Prompt tokens, or tokens committed by a decode step.
        """
        if self._scoring is not None:
            tokens = list(tokens)  # read twice: scored, then kept
            self._score(tokens)
        self._unindexed.extend(tokens)

    def prime(self, prompt: Iterable[int]) -> None:
        """Observe the request's whole prompt (prefilled or taken from a prefix cache alike) and index it
        now: the scheduler calls this when prefill completes, so the prompt's indexing is not paid inside
        the first decode tick, whose cost the verify gate measures."""
        self.observe(prompt)
        self._prompt_length = len(self._indexed())

    def _score(self, tokens: list[int]) -> None:
        """Compare a retracted draft with the committed tokens that follow it; at its first mismatch (or
        its end) the governor records the round a verify would have run."""
        draft = self._scoring
        assert draft is not None  # called only while a score is open
        for token in tokens:
            if token != draft[self._scored_matches]:
                self._record_score(self._scored_matches + 1, self._scored_matches)
                return
            self._scored_matches += 1
            if self._scored_matches == len(draft):
                self._record_score(len(draft), len(draft))
                return

    def _settle_score(self) -> None:
        """A score still open: what matched so far is a round that saw no rejection."""
        if self._scoring is not None:
            if self._scored_matches:
                self._record_score(self._scored_matches, self._scored_matches)
            self._scoring = None

    def _record_score(self, n_drafted: int, n_accepted: int) -> None:
        self._scoring = None
        self._stats.scored_rounds += 1
        self._scoring_governor.record(n_drafted, n_accepted)

    def _indexed(self) -> NgramIndex:
        """The index, with every observed token in it."""
        if self._unindexed:
            self._index.extend(self._unindexed)
            self._unindexed.clear()
        return self._index

    def draft_block(self) -> list[int]:
        """Propose draft tokens for the next verify round.

        A still-outstanding earlier proposal is retracted first, since the
        caller evidently did not verify it.

        Returns:
            Up to ``min(budget, max_draft)`` tokens; empty when the
            governor grants nothing or the context has no match.
        """
        if self._outstanding is not None:
            self.retract_draft()
        self._settle_score()
        self._granted_by = None
        budget = self._last_budget = min(self._governor.budget(), self._config.max_draft)
        index = self._indexed()
        proposal: list[int] = []
        if budget > 0:
            self._granted_by = self._governor
            if self.prediction is not None:
                proposal = self.prediction.propose(index.tokens[-self._config.max_ngram :], budget)
                self._source = SOURCE_PREDICTION
            if not proposal:
                proposal = index.propose(budget)
                self._source = SOURCE_PROMPT if index.last_match_end < self._prompt_length else SOURCE_OUTPUT
        if self.shared is not None and not (proposal and self._source == SOURCE_PREDICTION):
            proposal = self._shared_or(proposal, index.last_match_length if proposal else 0, index)
        if proposal:
            self._stats.proposals += 1
            self._stats.drafted_tokens += len(proposal)
            self._outstanding = proposal
        else:
            self._granted_by = None
        # The index builds a fresh list per call, but the caller still
        # gets its own copy so mutating it cannot skew our accounting.
        return list(proposal)

    def _is_long_store_match(self, match_length: int, support: int) -> bool:
        """Whether a store draft counts as a long match (``last_match_is_long``): the drafter's longest n-gram
        matched, and at least ``LONG_MATCH_SUPPORT`` earlier occurrences continued it with its first token."""
        return match_length >= self._config.max_ngram and support >= LONG_MATCH_SUPPORT

    def _shared_or(self, own: list[int], own_length: int, index: NgramIndex) -> list[int]:
        """The store's draft where it matched more of the context than the own proposal did (``own``, from a
        match of ``own_length`` tokens) and is granted by the store's governor, unless the store's drafts have
        had rounds in this request and its draft is expected to have fewer tokens accepted than ``own`` (each as
        its governor expects: a store draft that replaced a better own one, and was then declined by the gate,
        cost the row its own verify;
        docs/benchmark_results/code_notes.md#source-choice); else ``own``. The store's governor counts a call
        (its probe spacing) only where the store has a match to offer."""
        assert self.shared is not None
        if own_length >= self.shared.config.max_ngram:
            return own
        shared = self.shared.lookup(index.tokens[-self.shared.config.max_ngram :], self._config.max_draft)
        if not shared.tokens or shared.match_length <= own_length:
            return own
        budget = min(self._shared_governor.budget(), self._config.max_draft)
        if budget <= 0:
            return own
        if own:
            shared_long = self._is_long_store_match(shared.match_length, shared.support)
            expected = self._shared_governor.expected_accepted(min(budget, len(shared.tokens)), shared_long)
            own_long = own_length >= self._config.max_ngram
            if self._shared_governor.rounds_recorded and expected < self._governor.expected_accepted(
                len(own), own_long
            ):
                self._shared_governor.return_probe()  # a probe it granted goes unused
                return own
            self._governor.return_probe()  # a probe it granted goes unused
        self._source = SOURCE_SHARED
        self._shared_match_length, self._shared_support = shared.match_length, shared.support
        self._granted_by = self._shared_governor
        self._last_budget = budget
        return list(shared.tokens[:budget])  # the walk is greedy: a shorter budget's draft is this one's start

    def retract_draft(self) -> None:
        """Withdraw the outstanding proposal because it was not verified.

        Rolls back its ``proposals``/``drafted_tokens`` counts and counts it
        in ``retracted``. Records no miss; a probe budget it used goes back to
        the governor (``return_probe``), so the probe is offered again. The
        draft is scored against the tokens observed next (module docstring).
        No-op when nothing is outstanding.
        """
        if self._outstanding is None:
            return
        governor = self._granting_governor()
        governor.return_probe()
        if self.prediction is not None:
            self.prediction.last_proposal_from_prediction = False
        self._stats.proposals -= 1
        self._stats.drafted_tokens -= len(self._outstanding)
        self._stats.retracted += 1
        self._scoring, self._scored_matches, self._scoring_governor = self._outstanding, 0, governor
        self._outstanding = None
        self._granted_by = None

    def accept_verified_tokens(self, n_drafted: int, n_accepted: int) -> None:
        """Record the outcome of one verify round.

        Args:
            n_drafted: Draft tokens the target model verified. If it differs
                from the outstanding proposal's length (the caller trimmed
                it), ``drafted_tokens`` is corrected to this number.
            n_accepted: Of those, how many were accepted.

        Raises:
            ValueError: If the counts are negative or accepted > drafted.
        """
        if n_drafted < 0 or not 0 <= n_accepted <= n_drafted:
            raise ValueError(f"need 0 <= n_accepted <= n_drafted, got n_drafted={n_drafted}, n_accepted={n_accepted}")
        outstanding_length = len(self._outstanding) if self._outstanding else 0
        self._stats.drafted_tokens += n_drafted - outstanding_length
        self._stats.verify_rounds += 1
        self._stats.accepted_tokens += n_accepted
        if n_accepted == 0:
            self._stats.misses += 1
        self._granting_governor().record(n_drafted, n_accepted)
        if self.prediction is not None:
            self.prediction.record(n_accepted)
        self._outstanding = None
        self._granted_by = None

    def pipelines_plain_rounds(self) -> bool:
        """Whether the caller may keep a lookahead plain decode in flight.

        Rule: False when the own governor would grant a budget on its next
        call (probes included) AND the index has an earlier match for the
        current suffix, or the store's governor would AND the store would draft
        a token there, i.e. ``draft_block()`` would likely return a proposal;
        True otherwise. None of the checks changes any state or statistic.

        The caller should still call ``draft_block()`` every round: probe
        spacing counts ``budget()`` calls, so skipping ``draft_block()``
        whenever this returns True would leave an off governor off forever.

        Returns:
            True if the next round is unlikely to carry a proposal.
        """
        if self.prediction is not None and self._governor.peek_budget() > 0:
            return False  # a predicted reply is expected to match nearly everywhere
        index = self._indexed()
        if self._governor.peek_budget() > 0 and index.has_match():
            return False
        return (
            self.shared is None
            or self._shared_governor.peek_budget() <= 0
            or not self.shared.would_draft(index.tokens[-self.shared.config.max_ngram :])
        )
