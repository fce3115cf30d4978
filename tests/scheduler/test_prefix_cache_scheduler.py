"""The prefix cache through the batch scheduler: hits are reported, outputs equal a cold run, nothing leaks."""

from __future__ import annotations

import pytest

from mlxd_drafters import PromptLookupConfig
from mlxd_engine import Engine, prefill_and_record
from mlxd_scheduler import BatchScheduler, FinishEvent, Request, SchedulerOptions, SpeculativeRequest

from .test_batch_scheduler import Collector

SYSTEM = [(5 * i + 7) % 300 + 3 for i in range(90)]  # a shared system prompt


def _scheduler(loaded, storage, cache_bytes, records=None, prompt_lookup=False):
    engine = Engine(
        loaded,
        max_sequences=4,
        storage=storage,
        prefix_cache_bytes=cache_bytes,
        kv_pool_tokens=4096 if storage == "paged" else None,
    )
    options = SchedulerOptions(
        max_batch=4, prefill_chunk=64, prompt_lookup=PromptLookupConfig() if prompt_lookup else None
    )
    return engine, BatchScheduler(engine, options, (records if records is not None else []).append)


def _run_with_a_cancel(scheduler, requests, cancel: str, ticks: int):
    """Submit every request, tick ``ticks`` times, cancel one while it decodes, run until idle."""
    out = Collector()
    for request in requests:
        scheduler.submit(request, out.sink(request.request_id))
    for _ in range(ticks):
        scheduler.tick()
    scheduler.cancel(cancel)
    scheduler.run_until_idle()
    return out


def _run(scheduler, requests):
    out = Collector()
    for request in requests:
        scheduler.submit(request, out.sink(request.request_id))
    scheduler.run_until_idle()
    return out


@pytest.mark.parametrize("storage", ["contiguous", "paged"])
@pytest.mark.parametrize("prompt_lookup", [False, True])
def test_shared_prefix_hits_equal_a_cold_run_and_nothing_leaks(embedded_model, storage, prompt_lookup):
    records = []
    engine, cached = _scheduler(embedded_model, storage, 32 * 2**20, records, prompt_lookup)
    _, cold = _scheduler(embedded_model, storage, 0, prompt_lookup=prompt_lookup)
    speculative = SpeculativeRequest(True) if prompt_lookup else SpeculativeRequest()
    # a1 is long enough to be decoding still when it is cancelled (with prompt lookup's drafts too)
    first = [
        Request(f"a{i}", SYSTEM + [10 + i, 11, 12 + i], max_tokens=200 if i == 1 else 20, speculative=speculative)
        for i in range(3)
    ]
    out = _run_with_a_cancel(cached, first, "a1", ticks=6)  # a mixed first wave
    assert out.done("a1").finish_reason == "cancelled"
    assert len(engine.prefix_cache) >= 1

    second = [Request(f"b{i}", SYSTEM + [40 + i, 41, 42], max_tokens=20, speculative=speculative) for i in range(3)]
    second.append(Request("b-off", SYSTEM + [43, 44], max_tokens=20, speculative=speculative, cache_prompt=False))
    hot, reference = _run(cached, second), _run(cold, second)
    for request in second:
        done = hot.done(request.request_id)
        assert done.tokens == reference.done(request.request_id).tokens, request.request_id
        expected = 0 if not request.cache_prompt else len(SYSTEM)
        assert done.usage["cached_tokens"] == expected and done.timings["cache_n"] == expected, request.request_id
        assert done.timings["prompt_n"] == len(request.prompt) - expected
    hits = [row for record in records for row in record.rows if row.detail and "prefix cache hit" in row.detail]
    assert {row.request_id for row in hits} >= {"b0", "b1", "b2"}
    stats = engine.prefix_cache.stats()
    assert stats["hits"] >= 3 and stats["tokens_saved"] >= 3 * len(SYSTEM)
    # once idle, every sequence's storage is back: no slot or reservation held, and on paged storage only
    # the cache's entries hold blocks; clearing the cache frees every one of them
    assert_idle(engine)


