"""When a prompt-lookup row asks its drafter again: the verify gate's pacing of one row (rule 5 of
the scheduler's ``prompt_lookup_arm.py``), kept by the row's drafter (``PromptLookupDrafter.pacing``).

Contract (``emitted``: the row's output tokens so far):
- ``may_propose(emitted)``: whether the row's drafter is asked this tick (a declined row pauses).
- ``declined(emitted, long_match)``: the gate turned the row's draft down; it pauses for the next of
  ``DECLINE_PAUSE_TOKENS``, or ``LONG_MATCH_DECLINE_PAUSE`` where the draft continued a longest-n-gram match.
- ``verified()``: a draft of the row was verified; the declines running are over.
- ``worth_a_look(emitted)``: the gate has declined the row's drafts for ``EXPLORE_AFTER_DECLINED_TOKENS``
  output tokens running (the arm then verifies its next draft at a loss, within the exploration budget).
- ``quiet_ticks``: pipelined ticks in a row without a proposal from the row (``quiet_tick()`` adds one,
  ``proposed()`` resets them): the chained steps of a pipelined tick back off by them
  (the scheduler's ``tick_plan.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

# A row whose draft the gate declined drafts again only after 8, 16, then 32 more tokens (asking every
# row's drafter every tick costs a small model's ticks: docs/benchmark_results/code_notes.md#decline-pause) ...
DECLINE_PAUSE_TOKENS = (8, 16, 32)
# ... but a declined draft that continues a long match (a copy, more often than not) is asked for again
# on the next token: copying rows that pause apart rarely propose in the same tick, where verifying them
# together pays and one of them alone beside plain rows does not (docs/benchmark_results/code_notes.md#decline-pause).
LONG_MATCH_DECLINE_PAUSE = 1
# A row whose drafts the gate has declined for this many output tokens running is worth a look at a loss
# (the scheduler's prompt_lookup_arm.ExplorationBudget): the fifth proposal of a row paused 8, 16, 32 and 32 tokens.
EXPLORE_AFTER_DECLINED_TOKENS = 88


@dataclass
class DraftPacing:
    quiet_ticks: int = 0
    declines: int = 0  # drafts in a row the gate declined
    declined_since: int = 0  # the output count at the first of those declines
    drafts_from: int = 0  # the output count at which the row drafts again

    def may_propose(self, emitted: int) -> bool:
        return emitted >= self.drafts_from

    def declined(self, emitted: int, long_match: bool) -> None:
        if not self.declines:
            self.declined_since = emitted
        self.declines += 1
        pause = (
            LONG_MATCH_DECLINE_PAUSE
            if long_match
            else DECLINE_PAUSE_TOKENS[min(self.declines, len(DECLINE_PAUSE_TOKENS)) - 1]
        )
        self.drafts_from = emitted + pause

    def verified(self) -> None:
        self.declines = 0

    def worth_a_look(self, emitted: int) -> bool:
        return bool(self.declines) and emitted - self.declined_since >= EXPLORE_AFTER_DECLINED_TOKENS

    def proposed(self) -> None:
        self.quiet_ticks = 0

    def quiet_tick(self) -> None:
        self.quiet_ticks += 1
