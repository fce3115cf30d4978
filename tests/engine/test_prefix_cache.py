"""The prefix cache: a cached prefix gives the same tokens as a cold prefill, and the cache keeps its bounds.

Each case decodes a first request, lets it end (its prompt + output go into the cache), then sends a
second request that starts with all or part of the first's tokens: its output must equal the same
request on an engine without a cache, token for token (greedy), with and without prompt lookup.
"""

from __future__ import annotations

import pytest

from mlxd_engine import Engine, prefill_and_record, read_and_record
from mlxd_engine.storage.prefix_cache import PrefixCache
from mlxd_scheduler.single_sequence import generate_plain, generate_with_prompt_lookup

from ..model_paths import SMOLLM2
from .architectures import build, loaded, prompt, repeating_prompt

BUDGET = 64 * 2**20


def _turn(engine, tokens, n=24, lookup=False):
    run = generate_with_prompt_lookup if lookup else generate_plain
    return run(engine, tokens, n).tokens


def _second_turn(first_prompt, first_output, extra=(5, 9, 13, 2, 7)):
    return list(first_prompt) + list(first_output) + list(extra)


@pytest.mark.parametrize("storage", ["contiguous", "paged"])
def test_hit_partial_hit_miss_and_exact_hit_equal_a_cold_prefill(embedded_model, storage):
    model = embedded_model
    cached = Engine(model, max_sequences=2, storage=storage, prefix_cache_bytes=BUDGET)
    cold = Engine(model, max_sequences=2, storage=storage)
    first = [(7 * i + 3) % 200 + 1 for i in range(120)]
    output = _turn(cached, first)
    assert len(cached.prefix_cache) == 1

    cases = {
        "hit": _second_turn(first, output),  # the whole first request, then more
        "partial": first[:70] + [11, 12, 13, 14, 15, 16],  # a shared start only
        "miss": [250 - t for t in first[:40]],
        "exact": list(first),  # the same prompt again: all but its last token come from the cache
    }
    expected_reuse = {"hit": len(first) + len(output) - 1, "partial": 70, "miss": 0, "exact": len(first) - 1}
    for name, tokens in cases.items():
        seq = cached.add_sequence(tokens)
        assert seq.cached_tokens == expected_reuse[name], name
        cached.release(seq, keep_prefix=False)
        for lookup in (False, True):
            assert _turn(cached, tokens, lookup=lookup) == _turn(cold, tokens, lookup=lookup), (name, lookup)
    stats = cached.prefix_cache.stats()
    assert stats["hits"] >= 3 and stats["tokens_saved"] > 0 and stats["bytes"] <= BUDGET


def test_stories260k_second_turn_equals_cold(stories_model):
    model = stories_model
    cached = Engine(model, max_sequences=1, prefix_cache_bytes=BUDGET)
    cold = Engine(model, max_sequences=1)
    first = model.tokenizer.encode("Once upon a time there was a little girl named Lily. She loved to play")
    output = _turn(cached, first, 40)
    second = _second_turn(first, output, model.tokenizer.encode(" One day she saw a big dog."))
    seq = cached.add_sequence(second)
    assert seq.cached_tokens == len(first) + len(output) - 1
    cached.release(seq, keep_prefix=False)
    assert _turn(cached, second, 40) == _turn(cold, second, 40)


@pytest.mark.parametrize("name", ["qwen3_next", "gemma3_text", "falcon_h1"])
def test_recurrent_and_sliding_models_hit_at_the_stored_boundary_only(name):
    """State that holds only at its end (recurrent rows, sliding-window rings): a prompt that extends a
    whole entry hits it; one that shares only part of it misses; hits equal a cold prefill."""
    model = loaded(name, model=build(name, seed=3))
    cached = Engine(model, max_sequences=2, prefix_cache_bytes=BUDGET)
    cold = Engine(model, max_sequences=2)
    first = repeating_prompt(150, 12, 1)
    output = _turn(cached, first, 30)
    second = _second_turn(first, output)
    seq = cached.add_sequence(second)
    assert seq.cached_tokens == len(first) + len(output) - 1  # every token in storage when it ended
    cached.release(seq, keep_prefix=False)
    partial = first[:100] + [3, 4, 5]
    seq = cached.add_sequence(partial)
    assert seq.cached_tokens == 0
    cached.release(seq, keep_prefix=False)
    for tokens in (second, partial):
        for lookup in (False, True):
            assert _turn(cached, tokens, 30, lookup) == _turn(cold, tokens, 30, lookup), (name, lookup)


