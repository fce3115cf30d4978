"""Against a real checkpoint nobody here wrote: the engine's greedy loop equals mlx-lm's generation.

The reference runs on the checkpoint as mlx-lm itself loads it (stock layers), the engine on ours (fused
RMSNorm and RoPE on the CPU), so the comparison also covers the fusion."""

from __future__ import annotations

import mlx_lm
from mlx_lm import generate, stream_generate

from mlxd_engine import Engine
from mlxd_scheduler import generate_plain


def test_greedy_once_upon_a_time_equals_mlx_lm(stories_model):
    reference_model, tokenizer = mlx_lm.load(stories_model.path)
    prompt = tokenizer.encode("Once upon a time")
    reference_ids = [r.token for r in stream_generate(reference_model, tokenizer, prompt=prompt, max_tokens=64)]
    reference_text = generate(reference_model, tokenizer, prompt=prompt, max_tokens=64)

    engine = Engine(stories_model, max_sequences=1)
    result = generate_plain(engine, prompt, max_tokens=64)
    assert len(result.tokens) == 64
    assert result.tokens == reference_ids
    assert stories_model.tokenizer.decode(result.tokens) == reference_text
