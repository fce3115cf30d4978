"""Speculative dispatch: turn ``--draft-kind`` / ``--draft-model`` / ``--draft-block-size`` into one value.

Contract: ``resolve_speculative`` is the only place these options are interpreted. It returns a
``SpeculativeDispatch``: disabled, or prompt lookup with its ``PromptLookupConfig`` (every field the
documented default except ``max_draft`` when ``--draft-block-size`` is given). Bad combinations raise
ValueError with a message for the user.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlxd_drafters import PromptLookupConfig

KNOWN_DRAFT_KINDS = ("prompt-lookup", "none")


@dataclass(frozen=True)
class SpeculativeDispatch:
    kind: str  # "disabled" or "prompt-lookup"
    config: PromptLookupConfig | None  # the daemon's default for every request (None when disabled)
    cap: PromptLookupConfig  # what a request that opts in gets; requests may lower max_draft, never raise it

    @property
    def enabled(self) -> bool:
        return self.config is not None

    def summary(self) -> str:
        if self.config is None:
            return f"speculative=off (per-request prompt-lookup max_draft={self.cap.max_draft})"
        return f"speculative=prompt-lookup (max_draft={self.config.max_draft}, policy={self.config.policy})"


def resolve_speculative(
    draft_kind: str | None, draft_model: str | None = None, draft_block_size: int | None = None
) -> SpeculativeDispatch:
    """Resolve the daemon's speculative options.

    Args:
        draft_kind: "prompt-lookup", "none" or None (off).
        draft_model: a draft model path; no supported kind takes one yet.
        draft_block_size: max_draft for prompt lookup (>= 1).
    Returns:
        The dispatch value.
    Raises:
        ValueError: unknown kind (the message lists the known ones), a draft model given to prompt
            lookup, or a block size below 1.
    """
    if draft_block_size is not None and draft_block_size < 1:
        raise ValueError("--draft-block-size must be at least 1")
    cap = PromptLookupConfig(max_draft=draft_block_size) if draft_block_size else PromptLookupConfig()
    kind = (draft_kind or "none").strip().lower()
    if kind not in KNOWN_DRAFT_KINDS:
        raise ValueError(f"unknown draft kind {draft_kind!r}; known kinds: {', '.join(KNOWN_DRAFT_KINDS)}")
    if kind == "prompt-lookup":
        if draft_model:
            raise ValueError("prompt-lookup takes no draft model")
        return SpeculativeDispatch("prompt-lookup", cap, cap)
    if draft_model:
        raise ValueError(
            "--draft-model needs a draft kind that uses a draft model; the known kinds "
            f"({', '.join(KNOWN_DRAFT_KINDS)}) take none"
        )
    return SpeculativeDispatch("disabled", None, cap)
