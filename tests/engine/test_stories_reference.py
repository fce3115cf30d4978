"""Against a real checkpoint nobody here wrote: the engine's greedy loop equals mlx-lm's generation."""

from __future__ import annotations

from mlx_lm import generate, stream_generate

from mlxd_engine import Engine
from mlxd_scheduler import generate_plain


def test_greedy_once_upon_a_time_equals_mlx_lm(stories_model):
    tokenizer = stories_model.tokenizer
    prompt = tokenizer.encode("Once upon a time")
    reference_ids = [r.token for r in stream_generate(stories_model.model, tokenizer, prompt=prompt, max_tokens=64)]
    reference_text = generate(stories_model.model, tokenizer, prompt=prompt, max_tokens=64)

    engine = Engine(stories_model, max_sequences=1)
    result = generate_plain(engine, prompt, max_tokens=64)
    assert len(result.tokens) == 64
    assert result.tokens == reference_ids
    assert tokenizer.decode(result.tokens) == reference_text
