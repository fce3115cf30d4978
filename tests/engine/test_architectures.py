"""The architecture matrix: every covered mlx-lm architecture is served token-equal to mlx-lm, or refused at load.

For each served case (tiny random weights, tests/engine/architectures.py), greedy:
- alone: 40 tokens from a 230-token prompt through the engine equal mlx-lm's own loop
  (``generate_step`` with an argmax sampler) on the same model object; the context passes the storage's
  first 256-token capacity chunk during decode and every sliding window (16 tokens);
- batched: three rows at different positions (prompts of 230, 150 and 90 tokens), stepped together,
  equal each row alone;
- prompt lookup: the single-sequence prompt-lookup loop equals plain decode, with drafts accepted (the
  random models repeat themselves).
The engine runs as it serves (CPU fusion on, which is bit-identical; a lone row's steps compiled, which
is within float tolerance): the comparison is token for token, and the seeds give margins far from a tie.
mlx-lm's loop runs first, on the model before the engine fuses its layers.

Each refused case (recurrent state, composites) raises ``ModelLoadError`` naming the cache class and the
model type when an engine is built for it, and never reaches a forward.
"""

from __future__ import annotations

import pytest

from .architectures import ARCHITECTURES, alone, available, batched, build, loaded, mlx_lm_greedy, prompt

SERVED = ["llama", "qwen3", "qwen3_moe", "gemma2", "gemma3_text", "gemma4_text", "gemma4_text_kv_shared", "gpt_oss",
          "deepseek_v3", "mistral3", "ministral3", "phi3", "olmo3", "smollm3", "llama4_text"]
# case -> (the first refused layer, the class it names)
REFUSED = {
    "qwen3_5": (0, "ArraysCache"),
    "qwen3_next": (0, "ArraysCache"),
    "lfm2": (0, "ArraysCache"),
    "granitemoehybrid": (0, "ArraysCache"),
    "falcon_h1": (0, "CacheList(ArraysCache, KVCache)"),
    "mamba2": (0, "ArraysCache"),
}
NEW_TOKENS = 40
PROMPT_LENGTHS = (230, 150, 90)


@pytest.mark.parametrize("name", SERVED)
def test_served_architecture(name):
    if not available(name):
        pytest.skip(f"the installed mlx-lm has no {ARCHITECTURES[name][0]}")
    from mlxd_engine import Engine
    from mlxd_scheduler.single_sequence import generate_with_prompt_lookup

    model = build(name, seed=3)
    prompts = [prompt(length, seed) for seed, length in enumerate(PROMPT_LENGTHS)]
    reference = mlx_lm_greedy(model, prompts[0], NEW_TOKENS)

    engine = Engine(loaded(name, model=model), max_sequences=4)
    assert engine.layout.refusal is None
    singles = [alone(engine, p, NEW_TOKENS) for p in prompts]
    assert singles[0] == reference, f"{name}: engine alone differs from mlx-lm's loop"
    assert engine.storage.capacity > 256  # the context grew past the first capacity chunk while decoding

    rows = batched(engine, prompts, NEW_TOKENS)
    for i, (row, single) in enumerate(zip(rows, singles)):
        assert row == single, f"{name}: batched row {i} (prompt of {PROMPT_LENGTHS[i]}) differs from it alone"

    looked_up = generate_with_prompt_lookup(engine, prompts[0], NEW_TOKENS)
    assert looked_up.tokens == singles[0], f"{name}: prompt lookup differs from plain decode"
    # the random model repeats itself, so verify rounds accepted drafts (and, in most cases, unwound some)
    assert looked_up.accepted > 0, (looked_up.verify_rounds, looked_up.drafted)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_architecture(name):
    if not available(name):
        pytest.skip(f"the installed mlx-lm has no {ARCHITECTURES[name][0]}")
    from mlxd_engine import Engine, ModelLoadError

    model = build(name)
    calls = []
    original = type(model).__call__
    type(model).__call__ = lambda self, *a, **k: calls.append(1) or original(self, *a, **k)
    try:
        with pytest.raises(ModelLoadError) as refused:
            Engine(loaded(name, model=model))
    finally:
        type(model).__call__ = original
    layer, cls = REFUSED[name]
    model_type = ARCHITECTURES[name][1]["model_type"]
    assert str(refused.value).startswith(f"model type {model_type!r}: layer {layer} uses {cls} (")
    assert "which mlxd's KV storage does not serve yet" in str(refused.value)
    assert not calls  # refused from the cache layout alone: no forward ran
