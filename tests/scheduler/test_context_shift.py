"""Context shift (``SchedulerOptions.context_shift``): a row whose context fills keeps its first tokens, drops
half of the rest and goes on exactly as a fresh request on the kept tokens would (stories260K, greedy)."""

from __future__ import annotations

import pytest

from mlxd_drafters import PromptLookupConfig
from mlxd_engine import Engine, SamplingParams
from mlxd_scheduler import BatchScheduler, Request, SchedulerOptions, SpeculativeRequest
from mlxd_scheduler.context_shift import shift_amounts

from .test_batch_scheduler import Collector

MAX_KV = 32
GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def prompts(stories_model):
    """Two prompts of stories260K: 12 tokens (BOS first) and a shorter one."""
    encode = stories_model.tokenizer.encode
    prompt = list(encode("Once upon a time, there was a little girl named Lily."))[:12]
    assert len(prompt) == 12 and prompt[0] == stories_model.tokenizer.bos_token_id
    return prompt, list(encode("The dog ran"))


def run(loaded, requests: list[Request], **options):
    """Run ``requests`` on an engine with ``MAX_KV`` tokens per row. Returns their FinishEvents and streamed
    tokens by id."""
    scheduler = BatchScheduler(Engine(loaded, max_sequences=4, max_kv_size=MAX_KV), SchedulerOptions(**options))
    out = Collector()
    for request in requests:
        scheduler.submit(request, out.sink(request.request_id))
    scheduler.run_until_idle()
    assert not scheduler.has_work and scheduler.engine.storage.free_slots == 4
    ids = [r.request_id for r in requests]
    return {i: out.done(i) for i in ids}, {i: out.streamed_tokens(i) for i in ids}


def request(request_id: str, prompt: list[int], max_tokens: int, **fields) -> Request:
    return Request(request_id, prompt, GREEDY, max_tokens, ignore_eos=True, **fields)


def test_shift_amounts_follow_llama_server():
    # keep 1 (a BOS), 255 stored: half of the 254 after it go
    assert shift_amounts(255, 1, 0, 256) == (1, 127)
    assert shift_amounts(32, 1, 0, 32) == (1, 15)
    assert shift_amounts(32, 1, 40, 32) == (1, 30)  # n_discard is clamped to leave one token
    assert shift_amounts(32, 100, 0, 32) == (28, 2)  # n_keep is clamped to max_kv - 4


def test_off_by_default_a_row_ends_at_its_bound(stories_model, prompts):
    prompt = prompts[0]
    done, _ = run(stories_model, [request("a", prompt, 40)])
    assert done["a"].finish_reason == "length" and not done["a"].truncated
    assert len(done["a"].tokens) == MAX_KV - len(prompt) + 1  # the last token never needs storage


@pytest.mark.parametrize("decode_steps", [1, 8])
def test_a_shifted_row_goes_on_as_a_fresh_request_on_the_kept_tokens(stories_model, prompts, decode_steps):
    prompt, other = prompts
    first = MAX_KV - len(prompt) + 1  # tokens until the bound (21)
    done, streamed = run(
        stories_model,
        [request("a", prompt, first + 10, context_keep=1), request("b", other, 20)],
        context_shift=True,
        max_decode_steps=decode_steps,
        tick_budget_ms=1e9,
    )
    alone, _ = run(stories_model, [request("a", prompt, first), request("b", other, 20)])
    before = alone["a"].tokens
    keep, dropped = shift_amounts(MAX_KV, 1, 0, MAX_KV)
    context = prompt + before
    kept = context[:keep] + context[keep + dropped :]
    after, _ = run(stories_model, [request("k", kept, 10)])
    assert done["a"].tokens == before + after["k"].tokens
    assert streamed["a"] == done["a"].tokens
    assert done["a"].truncated and done["a"].finish_reason == "length"
    assert done["a"].usage["prompt_tokens"] == len(prompt) and done["a"].usage["completion_tokens"] == first + 10
    assert done["b"].tokens == alone["b"].tokens and not done["b"].truncated  # the row beside it is untouched


def test_a_row_may_shift_many_times_and_prompt_lookup_changes_nothing(stories_model, prompts):
    prompt = prompts[0]
    plain, _ = run(stories_model, [request("a", prompt, 90, context_keep=4)], context_shift=True)
    drafted, streamed = run(
        stories_model,
        [request("a", prompt, 90, context_keep=4, speculative=SpeculativeRequest(enabled=True))],
        context_shift=True,
        prompt_lookup_cap=PromptLookupConfig(),
    )
    assert len(plain["a"].tokens) == 90 and plain["a"].truncated
    assert drafted["a"].tokens == plain["a"].tokens and streamed["a"] == plain["a"].tokens


def test_a_row_that_reaches_max_tokens_at_its_bound_is_not_shifted(stories_model, prompts):
    prompt = prompts[0]
    done, _ = run(stories_model, [request("a", prompt, MAX_KV - len(prompt) + 1)], context_shift=True)
    assert done["a"].finish_reason == "length" and not done["a"].truncated


def test_a_prompt_lookup_row_gives_as_many_tokens_at_its_bound_as_plain_decode(stories_model, prompts):
    # a verify round reads several tokens at once: each is judged against the storage it was emitted with
    speculative = SpeculativeRequest(enabled=True)
    plain, _ = run(stories_model, [request("a", prompts[0], 40)])
    drafted, _ = run(
        stories_model, [request("a", prompts[0], 40, speculative=speculative)], prompt_lookup_cap=PromptLookupConfig()
    )
    assert drafted["a"].tokens == plain["a"].tokens and len(plain["a"].tokens) == MAX_KV - len(prompts[0]) + 1
