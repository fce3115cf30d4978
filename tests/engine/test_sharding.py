"""What mlx-lm's sharding can split, checked before any weights are read (mlxd_engine.loading.sharding)."""

from __future__ import annotations

import pytest

from mlxd_engine import ModelLoadError
from mlxd_engine.loading.sharding import check_shardable, supported_modes

from .architectures import ARCHITECTURES, available, build


def test_the_embedded_qwen3_has_tensor_parallel_only(embedded_model):
    assert supported_modes(embedded_model.model) == ["tensor"]
    check_shardable(embedded_model.model, "tensor", 2, "qwen3")  # 4 attention and 4 KV heads
    with pytest.raises(ModelLoadError, match=r"has no pipeline parallel .*use --distributed tensor"):
        check_shardable(embedded_model.model, "pipeline", 2, "qwen3")


def test_heads_that_do_not_divide_are_refused_naming_the_count(embedded_model):
    with pytest.raises(ModelLoadError, match="num_attention_heads=4 does not split over 3 ranks"):
        check_shardable(embedded_model.model, "tensor", 3, "qwen3")


@pytest.mark.skipif(not available("deepseek_v3"), reason="the installed mlx-lm has no deepseek_v3")
def test_pipeline_needs_a_layer_per_rank():
    model = build("deepseek_v3")  # 2 layers; mlx-lm pipelines it
    assert "pipeline" in supported_modes(model)
    check_shardable(model, "pipeline", 2, "deepseek_v3")
    with pytest.raises(ModelLoadError, match="2 layers cannot be split over 3 ranks"):
        check_shardable(model, "pipeline", 3, "deepseek_v3", ARCHITECTURES["deepseek_v3"][1])


def test_an_unknown_mode_is_refused(embedded_model):
    with pytest.raises(ModelLoadError, match="unknown distributed mode 'data'"):
        check_shardable(embedded_model.model, "data", 2, "qwen3")
