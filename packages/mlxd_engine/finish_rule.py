"""The rule that ends a row, in one place: the verify round, the scheduler's finish step and the
single-sequence loops all ask it instead of writing the comparisons themselves.

Contract:
- ``ends_on(eos_token_ids, token, should_stop=None)``: the token ends the row with "stop" (an end-of-
  sequence token, or one the caller's ``should_stop`` names).
- ``reaches_length(seq, emitted, max_tokens, later=0)``: the row has given ``max_tokens`` tokens or its
  storage is full (``at_kv_bound``; ``later``: the token judged is that many before the row's newest, read
  in the same run): it ends with "length".
- ``finish_reason(eos_token_ids, seq, token, emitted, max_tokens, should_stop=None)``: both, in that
  order, for the row's newest token (``emitted`` counts it): "stop", "length" or None.
The scheduler's finish step also honours ``ignore_eos`` and stop strings on the text, which only it sees.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from .storage.kv_bound import at_kv_bound


def ends_on(eos_token_ids: Collection[int], token: int, should_stop: Callable[[int], bool] | None = None) -> bool:
    return token in eos_token_ids or (should_stop is not None and should_stop(token))


def reaches_length(seq, emitted: int, max_tokens: int, later: int = 0) -> bool:
    return emitted >= max_tokens or (seq is not None and at_kv_bound(seq, later))


def finish_reason(
    eos_token_ids: Collection[int],
    seq,
    token: int,
    emitted: int,
    max_tokens: int,
    should_stop: Callable[[int], bool] | None = None,
) -> str | None:
    if ends_on(eos_token_ids, token, should_stop):
        return "stop"
    return "length" if reaches_length(seq, emitted, max_tokens) else None
