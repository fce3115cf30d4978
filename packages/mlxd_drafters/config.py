"""Configuration for prompt-lookup speculative drafting.

Contract:
    * ``PromptLookupConfig`` is an immutable value object; every field is
      validated in ``__post_init__`` and an invalid combination raises
      ``ValueError`` naming the offending field.
    * Defaults are tuned for chat/code workloads where the output often
      copies spans from the prompt (quotes, code edits, JSON echoes).
    * ``with_max_draft(n)`` only ever lowers the draft cap, so a caller
      (e.g. the scheduler under memory pressure) can tighten a request's
      config without being able to exceed what the operator configured.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

KNOWN_POLICIES: tuple[str, ...] = ("graded", "gated", "always")


@dataclass(frozen=True)
class PromptLookupConfig:
    """Knobs for ``PromptLookupDrafter``, ``NgramIndex`` and ``DraftGovernor``.

    Attributes:
        max_draft: Largest number of tokens proposed per verify round. 15 by
            default: a lone row's verify forward is then 16 tokens (the
            widest a compiled step takes); beside other rows the server's
            verify gate cuts drafts to a narrower forward where that pays.
        min_ngram: Shortest suffix n-gram used for matching.
        max_ngram: Longest suffix n-gram used for matching; the index tries
            the longest first because longer matches predict better.
        policy: How the governor turns acceptance history into a budget:
            ``"always"`` (always ``max_draft``), ``"gated"`` (``max_draft``
            or 0) or ``"graded"`` (shrinks with acceptance, 0 below cutoff).
        governor_window: Number of most recent verify rounds the governor
            considers.
        gated_cutoff: Windowed acceptance rate (accepted / drafted) below
            which the ``"gated"`` policy stops drafting.
        graded_cutoff: Same threshold for the ``"graded"`` policy.
        probe_interval: While the governor has shut drafting off, every
            ``probe_interval``-th ``budget()`` call grants ``probe_draft``
            tokens. Without probes an off governor would never verify
            anything again, so its window could never show that
            acceptance recovered (e.g. the model started quoting the
            prompt later in the answer).
        probe_draft: Size of a probe budget (capped by ``max_draft``).
        min_draft: Smallest non-zero budget the ``"graded"`` policy grants.
    """

    max_draft: int = 15
    min_ngram: int = 1
    max_ngram: int = 4
    policy: str = "graded"
    governor_window: int = 8
    gated_cutoff: float = 0.2
    graded_cutoff: float = 0.2
    probe_interval: int = 16
    probe_draft: int = 2
    min_draft: int = 1

    def __post_init__(self) -> None:
        if self.policy not in KNOWN_POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}; known policies: {', '.join(KNOWN_POLICIES)}")
        _require(self.max_draft >= 1, "max_draft must be >= 1")
        _require(self.min_ngram >= 1, "min_ngram must be >= 1")
        _require(self.max_ngram >= self.min_ngram, "max_ngram must be >= min_ngram")
        _require(self.governor_window >= 1, "governor_window must be >= 1")
        _require(0.0 <= self.gated_cutoff <= 1.0, "gated_cutoff must be in [0, 1]")
        _require(0.0 <= self.graded_cutoff <= 1.0, "graded_cutoff must be in [0, 1]")
        _require(self.probe_interval >= 1, "probe_interval must be >= 1")
        _require(self.probe_draft >= 1, "probe_draft must be >= 1")
        _require(
            1 <= self.min_draft <= self.max_draft,
            "min_draft must be in [1, max_draft]",
        )

    @property
    def probe_budget(self) -> int:
        """Tokens granted by a probe round.

        Returns:
            ``min(probe_draft, max_draft)``.
        """
        return min(self.probe_draft, self.max_draft)

    def with_max_draft(self, max_draft: int) -> PromptLookupConfig:
        """Return a copy whose draft cap is at most ``max_draft``.

        Args:
            max_draft: Requested cap. Values above the current cap are
                clamped to it; ``min_draft`` is lowered too if needed.

        Returns:
            A new validated ``PromptLookupConfig``.

        Raises:
            ValueError: If ``max_draft`` is below 1.
        """
        if max_draft < 1:
            raise ValueError("max_draft must be >= 1")
        new_cap = min(max_draft, self.max_draft)
        return dataclasses.replace(self, max_draft=new_cap, min_draft=min(self.min_draft, new_cap))


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)
