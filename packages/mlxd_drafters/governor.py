"""Draft-budget governor: turns recent verify outcomes into a draft size.

Contract:
    * ``record(n_drafted, n_accepted)`` is called once per verify round, and
      once per declined draft the drafter scored against the tokens that
      followed it (the round a verify would have run); only the last
      ``config.governor_window`` rounds are kept.
    * ``budget()`` returns how many tokens the next proposal may have
      (0 = do not draft). It is cheap and advances only the probe counter.
      ``peek_budget()`` returns the same value without advancing anything.
    * Until ``min(4, governor_window)`` rounds were recorded every policy
      grants ``max_draft``: too little data to justify shutting off.
    * Policies (rate = accepted / drafted summed over the window):

      - ``"always"``: always ``max_draft``.
      - ``"gated"``: 0 if rate < ``gated_cutoff``, else ``max_draft``.
      - ``"graded"``: 0 if rate < ``graded_cutoff``; otherwise sized by the
        expected accepted run length (see ``DraftGovernor``).

    * While a gated/graded governor is off, every ``probe_interval``-th
      ``budget()`` call returns ``config.probe_budget`` so new verify rounds
      keep arriving; once they lift the windowed rate above the cutoff the
      normal budget is restored. ``return_probe()`` gives back a probe that
      was never verified (its proposal was retracted), so the next
      ``budget()`` call grants it again instead of waiting a whole interval.
    * ``expected_accepted(n)``: the draft tokens a round of ``n`` is expected to
      accept (the verify gate weighs it against the round's cost).
"""

from __future__ import annotations

from collections import deque

from mlxd_drafters.config import PromptLookupConfig

ROUNDS_BEFORE_JUDGING = 4
# acceptance_estimate's prior: p = 2/3 (docs/benchmark_results/code_notes.md#acceptance-prior)
PRIOR_ACCEPTED, PRIOR_REJECTED = 2.0, 1.0
LONG_MATCH_PRIOR = (9.0, 1.0)  # ... for a proposal continuing a longest-n-gram match: p = 0.9


