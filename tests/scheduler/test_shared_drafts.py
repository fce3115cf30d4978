"""The shared draft store through the batch scheduler: greedy tokens equal with it on and off, drafts from
earlier requests are counted under their source, and neither an opted-out request nor another key's sees
them."""

from __future__ import annotations

import pytest

from mlxd_drafters import PromptLookupConfig, SharedStoreConfig
from mlxd_engine import Engine
from mlxd_scheduler import BatchScheduler, Request, SchedulerOptions

from .stub_model import VERIFY_PAYS
from .test_batch_scheduler import Collector

# two "sessions" whose prompts differ at the start but ask for the same thing at the end
HEAD_A = [(7 * i + 3) % 200 + 20 for i in range(24)]
HEAD_B = [(11 * i + 5) % 200 + 20 for i in range(24)]
TAIL = [(13 * i + 1) % 150 + 30 for i in range(16)]


def _scheduler(loaded, shared: bool, max_batch: int = 4, records: list | None = None) -> BatchScheduler:
    options = SchedulerOptions(
        max_batch=max_batch,
        prompt_lookup=PromptLookupConfig(),
        shared_drafts=SharedStoreConfig(include_prompts=False) if shared else None,
    )
    sink = records.append if records is not None else None
    scheduler = BatchScheduler(Engine(loaded, max_sequences=max_batch, prefix_cache_bytes=0), options, sink)
    if scheduler.prompt_lookup is not None:
        # the verify gate's costs pinned (stub_model.StubCost): which drafts get verified, and so the accepted
        # counts these tests read, must not hang on how fast this machine runs the forwards
        scheduler.prompt_lookup.cost_model = VERIFY_PAYS
    return scheduler


def _run(scheduler, requests, together=False):
    out = Collector()
    if together:
        for request in requests:
            scheduler.submit(request, out.sink(request.request_id))
        scheduler.run_until_idle()
    else:
        for request in requests:
            scheduler.submit(request, out.sink(request.request_id))
            scheduler.run_until_idle()
    return out


def _requests(prefix="r", **fields):
    return [
        Request(f"{prefix}0", HEAD_A + TAIL, max_tokens=48, ignore_eos=True, **fields),
        Request(f"{prefix}1", HEAD_B + TAIL, max_tokens=48, ignore_eos=True, **fields),
        Request(f"{prefix}2", HEAD_A[::-1] + TAIL, max_tokens=48, ignore_eos=True, **fields),
    ]


def _shared(timings) -> dict:
    return timings.get("draft_sources", {}).get("shared", {"draft_n": 0, "draft_n_accepted": 0})


def test_greedy_tokens_equal_with_the_store_on_and_off(embedded_model):
    on, off = _scheduler(embedded_model, True), _scheduler(embedded_model, False)
    for together in (False, True):
        requests = _requests("t" if together else "s")
        with_store = _run(on, requests, together)
        without = _run(off, _requests("t" if together else "s"), together)
        for request in requests:
            assert with_store.done(request.request_id).tokens == without.done(request.request_id).tokens
            off_timings = without.done(request.request_id).timings
            assert _shared(off_timings)["draft_n"] == 0
    # the later requests repeat the earlier replies' tails: the store drafted them, and its drafts were taken
    shared = [_shared(with_store.done(r.request_id).timings) for r in requests]
    assert sum(counts["draft_n_accepted"] for counts in shared) > 0
    timings = with_store.done("t1").timings
    per_source = timings["draft_sources"]
    assert sum(counts["draft_n"] for counts in per_source.values()) == timings["draft_n"]
    assert sum(counts["draft_n_accepted"] for counts in per_source.values()) == timings["draft_n_accepted"]
    assert set(per_source) <= {"prompt", "output", "prediction", "shared"}


def test_the_second_request_drafts_the_first_ones_reply(embedded_model):
    records: list = []
    scheduler = _scheduler(embedded_model, True, records=records)
    out = _run(scheduler, _requests())
    verifies = [row for record in records for row in record.rows if row.action == "verify"]
    assert {row.detail for row in verifies} <= {"prompt", "output", "prediction", "shared"}
    assert "shared" in {row.detail for row in verifies}  # the trace says where each verified draft came from
    assert _shared(out.done("r0").timings)["draft_n"] == 0  # nothing was in the store yet
    assert _shared(out.done("r1").timings)["draft_n_accepted"] > 0
    assert scheduler.shared_drafts is not None and scheduler.shared_drafts.summary()["documents"] == 3
    totals = scheduler.totals
    assert totals["draft_accepted_shared"] == sum(
        _shared(out.done(f"r{i}").timings)["draft_n_accepted"] for i in range(3)
    )
    assert (
        sum(totals[f"draft_tokens_{source}"] for source in ("prompt", "output", "prediction", "shared"))
        == totals["draft_tokens"]
    )
    again = _run(scheduler, [Request("r3", HEAD_A + TAIL, max_tokens=48, ignore_eos=True)])
    assert again.done("r3").tokens == out.done("r0").tokens
    assert _shared(again.done("r3").timings)["draft_n_accepted"] >= 8  # the same prompt: r0's reply is drafted


def test_an_opted_out_request_neither_drafts_from_nor_feeds_the_store(embedded_model):
    scheduler = _scheduler(embedded_model, True)
    first, second, _ = _requests("o", shared_drafts=False)
    out = _run(scheduler, [first, second])
    assert _shared(out.done("o1").timings)["draft_n"] == 0
    assert scheduler.shared_drafts is not None and scheduler.shared_drafts.summary()["documents"] == 0


def test_one_keys_requests_are_never_drafted_into_anothers(embedded_model):
    scheduler = _scheduler(embedded_model, True)
    first, second, third = _requests("k")
    first.draft_key, second.draft_key, third.draft_key = "alice", "bob", "alice"
    out = _run(scheduler, [first, second, third])
    assert _shared(out.done("k1").timings)["draft_n"] == 0  # bob's store is empty
    assert _shared(out.done("k2").timings)["draft_n_accepted"] > 0  # alice's holds k0's reply


@pytest.mark.parametrize("name", ["lfm2", "mamba2", "gemma3_text", "qwen3_moe"])
def test_store_drafts_keep_greedy_tokens_on_other_architectures(name):
    """Recurrent state (restored and replayed after a partial accept), sliding-window rings and experts: the
    store's drafts of earlier replies are verified on them, and every request's tokens equal the store off."""
    from ..engine.architectures import available, build, loaded, repeating_prompt

    if not available(name):
        pytest.skip(f"the installed mlx-lm has no {name}")
    model = loaded(name, model=build(name, seed=0))
    text = repeating_prompt(120, 12, 0)

    def requests():  # prompts that differ in their heads and end alike, then the first again
        heads = [text[: 100 - 3 * i] + text[100:] for i in range(3)]
        return [Request(f"q{i}", head, max_tokens=40, ignore_eos=True) for i, head in enumerate([*heads, heads[0]])]

    with_store = _run(_scheduler(model, True), requests())
    without = _run(_scheduler(model, False), requests())
    for i in range(4):
        assert with_store.done(f"q{i}").tokens == without.done(f"q{i}").tokens, f"{name}: request {i} differs"
    assert sum(_shared(with_store.done(f"q{i}").timings)["draft_n_accepted"] for i in range(4)) > 0
