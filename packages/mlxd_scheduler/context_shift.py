"""Context shift (llama-server's ``--context-shift``): a row whose context fills goes on with part of it.

Contract: when a decoding row's storage is full (``at_kv_bound``) before it has given ``max_tokens``, and
the scheduler runs with ``context_shift``, the row is not ended with "length": its first ``keep`` tokens
stay, ``discard`` of the tokens after them are dropped (half of them unless the request says how many),
and the rest follow, the current (last) token included. llama-server's arithmetic (``shift_amounts``):

    keep    = min(request's keep, max_kv - 4)
    left    = tokens in storage - keep
    discard = request's discard or left // 2, clamped to [0, left - 1]

llama-server removes those positions from its KV cache and moves the later keys' positions back. Here the
row is rebuilt from the kept tokens instead (``shift_row``): its sequence is released and a new one is
admitted with the kept tokens as its prompt, which the scheduler prefills again. So the logits after a
shift are exactly those of a fresh request on the kept tokens, and a greedy row goes on as that request
would; a seeded row draws as a fresh request with its seed would (its sampler chain starts again). The
re-prefill never reads or feeds the prefix cache: the shifted tokens are no prompt anyone sends again.

Rows with a grammar (structured output, a required tool call) are not shifted: the grammar follows the
whole output, which a shift would cut. They end at the bound with "length", as without context shift.

Worked example: ``max_kv`` 8, a prompt of 5 tokens [b, p1, p2, p3, p4] with keep 1 (its BOS): once o4 is
emitted storage holds b p1 p2 p3 p4 o1 o2 o3 (8) and o4 is current: the row is at its bound. left =
8 - 1 = 7, discard = 3: kept = [b, p4, o1, o2, o3, o4] (6 tokens, o4 the current one); the re-prefill
forwards all 6 and samples o5 from the last position.
"""

from __future__ import annotations

from mlxd_engine import Engine, at_kv_bound

from .request import RequestState

MIN_ROOM = 4  # llama-server keeps at most max_kv - 4 tokens, so a shift always frees room


def can_shift(state: RequestState) -> bool:
    """Whether the row stopped by "length" may shift instead: its storage is full, it has not given
    ``max_tokens`` yet and no grammar follows its output."""
    seq = state.seq
    return (
        seq is not None and at_kv_bound(seq) and state.emitted < state.request.max_tokens and seq.chain.grammar is None
    )


def shift_amounts(stored: int, keep: int, discard: int, max_kv: int) -> tuple[int, int]:
    """(tokens kept at the start, tokens dropped after them), as llama-server computes them.

    Args:
        stored: Tokens in the row's storage (its context).
        keep: The request's keep count (``Request.context_keep``).
        discard: The request's discard count (0: half of what follows the kept tokens).
        max_kv: The row's KV bound.
    """
    keep = max(0, min(max_kv - MIN_ROOM, keep))
    left = stored - keep
    dropped = discard or left // 2
    return keep, max(0, min(dropped, left - 1))


def shift_row(engine: Engine, state: RequestState) -> tuple[int, int]:
    """Rebuild ``state``'s row from its kept tokens: release its sequence, admit a new one whose prompt is
    the kept tokens (the current token last), and keep the output given so far in ``state.shifted_output``.
    The caller puts the row back to prefill. Returns (kept, dropped) token counts.

    Raises:
        KVStorageFull, ValueError: the new sequence could not be admitted (the old one is released then and
            stays ``state.seq``, its output not moved, so the row can still be finished).
    """
    seq, request = state.seq, state.request
    emitted_here = state.emitted - len(state.shifted_output)  # output of this sequence the finish step took
    tokens = seq.tokens[: seq.prompt_length + emitted_here]  # tokens a step read past the bound are not kept
    keep, dropped = shift_amounts(seq.kv.committed, request.context_keep, request.context_discard, seq.max_kv)
    kept = tokens[:keep] + tokens[keep + dropped :]
    engine.release(seq)  # as a finish would: its prompt and output may serve a later request's prefix
    new = engine.add_sequence(kept, request.params, request.max_tokens - state.emitted, cache_prompt=False)
    new.cached_tokens = seq.cached_tokens  # the request's prompt tokens the prefix cache gave (usage, timings)
    state.shifted_output.extend(tokens[seq.prompt_length :])
    state.context_shifts += 1
    state.seq = new
    return len(kept), dropped
