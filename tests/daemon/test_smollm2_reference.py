"""SmolLM2-135M-Instruct (4-bit) through mlxd equals mlx-lm's own greedy loop, plain and with prompt lookup.

The daemon runs its default CPU weight rule (``cpu_weights.py``: the 4-bit layers on mlxd's CPU
quantized-matmul kernel where it is built); the reference is mlx-lm's ``generate_step`` over the model
dequantized to float32 (the rule's other form), so this also holds the kernel's greedy output equal to the
float32 path. 64 tokens each, end-of-sequence ignored.
"""

from __future__ import annotations

import pytest

from mlxd_protocol import Client, Generate, Speculative, new_request_id

from ..model_paths import SMOLLM2
from .conftest import private_endpoint, start_daemon, stop_daemon

PROMPTS = (
    "Repeat the following paragraph exactly: The harbour was quiet that morning. Fishing boats rocked at "
    "their moorings, gulls argued over the nets, and the baker opened his shutters at six as he always did.",
    "Explain how a bicycle works.",
    "Once upon a time",
)
TOKENS = 64

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not SMOLLM2.is_dir(), reason=f"{SMOLLM2} is not present")]


def mlx_lm_reference(prompt_ids: list[int]) -> list[int]:
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_sampler

    from mlxd_engine.loading.cpu_weights import apply_cpu_weight_rule

    if not hasattr(mlx_lm_reference, "model"):
        model, _ = load(str(SMOLLM2))
        apply_cpu_weight_rule(model, choice="dequantized")
        mlx_lm_reference.model = model
    steps = generate_step(mx.array(prompt_ids), mlx_lm_reference.model, max_tokens=TOKENS, sampler=make_sampler(0.0))
    return [int(token) for token, _ in steps]


def test_daemon_greedy_equals_mlx_lm_plain_and_with_prompt_lookup():
    endpoint = private_endpoint()
    process = start_daemon(endpoint, "-m", str(SMOLLM2), "--max-batch", "2", timeout_s=300)
    try:
        with Client(endpoint, timeout_s=300) as client:
            accepted = 0
            for text in PROMPTS:
                prompt = client.tokenize(messages=[{"role": "user", "content": text}])
                reference = mlx_lm_reference(prompt)
                replies = {}
                for kind in ("none", "prompt-lookup"):
                    request = Generate(
                        id=new_request_id(),
                        prompt_tokens=prompt,
                        max_tokens=TOKENS,
                        ignore_eos=True,
                        speculative=Speculative(kind=kind),
                    )
                    replies[kind] = list(client.generate(request))[-1]
                assert replies["none"].tokens == reference, text
                assert replies["prompt-lookup"].tokens == reference, text
                accepted += replies["prompt-lookup"].timings.get("draft_n_accepted", 0)
        if accepted == 0:  # the copy prompt copies, yet no draft was verified
            pytest.xfail(
                "issue 40: with the CPU kernel's faster steps the verify gate declines every draft on "
                "SmolLM2 (greedy equality above still held)"
            )
    finally:
        stop_daemon(process, endpoint)
