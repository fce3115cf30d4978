"""Shared fixtures: model locations and small models built in the test (never a hub download)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .markers import check_every_test_has_a_kind, mark_directory
from .model_paths import STORIES_260K

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def stories_model():
    from mlxd_engine import load

    if not STORIES_260K.is_dir():
        pytest.skip(f"{STORIES_260K} is not present")
    return load(STORIES_260K)


@pytest.fixture(scope="session")
def embedded_model():
    from mlxd_engine import embedded_model_path, load

    return load(embedded_model_path())


@pytest.fixture(scope="session")
def tiny_random_model():
    """A 2-layer qwen3 with random weights and no tokenizer: for shape and batching checks."""
    import mlx.core as mx
    from mlx_lm.models import qwen3

    from mlxd_engine import LoadedModel

    mx.random.seed(7)
    args = qwen3.ModelArgs(
        model_type="qwen3",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=4,
        rms_norm_eps=1e-6,
        vocab_size=97,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        head_dim=16,
        tie_word_embeddings=True,
        rope_theta=10000.0,
    )
    model = qwen3.Model(args)
    mx.eval(model.parameters())
    return LoadedModel(
        model=model,
        tokenizer=None,
        path="<random>",
        model_type="qwen3",
        n_layers=2,
        vocab_size=97,
        eos_token_ids=frozenset({0}),
        context_length=4096,
    )


def pytest_collection_modifyitems(items):
    mark_directory(items, __file__, "unit")


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    check_every_test_has_a_kind(session.items)