class DraftGovernor:
    """Windowed acceptance tracker that sizes each draft.

    Graded sizing rule: model acceptance as independent per-token trials
    with probability ``p``. A round that accepted ``a`` of ``d`` drafted
    tokens shows ``a`` successes and, if ``a < d``, one failure (a fully
    accepted round is censored: it shows no failure). The maximum-likelihood
    estimate is ``p = successes / (successes + failures)``, which unlike
    accepted/drafted is not biased down by long drafts. The expected run of
    accepted tokens is ``p / (1 - p)`` = successes / failures; the budget
    is that run rounded up, plus one (the token expected to be rejected
    still costs little), clamped to ``[min_draft, max_draft]``. No
    failures in the window gives ``max_draft``.

    Args:
        config: Supplies policy, window, cutoffs and probe settings.
    """

    def __init__(self, config: PromptLookupConfig) -> None:
        self._config = config
        self._rounds: deque[tuple[int, int]] = deque(maxlen=config.governor_window)
        self._calls_while_off = 0
        self._probe_granted = False  # the last budget() call granted a probe

    @property
    def config(self) -> PromptLookupConfig:
        """The configuration this governor applies."""
        return self._config

    @property
    def rounds_recorded(self) -> int:
        """Number of verify rounds currently in the window."""
        return len(self._rounds)

    @property
    def history(self) -> tuple[tuple[int, int], ...]:
        """Windowed ``(n_drafted, n_accepted)`` pairs, oldest first."""
        return tuple(self._rounds)

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / drafted over the window, or None with no data."""
        drafted = sum(d for d, _ in self._rounds)
        if drafted == 0:
            return None
        return sum(a for _, a in self._rounds) / drafted

    @property
    def probe_granted(self) -> bool:
        """Whether the last ``budget()`` call granted a probe that is not yet verified or given back."""
        return self._probe_granted

    @property
    def is_off(self) -> bool:
        """True while the policy grants no regular (non-probe) budget."""
        return self._regular_budget() == 0

    def acceptance_estimate(self, long_match: bool = False) -> float:
        """Per-token acceptance ``p`` as the graded rule estimates it (successes / (successes + failures)
        over the window), with a prior of ``PRIOR_ACCEPTED`` accepted tokens and ``PRIOR_REJECTED``
        rejections (p = 2/3 before any round), or ``LONG_MATCH_PRIOR`` for a proposal that continues a
        match of the drafter's longest n-gram (p = 0.9 before any round: such a match is a copy more often
        than not; docs/benchmark_results/code_notes.md#acceptance-prior)."""
        accepted, rejected = LONG_MATCH_PRIOR if long_match else (PRIOR_ACCEPTED, PRIOR_REJECTED)
        successes = sum(a for _, a in self._rounds) + accepted
        failures = sum(1 for d, a in self._rounds if a < d) + rejected
        return successes / (successes + failures)

    def expected_accepted(self, n_drafted: int, long_match: bool = False) -> float:
        """Draft tokens a verify round of ``n_drafted`` is expected to accept: p + p^2 + ... + p^n
        (acceptance stops at the first rejection)."""
        p = self.acceptance_estimate(long_match)
        return p * (1.0 - p**n_drafted) / (1.0 - p)  # p < 1: the prior keeps a rejection in

    def record(self, n_drafted: int, n_accepted: int) -> None:
        """Add the outcome of one verify round to the window.

        Args:
            n_drafted: Draft tokens that were verified. A round with 0
                drafted tokens carries no information and is ignored.
            n_accepted: How many of them the target model accepted.

        Raises:
            ValueError: If the counts are negative or accepted > drafted.
        """
        if n_drafted < 0 or not 0 <= n_accepted <= n_drafted:
            raise ValueError(f"need 0 <= n_accepted <= n_drafted, got n_drafted={n_drafted}, n_accepted={n_accepted}")
        self._probe_granted = False  # a verified probe is spent
        if n_drafted > 0:
            self._rounds.append((n_drafted, n_accepted))

    def budget(self) -> int:
        """Draft size for the next proposal; counts toward probe spacing.

        Returns:
            Tokens allowed, 0 meaning "do not draft this round".
        """
        regular = self._regular_budget()
        if regular > 0:
            self._calls_while_off = 0
            self._probe_granted = False
            return regular
        self._calls_while_off += 1
        granted = self._probe_or_zero(self._calls_while_off)
        self._probe_granted = granted > 0
        return granted

    def return_probe(self) -> None:
        """Undo the last ``budget()`` call if it granted a probe that was not verified."""
        if self._probe_granted:
            self._calls_while_off -= 1
            self._probe_granted = False

    def peek_budget(self) -> int:
        """What the next ``budget()`` call would return, with no side effect.

        Returns:
            Tokens the next ``budget()`` call would allow.
        """
        regular = self._regular_budget()
        if regular > 0:
            return regular
        return self._probe_or_zero(self._calls_while_off + 1)

    def reset(self) -> None:
        """Forget all history (e.g. when a new request reuses the object)."""
        self._rounds.clear()
        self._calls_while_off = 0
        self._probe_granted = False

    def _probe_or_zero(self, call_number: int) -> int:
        if call_number % self._config.probe_interval == 0:
            return self._config.probe_budget
        return 0

    def _regular_budget(self) -> int:
        config = self._config
        if config.policy == "always":
            return config.max_draft
        if len(self._rounds) < min(ROUNDS_BEFORE_JUDGING, config.governor_window):
            return config.max_draft
        rate = self.acceptance_rate
        if rate is None:
            return config.max_draft
        if config.policy == "gated":
            return 0 if rate < config.gated_cutoff else config.max_draft
        if rate < config.graded_cutoff:
            return 0
        return self._graded_budget()

    def _graded_budget(self) -> int:
        config = self._config
        successes = sum(a for _, a in self._rounds)
        failures = sum(1 for d, a in self._rounds if a < d)
        if failures == 0:
            return config.max_draft
        # p / (1 - p) simplifies to successes / failures; integer ceiling
        # avoids float round-off pushing an exact run length up by one.
        expected_run_ceil = -(-successes // failures)
        size = expected_run_ceil + 1
        return max(config.min_draft, min(config.max_draft, size))
