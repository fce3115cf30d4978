"""A tiny llama from mlx-lm's own classes with random weights, for the tests that quantize it their way."""

from __future__ import annotations

import mlx.core as mx


def tiny_llama(seed: int = 7):
    """Hidden 128, two layers, a 300-token vocabulary, tied embeddings; float32, not yet evaluated."""
    from mlx_lm.models import llama

    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=128,
        num_hidden_layers=2,
        intermediate_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=300,
        tie_word_embeddings=True,
    )
    mx.random.seed(seed)
    return llama.Model(args)
