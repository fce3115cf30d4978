"""The shared verify round: exact against plain decode, and its edge cases (truncation, stops, bound)."""

from __future__ import annotations

import dataclasses

import mlx.core as mx
import pytest

from mlxd_drafters import PromptLookupConfig
from mlxd_engine import Engine, SamplingParams, prefill_and_record, step_and_record, verify_round
from mlxd_engine.verify_round import greedy_tokens
from mlxd_scheduler import generate_plain, generate_with_prompt_lookup

STORY_PROMPTS = ["Once upon a time", "Lily and Ben went to the park.", "The little dog was sad because"]


def near_tie_gap(loaded, prompt: list[int], prefix: list[int]) -> float:
    """Top-1 minus top-2 logit after prompt + prefix: how close plain decode was to a tie there."""
    engine = Engine(loaded, max_sequences=1)
    seq = engine.add_sequence(prompt + prefix)
    logits = engine.model(mx.array([seq.tokens]))[0, -1]
    top2 = mx.sort(logits)[-2:].tolist()
    return top2[1] - top2[0]


def assert_same_or_near_tie(loaded, prompt, plain, speculative, tolerance=1e-3):
    if plain == speculative:
        return
    split = next(i for i, (a, b) in enumerate(zip(plain + [None], speculative + [None])) if a != b)
    gap = near_tie_gap(loaded, prompt, plain[:split])
    print(f"divergence at output token {split}: logit gap {gap:.2e}")
    assert gap < tolerance, f"real mismatch at token {split} (logit gap {gap:.3f})"


@pytest.mark.parametrize("text", STORY_PROMPTS)
def test_greedy_with_verify_round_equals_plain_on_stories(stories_model, text):
    engine = Engine(stories_model, max_sequences=1)
    prompt = stories_model.tokenizer.encode(text)
    plain = generate_plain(engine, prompt, 160)
    speculative = generate_with_prompt_lookup(engine, prompt, 160)
    assert_same_or_near_tie(stories_model, prompt, plain.tokens, speculative.tokens)
    assert speculative.verify_rounds > 0 and speculative.accepted > 0
    assert speculative.finish_reason == plain.finish_reason


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.9, seed=11),
        SamplingParams(temperature=0.8, top_k=20, top_p=0.9, min_p=0.02, seed=3),
        SamplingParams(repetition_penalty=1.3, presence_penalty=0.2, frequency_penalty=0.1),
        SamplingParams(logit_bias=((263, 2.0),)),
    ],
    ids=["seeded", "seeded-filters", "penalties", "logit-bias"],
)
def test_sampler_chains_replay_exactly(stories_model, params):
    engine = Engine(stories_model, max_sequences=1)
    prompt = stories_model.tokenizer.encode("Once upon a time")
    always = PromptLookupConfig(policy="always")
    plain = generate_plain(engine, prompt, 120, params)
    speculative = generate_with_prompt_lookup(engine, prompt, 120, params, always)
    assert speculative.verify_rounds > 0
    assert plain.tokens == speculative.tokens


def _greedy_continuation(loaded, prompt, n):
    engine = Engine(loaded, max_sequences=1)
    return generate_plain(engine, prompt, n).tokens


def _decoding_sequence(loaded, prompt, **engine_kwargs):
    engine = Engine(loaded, max_sequences=1, **engine_kwargs)
    seq = engine.add_sequence(prompt)
    prefill_and_record(engine, seq)
    return engine, seq


def test_correct_proposal_is_accepted_in_one_forward(stories_model):
    prompt = stories_model.tokenizer.encode("Once upon a time")
    truth = _greedy_continuation(stories_model, prompt, 12)
    engine, seq = _decoding_sequence(stories_model, prompt)
    outcome = verify_round(engine, seq, truth[1:9], max_new_tokens=50)
    seq.record(outcome.emitted)  # the caller's update step
    assert outcome.accepted == 8 and outcome.drafted == 8
    assert outcome.emitted == truth[1:10]
    assert outcome.outcomes == ["accepted"] * 8 + ["target"]
    assert seq.kv.committed == len(prompt) + 9 and seq.kv.pending == 0
    assert seq.output == truth[:10]


def test_wrong_draft_is_unwound(stories_model):
    prompt = stories_model.tokenizer.encode("Once upon a time")
    truth = _greedy_continuation(stories_model, prompt, 12)
    engine, seq = _decoding_sequence(stories_model, prompt)
    wrong = (truth[3] + 1) % 512
    outcome = verify_round(engine, seq, [truth[1], truth[2], wrong, 7, 8], max_new_tokens=50)
    seq.record(outcome.emitted)  # the caller's update step
    assert outcome.accepted == 2 and outcome.emitted == truth[1:4]
    assert seq.kv.committed == len(prompt) + 3 and seq.kv.pending == 0
    # decoding on from here equals the plain continuation
    assert [step_and_record(engine, [seq])[0].token for _ in range(5)] == truth[4:9]


