"""Loading errors a user can cause get a clear message."""

from __future__ import annotations

import json

import pytest

from mlxd_engine import ModelLoadError, load


def test_missing_path(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load(tmp_path / "nowhere")


def test_directory_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match="no config.json"):
        load(tmp_path)


def test_unsupported_model_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    with pytest.raises(ModelLoadError, match="not supported"):
        load(tmp_path)


def test_stories_loads_with_facts(stories_model):
    assert stories_model.model_type == "llama"
    assert stories_model.n_layers == 5
    assert stories_model.vocab_size == 512
    assert 2 in stories_model.eos_token_ids
