"""A tiny llama from mlx-lm's own classes with random weights, for the tests that quantize it their way."""

from __future__ import annotations

import mlx.core as mx

TINY_LLAMA = dict(
    model_type="llama",
    hidden_size=128,
    num_hidden_layers=2,
    intermediate_size=256,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
    vocab_size=300,
    tie_word_embeddings=True,
)  # its config (a checkpoint's config.json takes it, with the vocabulary of the tokenizer saved beside it)


def tiny_llama(seed: int = 7, vocab_size: int = TINY_LLAMA["vocab_size"]):
    """Hidden 128, two layers, a 300-token vocabulary (or ``vocab_size``), tied embeddings; float32, not yet
    evaluated."""
    from mlx_lm.models import llama

    mx.random.seed(seed)
    return llama.Model(llama.ModelArgs.from_dict({**TINY_LLAMA, "vocab_size": vocab_size}))


def tiny_llama_loaded(model, path: str = "<tiny llama>"):
    """``model`` (a ``tiny_llama``, quantized or not) as the engine takes it: a ``LoadedModel`` without a
    tokenizer or end-of-sequence tokens."""
    from mlxd_engine import LoadedModel
    from mlxd_engine.cache_layout import model_layers

    return LoadedModel(
        model=model,
        tokenizer=None,
        path=path,
        model_type="llama",
        n_layers=len(model_layers(model)),
        vocab_size=model.args.vocab_size,
        eos_token_ids=frozenset(),
        context_length=4096,
    )
