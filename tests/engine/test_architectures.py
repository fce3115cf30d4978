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
against mlx-lm and batched against alone; prompt lookup equals plain decode (a case per model where the
random model repeats itself, ``LOOKUP_CASES``), and so does decode after a partial accept (the state put
back and the kept tokens forwarded again). The
refused case (llama4's chunked attention) raises ``ModelLoadError`` naming the cache class and the model
type when an engine is built for it, and never reaches a forward.
"""

from __future__ import annotations

import pytest

from mlxd_engine import prefill_and_record, step_and_record

from .architectures import ARCHITECTURES, LOOKUP_CASES, alone, available, batched, build, loaded, mlx_lm_greedy, prompt

pytestmark = pytest.mark.integration  # every mlx-lm architecture end to end through the engine

SERVED = [
    "llama",
    "qwen3",
    "qwen3_moe",
    "gemma2",
    "gemma3_text",
    "gemma4_text",
    "gemma4_text_kv_shared",
    "gpt_oss",
    "deepseek_v3",
    "mistral3",
    "ministral3",
    "phi3",
    "olmo3",
    "smollm3",
    "llama4_text",
]
# recurrent state (ArraysCache) beside attention, or alone (mamba2): served, prompt lookup off
# falcon_h1: a CacheList of recurrent state and attention in every layer, served part by part
RECURRENT = ["qwen3_5", "qwen3_5_moe", "qwen3_next", "lfm2", "granitemoehybrid", "nemotron_h", "mamba2", "falcon_h1"]
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
    kv = getattr(engine.storage, "inner", engine.storage)  # sliding windows and state rows wrap the KV backend
    assert kv.capacity > 256  # the context grew past the first capacity chunk while decoding

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
    """Alone equals mlx-lm, rows batched at different positions equal each alone, prompt lookup equals
    plain decode with drafts accepted, and decode after a partial accept (state restored, the kept tokens
    forwarded again) equals plain decode."""
    if not available(name):
        pytest.skip(f"the installed mlx-lm has no {ARCHITECTURES[name][0]}")
    from mlxd_engine import Engine
    from mlxd_scheduler.single_sequence import generate_with_prompt_lookup

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

    looked_up = generate_with_prompt_lookup(engine, prompts[0], NEW_TOKENS)
    assert looked_up.tokens == singles[0], f"{name}: prompt lookup differs from plain decode"
    model_seed, lookup_prompt = LOOKUP_CASES[name]  # a case where the random model repeats itself
    copying = Engine(loaded(name, model=build(name, seed=model_seed)), max_sequences=1, storage=storage)
    looked_up = generate_with_prompt_lookup(copying, lookup_prompt(), NEW_TOKENS)
    assert looked_up.tokens == alone(copying, lookup_prompt(), NEW_TOKENS), f"{name}: prompt lookup differs"
    assert looked_up.accepted > 0, (looked_up.verify_rounds, looked_up.drafted)
    # a partial accept: the state goes back to before the verify and the kept tokens are forwarded again
    seq = engine.add_sequence(prompts[2])
    prefill_and_record(engine, seq)
    plain = alone(engine, prompts[2], 6)
    engine.verify(
        seq, [seq.tokens[-1], plain[1], (plain[2] + 1) % engine.loaded.vocab_size, 7]
    )  # accepts one draft, rejects the rest
    seq.tokens.extend(plain[1:3])
    engine.commit_appends(seq, 2)
    engine.unwind_appends(seq, 2)
    assert seq.kv.written == len(seq.tokens) - 1 and seq.kv.pending == 0
    for _ in range(3):
        step_and_record(engine, [seq])
    assert seq.output == plain, f"{name}: decode after a partial accept differs from plain decode"
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


def test_scheduler_runs_prompt_lookup_on_a_recurrent_model():
    """Through the batch scheduler: verify rounds run on recurrent state (restored and replayed on a
    partial accept), and the tokens equal plain decode."""
    from mlxd_drafters import PromptLookupConfig
    from mlxd_engine import Engine
    from mlxd_scheduler import BatchScheduler, Request, SchedulerOptions, SpeculativeRequest

    from ..scheduler.stub_model import VERIFY_PAYS
    from ..scheduler.test_batch_scheduler import Collector

    model_seed, lookup_prompt = LOOKUP_CASES["lfm2"]
    model = loaded("lfm2", model=build("lfm2", seed=model_seed))
    records = []
    engine = Engine(model, max_sequences=2)
    scheduler = BatchScheduler(engine, SchedulerOptions(prompt_lookup=PromptLookupConfig()), records.append)
    scheduler.prompt_lookup.cost_model = VERIFY_PAYS  # the gate pinned: verify rounds whatever this machine's speed
    out = Collector()
    tokens = lookup_prompt()
    scheduler.submit(Request("r", tokens, max_tokens=NEW_TOKENS, speculative=SpeculativeRequest(True)), out.sink("r"))
    scheduler.run_until_idle()
    assert out.done("r").tokens == alone(engine, tokens, NEW_TOKENS)
    verifies = [row for record in records for row in record.rows if row.action == "verify"]
    assert verifies and sum(row.accepted for row in verifies) > 0


def test_sliding_window_memory_is_bounded_by_the_window():
    """gemma3_text (half its layers sliding): past the window, the sliding layers' KV bytes stop growing,
    at 1K and at 4K tokens of context alike, and decode there still equals mlx-lm's loop."""
    from mlxd_engine import Engine

    model = build("gemma3_text", seed=3)
    engine = Engine(loaded("gemma3_text", model=model), max_sequences=1)
    usage = {}
    for context in (1024, 4000):
        seq = engine.add_sequence(prompt(context, 5))
        prefill_and_record(engine, seq)
        for _ in range(3):
            step_and_record(engine, [seq])
        usage[context] = engine.storage.usage()
        rings = list(engine.storage.rings.values())
        assert rings and all(
            ring.keys.shape[2] == ring.size == ring.window + engine.max_forward_tokens for ring in rings
        )
        if context == 1024:
            assert seq.output == mlx_lm_greedy(model, prompt(context, 5), 4)
        engine.release(seq)
    assert usage[1024]["sliding_window_bytes"] == usage[4000]["sliding_window_bytes"] > 0
    full_history = usage[4000]["allocated_bytes"] - usage[4000]["sliding_window_bytes"]  # the full-attention layers
    assert usage[4000]["sliding_window_bytes"] < full_history / 10