def assert_idle(engine):
    """Nothing but the prefix cache holds storage; after clearing it, nothing at all (no block referenced)."""
    storage = engine.storage
    usage = storage.usage()
    if usage["backend"] == "paged":
        assert usage["blocks_reserved"] == 0 and usage["sequences"] == 0, usage
        assert usage["blocks_used"] == usage["blocks_cached"] == usage["blocks_cache_only"], usage
        assert (usage["blocks_used"] > 0) == (len(engine.prefix_cache) > 0), usage
    else:
        assert usage["slots_free"] == usage["slots"]
    engine.prefix_cache.clear()
    usage = storage.usage()
    if usage["backend"] == "paged":
        paged = getattr(storage, "inner", storage)
        assert usage["blocks_used"] == usage["blocks_cached"] == usage["blocks_reserved"] == 0, usage
        assert paged.free_blocks == paged.n_blocks and not paged._refs.any() and not paged._snapshot_refs.any()
        assert sorted(paged._free) == list(range(paged.n_blocks))  # each block once on the free list


def test_a_failed_request_leaves_nothing_in_the_cache(embedded_model):
    engine, scheduler = _scheduler(embedded_model, "contiguous", 32 * 2**20)
    out = Collector()
    state_ids = []
    scheduler.submit(Request("ok", SYSTEM + [1, 2], max_tokens=5), out.sink("ok"))
    scheduler.run_until_idle()
    state_ids.append(len(engine.prefix_cache))
    engine.prefix_cache.clear()
    seq = engine.add_sequence(SYSTEM + [3])
    prefill_and_record(engine, seq)
    engine.release(seq, keep_prefix=False)  # the finish step passes this for an "error" finish
    assert state_ids == [1] and len(engine.prefix_cache) == 0


@pytest.mark.parametrize("name", ["ministral3", "qwen3_next"])
@pytest.mark.parametrize("storage", ["contiguous", "paged"])
def test_rings_and_recurrent_state_through_the_scheduler(name, storage):
    """Rows released with a lookahead step in flight, one cancelled, prompt lookup on: nothing fails, and a
    second turn that extends a finished row hits it and equals a cold run (the ring / state at its end)."""
    from ..engine.architectures import build, loaded, prompt

    model = loaded(name, model=build(name, seed=3))
    engine, cached = _scheduler(model, storage, 32 * 2**20, prompt_lookup=True)
    _, cold = _scheduler(model, storage, 0, prompt_lookup=True)
    base = prompt(120, 1)
    first = [
        Request(f"r{i}", base + [i + 1] * (i + 1), max_tokens=30, speculative=SpeculativeRequest(True))
        for i in range(6)
    ]
    out = _run_with_a_cancel(cached, first, "r1", ticks=8)
    assert [out.done(r.request_id).finish_reason for r in first] == ["length", "cancelled"] + ["length"] * 4
    second = [Request("again", base + [1] + out.done("r0").tokens + [5], max_tokens=12)]
    hot, reference = _run(cached, second), _run(cold, second)
    assert hot.done("again").tokens == reference.done("again").tokens
    # the entry holds r0's prompt and all its output but the last token (never forwarded)
    assert hot.done("again").usage["cached_tokens"] == len(first[0].prompt) + 30 - 1
    assert_idle(engine)  # paged: the attention layers' blocks were shared, rings and state copied


