"""Keys and values kept as float16 (``Engine(kv_dtype=mx.float16)``, ``mlxd --kv-dtype float16``).

Every forward reads the rounded values from storage, so the engine's own exactness holds as it does with a
float32 cache: rows batched equal each alone, prompt lookup's verify rounds give plain decode's tokens, on
contiguous and paged storage, sliding-window rings and recurrent state beside the KV. Against a float32
cache the logits differ by the rounding of keys and values only.
"""

from __future__ import annotations

import mlx.core as mx
import pytest

from mlxd_engine import Engine, kv_bytes_per_token
from mlxd_engine.storage.kv_dtype import parse_kv_dtype, stored_dtype

from .architectures import alone, available, batched, build, loaded, prompt, repeating_prompt

NEW_TOKENS = 24


def _kv_arrays(engine) -> list:
    storage = getattr(engine.storage, "inner", engine.storage)
    arrays = [a for a in storage.keys + storage.values if a is not None]
    rings = getattr(engine.storage, "rings", {})
    return arrays + [a for ring in rings.values() for a in (ring.keys, ring.values) if a is not None]


@pytest.mark.parametrize(
    "name, storage",
    [("llama", "contiguous"), ("llama", "paged"), ("qwen3", "paged"), ("gemma3_text", "contiguous"), ("lfm2", "paged")],
)
def test_a_float16_cache_keeps_batched_and_speculative_decode_exact(name, storage):
    from mlxd_scheduler.single_sequence import generate_with_prompt_lookup

    if not available(name):
        pytest.skip(f"the installed mlx-lm has no {name}")
    engine = Engine(loaded(name, model=build(name, seed=3)), max_sequences=4, storage=storage, kv_dtype=mx.float16)
    prompts = [prompt(length, seed) for seed, length in enumerate((230, 150, 90))]
    singles = [alone(engine, p, NEW_TOKENS) for p in prompts]
    arrays = _kv_arrays(engine)
    assert arrays and all(a.dtype == mx.float16 for a in arrays)
    assert batched(engine, prompts, NEW_TOKENS) == singles
    copying = repeating_prompt(200, 12, 1)
    looked_up = generate_with_prompt_lookup(engine, copying, NEW_TOKENS)
    assert looked_up.tokens == alone(engine, copying, NEW_TOKENS)
    assert looked_up.verify_rounds > 0  # drafts were verified (accepted, or unwound: both keep plain decode's tokens)
    assert generate_with_prompt_lookup(engine, prompts[0], NEW_TOKENS).tokens == singles[0]


def test_a_float16_cache_halves_the_kv_bytes_and_keeps_this_models_greedy_output():
    model = build("llama", seed=3)
    half = Engine(loaded("llama", model=model), max_sequences=2, kv_dtype=mx.float16)
    full = Engine(loaded("llama", model=model), max_sequences=2)
    tokens = prompt(230, 0)
    # this random model's greedy reply has no near-tie that the rounding of keys and values flips
    assert alone(half, tokens, NEW_TOKENS) == alone(full, tokens, NEW_TOKENS)
    from mlxd_scheduler.single_sequence import generate_with_prompt_lookup

    copying = repeating_prompt(200, 12, 1)
    looked_up = generate_with_prompt_lookup(half, copying, NEW_TOKENS)
    assert looked_up.accepted > 0 and looked_up.tokens == alone(full, copying, NEW_TOKENS)
    k16, k32 = _kv_arrays(half)[0], _kv_arrays(full)[0]
    assert k16.dtype == mx.float16 and k32.dtype == mx.float32 and k16.nbytes * 2 == k32.nbytes
    assert kv_bytes_per_token(half.loaded, kv_dtype=mx.float16) * 2 == kv_bytes_per_token(full.loaded)


def test_kv_dtype_names():
    assert parse_kv_dtype("float16") == mx.float16 and parse_kv_dtype("float32") is None
    with pytest.raises(ValueError, match="unknown KV dtype 'q8_0'; known: float32, float16"):
        parse_kv_dtype("q8_0")
    assert stored_dtype(mx.float16, mx.float32) == mx.float16
    assert stored_dtype(mx.float16, mx.bfloat16) == mx.bfloat16  # a half-precision model's cache as it is
    assert stored_dtype(None, mx.float32) == mx.float32


def _with_huge_keys_and_values(model, factor: float = 1e5):
    """``model`` with its k and v projections scaled so that some keys and values pass float16's range."""
    import mlx.nn as nn

    for name, module in model.named_modules():
        if name.endswith(("k_proj", "v_proj")) and isinstance(module, nn.Linear):
            module.weight = module.weight * factor
    mx.eval(model.parameters())
    return model


@pytest.mark.parametrize("name, storage", [("llama", "contiguous"), ("llama", "paged"), ("gemma3_text", "contiguous")])
def test_keys_and_values_past_float16s_range_saturate_instead_of_turning_attention_into_nan(name, storage):
    from mlxd_engine import SamplingParams, prefill_and_record
    from mlxd_engine.storage.kv_dtype import HALF_MAX

    if not available(name):
        pytest.skip(f"the installed mlx-lm has no {name}")
    model = _with_huge_keys_and_values(build(name, seed=3))
    full = Engine(loaded(name, model=model), max_sequences=2, storage=storage)
    half = Engine(loaded(name, model=model), max_sequences=2, storage=storage, kv_dtype=mx.float16)
    tokens = prompt(120, 0)
    alone(full, tokens, 4)
    assert max(mx.abs(a).max().item() for a in _kv_arrays(full)) > HALF_MAX  # the case this test is about
    alone(half, tokens, 4)  # prefill, then compiled and plain steps
    assert batched(half, [tokens, prompt(60, 1)], 4)  # rows at different positions: the one-op row writes
    arrays = _kv_arrays(half)
    assert all(a.dtype == mx.float16 and mx.isfinite(a).all().item() for a in arrays)
    assert max(mx.abs(a).max().item() for a in arrays) == HALF_MAX
    seq = half.add_sequence(tokens, SamplingParams(), 8)
    while prefill_and_record(half, seq) is None:
        pass
    logits = half.verify(seq, [seq.tokens[-1], 5, 6])  # a verify forward reads every stored key
    assert mx.isfinite(logits).all().item()
    half.release(seq)


def test_narrowing_rounds_in_range_values_as_a_cast_does():
    from mlxd_engine.storage.kv_dtype import HALF_MAX, narrowed

    x = mx.array([1.0001, -3.14159, 65519.0, 65520.0, -1e9, float("nan"), 6e-8])
    got = narrowed(x, mx.float16)
    assert got.dtype == mx.float16
    assert got[:3].tolist() == x[:3].astype(mx.float16).tolist() and got[6].item() == x[6:].astype(mx.float16).item()
    assert got[3:5].tolist() == [HALF_MAX, -HALF_MAX] and got[5].item() != got[5].item()  # NaN stays NaN
    assert narrowed(x, mx.float32) is x and narrowed(x, mx.bfloat16).dtype == mx.bfloat16
