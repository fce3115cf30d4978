"""Whether a request may use prompt-lookup speculation, and if not, why.

Contract: one predicate for every caller. Prompt lookup needs (1) text-only input, so the drafter's
n-gram index sees every token the model saw; (2) structured output is no obstacle: the verify round cuts a
draft at the first token the grammar forbids and masks every position (``sampling/grammar.py``); (3) no logprobs,
which the verify round does not report per position; (4) a sampler chain whose per-position state the round
can replay (mlx-lm's penalties, biases and filters can: position i sees history + proposal[:i]; opaque in-process
processors cannot be known to); (5) storage that can unwind speculative appends (by a counter move, or for recurrent
state by a restore and replay: ``storage/row_storage.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .sampling.chain import SamplingParams


@dataclass(frozen=True)
class Eligibility:
    eligible: bool
    reason: str | None = None  # why not, for logs and traces

    def __bool__(self) -> bool:
        return self.eligible


def prompt_lookup_eligibility(
    params: SamplingParams,
    *,
    has_images: bool = False,
    storage_can_unwind: bool,
) -> Eligibility:
    """Decide whether prompt lookup may run for a request.

    Args:
        params: the request's sampling parameters.
        has_images: the request carries non-text input.
        storage_can_unwind: the KV storage of its sequence can unwind appends (``Engine.can_unwind``;
            required: no caller may assume it).
    Returns:
        Eligibility(True) or Eligibility(False, reason).
    """
    if has_images:
        return Eligibility(False, "non-text input: the drafter only sees text tokens")
    if params.logprobs is not None:
        return Eligibility(False, "logprobs requested: the verify round does not report them")
    if params.custom_processors:
        return Eligibility(False, "custom logits processors: their per-position state cannot be replayed")
    if not storage_can_unwind:
        return Eligibility(False, "KV storage cannot unwind speculative appends")
    return Eligibility(True)