@pytest.mark.parametrize("prompt_lookup", [False, True])
def test_paged_sharing_mixed_run_with_cancels_and_evictions_leaks_no_block(embedded_model, prompt_lookup):
    """Three waves on a tight pool of 16-token blocks: rows share the cached system prompt's blocks, the
    cache evicts for admissions, rows are cancelled while waiting and while decoding. Outputs equal a cold
    run's; once idle only the cache holds blocks, and after clearing it every block is free, every count 0."""

    def build(cache_bytes):
        engine = Engine(
            embedded_model,
            max_sequences=4,
            storage="paged",
            kv_block_size=16,
            kv_pool_tokens=48 * 16,
            max_kv_size=256,
            prefix_cache_bytes=cache_bytes,
        )
        options = SchedulerOptions(
            max_batch=4, prefill_chunk=32, prompt_lookup=PromptLookupConfig() if prompt_lookup else None
        )
        return engine, BatchScheduler(engine, options)

    engine, hot = build(32 * 2**20)
    _, cold = build(0)
    speculative = SpeculativeRequest(True) if prompt_lookup else SpeculativeRequest()
    shared_seen = cached_seen = decoding_cancels = 0
    for wave in range(3):
        requests = [
            Request(
                f"w{wave}-{i}",
                SYSTEM + [20 + 7 * wave + i, 11, 12 + i],
                max_tokens=16 + 4 * i,
                speculative=speculative,
                cache_prompt=(i != 3),
            )
            for i in range(6)
        ]
        out = Collector()
        for request in requests:
            hot.submit(request, out.sink(request.request_id))
        cancelled = {f"w{wave}-5"}  # queued behind the first four
        for tick in range(8):
            hot.tick()
            usage = engine.storage.usage()
            shared_seen, cached_seen = (
                max(shared_seen, usage["blocks_shared"]),
                max(cached_seen, usage["blocks_cached"]),
            )
            if tick == 1:
                hot.cancel(f"w{wave}-5")
            if tick == 5:  # one that decodes (has tokens, not finished), if any
                decoding = [
                    r.request_id
                    for r in requests[:5]
                    if out.events[r.request_id] and not isinstance(out.events[r.request_id][-1], FinishEvent)
                ]
                if decoding:
                    hot.cancel(decoding[0])
                    cancelled.add(decoding[0])
                    decoding_cancels += 1
        hot.run_until_idle()
        reference = _run(cold, [r for r in requests if r.request_id not in cancelled])
        for request in requests:
            done = out.done(request.request_id)
            if request.request_id in cancelled:
                assert done.finish_reason == "cancelled", request.request_id
            else:
                assert done.tokens == reference.done(request.request_id).tokens, request.request_id
        if wave:  # the system prompt was cached by the wave before
            assert out.done(f"w{wave}-0").usage["cached_tokens"] >= len(SYSTEM)
        usage = engine.storage.usage()
        assert usage["blocks_reserved"] == 0 and usage["blocks_used"] == usage["blocks_cache_only"], usage
    assert shared_seen > 0 and cached_seen > 0 and decoding_cancels > 0
    assert engine.prefix_cache.evictions > 0  # the pool was tight enough to evict for admissions
    assert_idle(engine)


@pytest.mark.parametrize("storage", ["contiguous", "paged"])
def test_a_copy_whose_prompt_comes_from_the_prefix_cache_still_drafts_and_accepts(storage):
    """The drafter is primed from the whole prompt, prefilled or taken from the cache: the same copy request
    run again (a cache hit of all but its last token) drafts and accepts as the first run did."""
    from .stub_model import VERIFY_PAYS, stub_loaded

    prompt = [10 + 3 * i for i in range(40)]  # distinct tokens: the reply repeats them, never itself
    loaded = stub_loaded(period=len(prompt))
    records = []
    engine = Engine(
        loaded,
        max_sequences=4,
        storage=storage,
        prefix_cache_bytes=32 * 2**20,
        kv_pool_tokens=4096 if storage == "paged" else None,
    )
    scheduler = BatchScheduler(
        engine, SchedulerOptions(max_batch=4, prompt_lookup=PromptLookupConfig()), records.append
    )
    scheduler.prompt_lookup.cost_model = VERIFY_PAYS
    runs = [_run(scheduler, [Request(f"r{i}", prompt, max_tokens=36)]).done(f"r{i}") for i in range(3)]
    assert runs[0].timings["cache_n"] == 0
    for done in runs[1:]:
        assert done.timings["cache_n"] == len(prompt) - 1  # the hit: every prompt token but the last
        assert done.tokens == runs[0].tokens
        # every draft comes from the prompt: an index without the cached tokens has nothing to copy
        assert done.timings["draft_n_accepted"] >= 24, done.timings
