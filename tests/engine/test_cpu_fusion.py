"""Fused RMSNorm / RoPE on the CPU: same logits bit for bit, in every kind of forward the engine runs."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.models.cache import make_prompt_cache

from mlxd_engine import Engine, load, prefill_and_record, read_and_record
from mlxd_engine.cpu_fusion import MAX_FUSED_ROPE_TOKENS, FusedRMSNorm, FusedRoPE, fuse_cpu_layers, fusion_wanted


@pytest.fixture()
def stock_and_fused(embedded_model):
    """Two copies of the embedded model from disk: one left stock, one fused."""
    stock = load(embedded_model.path)
    fused = load(embedded_model.path)
    assert fuse_cpu_layers(fused.model) == 11  # 2 layers x (2 norms + q/k norms) + final norm, 2 RoPE
    return stock, fused


def test_swaps_exact_classes_only_and_is_idempotent():
    class OwnNorm(nn.RMSNorm):
        pass

    model = nn.Sequential(nn.RMSNorm(8), OwnNorm(8), nn.RoPE(8), nn.Linear(8, 8))
    assert fuse_cpu_layers(model) == 2
    assert [type(m) for m in model.layers] == [FusedRMSNorm, OwnNorm, FusedRoPE, nn.Linear]
    assert fuse_cpu_layers(model) == 2
    assert set(dict(model.parameters()["layers"][0])) == {"weight"}


def test_disabled_by_environment(monkeypatch):
    monkeypatch.setenv("MLXD_FUSE_CPU_LAYERS", "0")
    assert not fusion_wanted()
    monkeypatch.setenv("MLXD_FUSE_CPU_LAYERS", "1")
    assert fusion_wanted() == (mx.default_device() == mx.cpu)


def test_prefill_and_decode_logits_are_bit_identical(stock_and_fused):
    stock, fused = stock_and_fused
    prompt = stock.tokenizer.encode("Repeat the following paragraph exactly: the cat sat on the mat.")
    caches = [make_prompt_cache(stock.model), make_prompt_cache(fused.model)]
    # a long prompt chunk (stock RoPE path), a short one (fused path), then single-token steps
    chunks = [prompt[:-5], prompt[-5:]] + [[t] for t in (11, 250, 7, 1999)]
    assert len(chunks[0]) > MAX_FUSED_ROPE_TOKENS
    for chunk in chunks:
        a = stock.model(mx.array([chunk]), cache=caches[0])
        b = fused.model(mx.array([chunk]), cache=caches[1])
        assert mx.array_equal(a, b).item(), f"logits differ after a chunk of {len(chunk)}"


def test_batched_rows_at_different_positions_are_bit_identical(stock_and_fused):
    stock, fused = stock_and_fused
    tokenizer = stock.tokenizer
    prompts = [tokenizer.encode(t) for t in ("Copy this text: hello world", "The Python standard library", "a")]
    results = []
    for loaded, fuse in ((stock, False), (fused, True)):
        engine = Engine(loaded, max_sequences=4, fuse_cpu_layers=fuse)
        assert (engine.fused_layers > 0) == fuse
        seqs = [engine.add_sequence(p) for p in prompts]
        for seq in seqs:
            prefill_and_record(engine, seq)
        handle = engine.submit_step(seqs)  # three rows, three offsets: RoPE gets an offset array
        read_and_record(engine, handle)
        verify = engine.verify(seqs[0], [seqs[0].tokens[-1], 5, 6, 7])  # a 4-token verify forward
        results.append((handle.logits, verify))
    assert mx.array_equal(results[0][0], results[1][0]).item()
    assert mx.array_equal(results[0][1], results[1][1]).item()