def test_proposal_truncated_at_max_tokens(stories_model):
    prompt = stories_model.tokenizer.encode("Once upon a time")
    truth = _greedy_continuation(stories_model, prompt, 12)
    engine, seq = _decoding_sequence(stories_model, prompt)
    outcome = verify_round(engine, seq, truth[1:9], max_new_tokens=3)
    seq.record(outcome.emitted)  # the caller's update step
    assert outcome.drafted == 2
    assert outcome.emitted == truth[1:4]
    assert outcome.finish_reason == "length"


def test_stop_inside_accepted_block_ends_row_there(stories_model):
    prompt = stories_model.tokenizer.encode("Once upon a time")
    truth = _greedy_continuation(stories_model, prompt, 12)
    engine, seq = _decoding_sequence(stories_model, prompt)
    outcome = verify_round(engine, seq, truth[1:9], max_new_tokens=50, should_stop=lambda t: t == truth[4])
    seq.record(outcome.emitted)  # the caller's update step
    assert outcome.emitted == truth[1:5] and outcome.finish_reason == "stop"
    assert seq.kv.committed == len(prompt) + 4 and seq.kv.pending == 0


def test_eos_inside_accepted_block_ends_row_there(stories_model):
    prompt = stories_model.tokenizer.encode("Once upon a time")
    truth = _greedy_continuation(stories_model, prompt, 12)
    eos_at_six = dataclasses.replace(stories_model, eos_token_ids=frozenset({truth[6]}))
    engine, seq = _decoding_sequence(eos_at_six, prompt)
    outcome = verify_round(engine, seq, truth[1:9], max_new_tokens=50)
    seq.record(outcome.emitted)  # the caller's update step
    assert outcome.emitted == truth[1:7] and outcome.finish_reason == "stop"
    assert seq.kv.pending == 0


def test_context_bound_truncates_and_finishes(stories_model):
    prompt = stories_model.tokenizer.encode("Once upon a time")
    truth = _greedy_continuation(stories_model, prompt, 12)
    engine, seq = _decoding_sequence(stories_model, prompt, max_kv_size=len(prompt) + 4)
    outcome = verify_round(engine, seq, truth[1:9], max_new_tokens=50)
    seq.record(outcome.emitted)  # the caller's update step
    assert outcome.drafted == 3  # [current] + 3 drafts fill the 4 free positions
    assert outcome.emitted == truth[1:5]
    assert outcome.finish_reason == "length"
    assert seq.kv.written == seq.max_kv


COPY_PARAGRAPHS = [
    "The scheduler keeps one decode step in flight while it reads the previous one, so the model never waits for "
    "Python. When a row proposes draft tokens, the next tick runs synchronously.",
    "A lighthouse keeper wrote in his log every evening. He noted the direction of the wind, the colour of the sea "
    "and the ships that passed the point.",
]
PLAIN_PROMPTS = ["Explain how a bicycle works.", "Write a short story about a robot."]


def _chat(loaded, text):
    return loaded.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)


@pytest.mark.parametrize("paragraph", COPY_PARAGRAPHS)
def test_embedded_model_copy_prompts_equal_plain_and_accept(embedded_model, paragraph):
    engine = Engine(embedded_model, max_sequences=1)
    prompt = _chat(embedded_model, f"Repeat the following paragraph exactly: {paragraph}")
    plain = generate_plain(engine, prompt, 200)
    speculative = generate_with_prompt_lookup(engine, prompt, 200)
    assert_same_or_near_tie(embedded_model, prompt, plain.tokens, speculative.tokens)
    assert speculative.accepted > 0
    print(f"copy: {len(plain.tokens)} tokens, {speculative.verify_rounds} rounds, {speculative.accepted} accepted")


@pytest.mark.parametrize("text", PLAIN_PROMPTS)
def test_embedded_model_plain_prompts_equal_plain(embedded_model, text):
    engine = Engine(embedded_model, max_sequences=1)
    prompt = _chat(embedded_model, text)
    plain = generate_plain(engine, prompt, 120)
    speculative = generate_with_prompt_lookup(engine, prompt, 120)
    assert_same_or_near_tie(embedded_model, prompt, plain.tokens, speculative.tokens)


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_greedy_tokens_match_mlx_argmax_with_ties_and_nans(dtype):
    nan, inf = float("nan"), float("inf")
    rows = [
        [1.0, 3.0, 3.0, 2.0],  # equal maxima: the first
        [nan, 1.0, 2.0, 0.0],  # a NaN counts as the largest
        [1.0, 2.0, nan, nan],
        [-inf, -inf, -inf, -inf],
        [inf, 1.0, inf, 0.0],
        [-0.0, 0.0, -1.0, -2.0],
    ]
    logits = mx.array([rows, rows[::-1]], dtype=dtype)  # [batch, positions, vocab]
    expected = mx.argmax(logits, axis=-1).tolist()
    assert greedy_tokens(logits) == expected
    assert greedy_tokens(logits[1, 1:4]) == expected[1][1:4]  # a strided view, read in place
    wide = mx.random.normal((9, 49152), key=mx.random.key(3)).astype(dtype)
    assert greedy_tokens(wide) == mx.argmax(wide, axis=-1).tolist()