def test_pipelined_release_of_a_recurrent_row_keeps_a_valid_prefix():
    """A row released with a step still in flight: the cache keeps the state where that step started."""
    model = loaded("lfm2", model=build("lfm2", seed=3))
    cached = Engine(model, max_sequences=2, prefix_cache_bytes=BUDGET)
    cold = Engine(model, max_sequences=2)
    first = prompt(90, 4)
    seq = cached.add_sequence(first)
    prefill_and_record(cached, seq)
    handle = None
    for _ in range(6):
        submitted = cached.submit_step([seq], lookahead=handle)
        if handle is not None:
            read_and_record(cached, handle)
        handle = submitted
    assert seq.kv.pending == 1
    cached.release(seq)  # the last step is in flight
    kept = list(seq.tokens)  # in storage: all but the last, whose step was in flight
    second = kept + [9, 8, 7]
    again = cached.add_sequence(second)
    assert again.cached_tokens == len(kept) - 1
    cached.release(again, keep_prefix=False)
    assert _turn(cached, second) == _turn(cold, second)


def test_lru_eviction_budget_and_superseded_entries():
    cache = PrefixCache(budget_bytes=300, max_entries=3)
    assert cache.store([1, 2, 3], "a", 100)
    assert cache.store([4, 5, 6], "b", 100)
    assert cache.store([7, 8, 9], "c", 100)
    entry, n = cache.lookup([1, 2, 3, 10])  # a hit makes [1, 2, 3] the most recently used
    assert entry.snapshot == "a" and n == 3
    assert cache.store([11, 12], "d", 50)  # over the budget: the least recently used ([4, 5, 6]) goes
    assert cache.lookup([4, 5, 6, 1]) == (None, 0)
    assert cache.stats()["bytes"] <= 300 and len(cache) == 3
    assert cache.store([1, 2, 3, 10, 20], "e", 100)  # extends [1, 2, 3]: that entry is dropped
    assert [e for e in cache._entries] == [(7, 8, 9), (11, 12), (1, 2, 3, 10, 20)]
    assert not cache.store(list(range(10)), "f", 301)  # over the whole budget: not kept
    entry, n = cache.lookup([1, 2, 3, 10, 20])  # exact: the last prompt token is forwarded again
    assert n == 4
    boundary = PrefixCache(budget_bytes=300, boundary_only=True)
    boundary.store([1, 2, 3, 4], "g", 10)
    assert boundary.lookup([1, 2, 3, 9, 9]) == (None, 0)
    assert boundary.lookup([1, 2, 3, 4, 5])[1] == 4
    assert boundary.lookup([1, 2, 3, 4]) == (None, 0)  # nothing would be left to forward


@pytest.mark.slow
@pytest.mark.skipif(not SMOLLM2.is_dir(), reason=f"{SMOLLM2} is not present")
def test_smollm2_chat_second_turn_equals_cold():
    """SmolLM2-135M-Instruct, a chat's second turn: the first turn's prompt + reply come from the cache,
    and the reply equals a cold prefill's, with and without prompt lookup."""
    from mlxd_engine import load

    model = load(str(SMOLLM2))
    cached = Engine(model, max_sequences=1, prefix_cache_bytes=BUDGET)
    cold = Engine(model, max_sequences=1)
    messages = [{"role": "user", "content": "Name three rivers in Europe and say one thing about each."}]
    first = model.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    reply = _turn(cached, first, 24)
    messages += [
        {"role": "assistant", "content": model.tokenizer.decode(reply)},
        {"role": "user", "content": "Which of them is the longest?"},
    ]
    second = model.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    seq = cached.add_sequence(second)
    assert seq.cached_tokens >= len(first)  # the first prompt at least (the reply as far as it re-tokenizes)
    cached.release(seq, keep_prefix=False)
    for lookup in (False, True):
        assert _turn(cached, second, 24, lookup) == _turn(cold, second, 24, lookup), lookup
