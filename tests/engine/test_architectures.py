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
is within float tolerance): the comparison is token for token, so a near tie between two logits would show
here as a failure rather than be hidden (none does with these seeds).
mlx-lm's loop runs first, on the model before the engine fuses its layers.

Recurrent cases (ArraysCache: qwen3_5, qwen3_next, lfm2, granitemoehybrid, nemotron_h, mamba2; falcon_h1's
CacheList of state and attention) are served the same way on both storage backends, alone (contiguous)
against mlx-lm and batched against alone; prompt lookup is off for them (their state cannot unwind). The
refused case (llama4's chunked attention) raises ``ModelLoadError`` naming the cache class and the model
type when an engine is built for it, and never reaches a forward.
"""

from __future__ import annotations

import pytest

from .architectures import ARCHITECTURES, alone, available, batched, build, loaded, mlx_lm_greedy, prompt

SERVED = ["llama", "qwen3", "qwen3_moe", "gemma2", "gemma3_text", "gemma4_text", "gemma4_text_kv_shared", "gpt_oss",
          "deepseek_v3", "mistral3", "ministral3", "phi3", "olmo3", "smollm3", "llama4_text"]
# recurrent state (ArraysCache) beside attention, or alone (mamba2): served, prompt lookup off
# falcon_h1: a CacheList of recurrent state and attention in every layer, served part by part
RECURRENT = ["qwen3_5", "qwen3_next", "lfm2", "granitemoehybrid", "nemotron_h", "mamba2", "falcon_h1"]
# case -> (the first refused layer, the class it names)
REFUSED = {
    "llama4": (0, "ChunkedKVCache"),
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


@pytest.mark.parametrize("name", RECURRENT)
@pytest.mark.parametrize("storage", ["contiguous", "paged"])
def test_recurrent_architecture(name, storage):
    """Alone equals mlx-lm, rows batched at different positions equal each alone; prompt lookup is off
    (the state cannot unwind) with the predicate's reason, and an unwind is refused, not done wrong."""
    if not available(name):
        pytest.skip(f"the installed mlx-lm has no {ARCHITECTURES[name][0]}")
    from mlxd_engine import Engine, SamplingParams, prompt_lookup_eligibility

    model = build(name, seed=3)
    prompts = [prompt(length, seed) for seed, length in enumerate(PROMPT_LENGTHS)]
    reference = mlx_lm_greedy(model, prompts[0], NEW_TOKENS) if storage == "contiguous" else None
    engine = Engine(loaded(name, model=model), max_sequences=4, storage=storage)
    singles = [alone(engine, p, NEW_TOKENS) for p in prompts]
    if reference is not None:
        assert singles[0] == reference, f"{name}: engine alone differs from mlx-lm's loop"
    rows = batched(engine, prompts, NEW_TOKENS)
    for i, (row, single) in enumerate(zip(rows, singles)):
        assert row == single, f"{name}: batched row {i} (prompt of {PROMPT_LENGTHS[i]}) differs from it alone"

    assert not engine.can_unwind
    verdict = prompt_lookup_eligibility(SamplingParams(), storage_can_unwind=engine.can_unwind)
    assert not verdict and "unwind" in verdict.reason
    seq = engine.add_sequence(prompts[2])
    engine.prefill(seq)
    engine.verify(seq, [seq.tokens[-1], 5, 6])
    with pytest.raises(ValueError, match="recurrent state cannot unwind"):
        engine.unwind_appends(seq, 2)
    engine.release(seq)


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


def test_scheduler_serves_a_recurrent_model_plainly_when_prompt_lookup_is_asked():
    """Through the batch scheduler: prompt lookup asked, the reason it is off reaches the tick trace, the
    tokens equal plain decode, and no verify round runs."""
    from mlxd_drafters import PromptLookupConfig
    from mlxd_engine import Engine
    from mlxd_scheduler import BatchScheduler, Request, SchedulerOptions, SpeculativeRequest

    from ..scheduler.test_batch_scheduler import Collector

    model = loaded("qwen3_5", model=build("qwen3_5", seed=3))
    records = []
    engine = Engine(model, max_sequences=2)
    scheduler = BatchScheduler(engine, SchedulerOptions(prompt_lookup=PromptLookupConfig()), records.append)
    out = Collector()
    tokens = prompt(PROMPT_LENGTHS[2], 2)
    scheduler.submit(Request("r", tokens, max_tokens=NEW_TOKENS, speculative=SpeculativeRequest(True)), out.sink("r"))
    scheduler.run_until_idle()
    assert out.done("r").tokens == alone(engine, tokens, NEW_TOKENS)
    actions = [row for record in records for row in record.rows]
    first = [row for row in actions if row.action == "first-token"]
    assert first[0].detail == "prompt lookup off: KV storage cannot unwind speculative appends"
    assert not any(row.action == "verify" for row in actions)
