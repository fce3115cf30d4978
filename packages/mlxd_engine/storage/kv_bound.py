"""The KV bound of a sequence: the one place it is checked.

A sequence may hold at most ``seq.max_kv`` tokens in storage. Its last token is outside storage until the
next forward appends it, so the sequence must end when storage holds ``max_kv`` tokens: that token could
never be appended. Every caller (the finish step, the single-sequence loops, the verify round, the
scheduler's steps per tick) asks here instead of writing the comparison itself.

Worked example: ``max_kv`` 8, a 5-token prompt prefilled (committed 5) and 3 tokens emitted since: after
the third, committed is 7 and ``kv_room`` is 1 (the current token fits); after a fourth, committed is 8,
``at_kv_bound`` is True and the row finishes with "length".
"""

from __future__ import annotations


def kv_room(seq) -> int:
    """Appends ``seq`` may still make: positions left in storage after everything written (pending too)."""
    return seq.max_kv - seq.kv.written


def at_kv_bound(seq, later: int = 0) -> bool:
    """True when storage is full: the sequence's current (last) token can never be appended.

    ``later``: judge an earlier token instead, the one ``later`` tokens before the newest, whose successors'
    appends are already committed (a run of chained steps or a verify round read at once: storage held
    ``later`` tokens fewer when it was emitted)."""
    return seq.kv.committed - later >= seq.max_kv
