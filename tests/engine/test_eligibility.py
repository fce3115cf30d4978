"""Every reason of the prompt-lookup eligibility predicate is reachable."""

from __future__ import annotations

import pytest

from mlxd_engine import SamplingParams, prompt_lookup_eligibility


def test_plain_greedy_and_sampled_requests_are_eligible():
    assert prompt_lookup_eligibility(SamplingParams(), storage_can_unwind=True)
    assert prompt_lookup_eligibility(
        SamplingParams(temperature=0.7, top_p=0.9, repetition_penalty=1.1, seed=3), storage_can_unwind=True
    )


@pytest.mark.parametrize(
    "params, kwargs, words",
    [
        (SamplingParams(), {"has_images": True}, "non-text"),
        (SamplingParams(logprobs=2), {}, "logprobs"),
        (SamplingParams(custom_processors=(lambda tokens, logits: logits,)), {}, "custom logits processors"),
        (SamplingParams(), {"storage_can_unwind": False}, "unwind"),
    ],
)
def test_each_reason_is_reachable(params, kwargs, words):
    verdict = prompt_lookup_eligibility(params, **{"storage_can_unwind": True, **kwargs})
    assert not verdict
    assert words in verdict.reason
