"""The float kernel's tiles of 3-6 rows, split or whole, chosen at load (mlxd_engine.loading.split_tiles)."""

from __future__ import annotations

import mlx.nn as nn
import pytest

import mlxd_qmatmul
from mlxd_engine.loading import split_tiles
from mlxd_engine.loading.kernel_layers import kernel_layers

from .tiny_llama import tiny_llama

pytestmark = pytest.mark.skipif(
    not mlxd_qmatmul.small_split_tiles_available(), reason="the float kernel splits small tiles only with AVX-512"
)


@pytest.fixture(autouse=True)
def whole_tiles_after():
    yield
    for bits in mlxd_qmatmul.BITS:
        mlxd_qmatmul.set_small_split_tiles(bits, False)


def test_the_load_times_both_forms_for_each_width_and_says_which_it_kept():
    from mlxd_engine.loading.cpu_weights import apply_cpu_weight_rule

    model = tiny_llama()
    nn.quantize(model, group_size=32, bits=4, class_predicate=lambda path, m: isinstance(m, nn.Linear))
    nn.quantize(model, group_size=64, bits=8)  # the embedding (and tied head): 8-bit
    form = apply_cpu_weight_rule(model, choice="kernel")
    assert "tiles of 3-6 rows: " in form.detail
    for bits in (4, 8):
        kept = "split" if mlxd_qmatmul.small_split_tiles(bits) else "whole"
        assert f"{bits}-bit {kept} (split / whole: 4 rows " in form.detail, form.detail


@pytest.mark.parametrize("asked", ["1", "0"])
def test_the_environment_sets_the_form_without_timing(monkeypatch, asked):
    model = tiny_llama()
    nn.quantize(model, group_size=32, bits=4)
    monkeypatch.setenv(split_tiles.ENV, asked)
    monkeypatch.setattr(split_tiles, "time_forms", lambda layers: pytest.fail("timed a form the environment set"))
    phrase = split_tiles.choose_split_tiles(kernel_layers(model))
    assert phrase == f"tiles of 3-6 rows: 4-bit {'split' if asked == '1' else 'whole'} ({split_tiles.ENV}={asked})"
    assert mlxd_qmatmul.small_split_tiles(4) == (asked == "1")


def test_another_value_in_the_environment_is_refused_by_name(monkeypatch):
    model = tiny_llama()
    nn.quantize(model, group_size=32, bits=4)
    monkeypatch.setenv(split_tiles.ENV, "yes")
    with pytest.raises(ValueError, match=split_tiles.ENV):
        split_tiles.choose_split_tiles(kernel_layers(model))


@pytest.mark.parametrize(
    ("ratios", "split"),
    [({4: 0.90, 6: 0.95}, True), ({4: 0.90, 6: 0.99}, False), ({4: 1.10, 6: 0.80}, False), ({4: 0.97, 6: 0.97}, True)],
)
def test_the_split_form_is_kept_where_it_gains_at_every_row_count_timed(monkeypatch, ratios, split):
    model = tiny_llama()
    nn.quantize(model, group_size=32, bits=4)
    monkeypatch.delenv(split_tiles.ENV, raising=False)
    monkeypatch.setattr(split_tiles, "time_forms", lambda layers: ratios)
    phrase = split_tiles.choose_split_tiles(kernel_layers(model))
    assert phrase.startswith(f"tiles of 3-6 rows: 4-bit {'split' if split else 'whole'} (split / whole: 4 rows ")
    assert mlxd_qmatmul.small_split_tiles(4) == split


def test_timing_leaves_the_whole_form_set_and_gives_a_ratio_for_each_row_count():
    model = tiny_llama()
    nn.quantize(model, group_size=32, bits=4)
    mlxd_qmatmul.set_small_split_tiles(4, True)
    ratios = split_tiles.time_forms(kernel_layers(model))
    timed = split_tiles.AMX_ROWS if mlxd_qmatmul.amx_available() else split_tiles.ROWS  # 6 rows on AMX's tiles
    assert set(ratios) == set(timed) and all(0 < r < 10 for r in ratios.values())
    assert not mlxd_qmatmul.small_split_tiles(4)


@pytest.mark.skipif(not mlxd_qmatmul.int8_available(4), reason="no int8-activation kernel here")
def test_layers_on_the_int8_kernel_leave_nothing_to_choose():
    model = tiny_llama()
    nn.quantize(model, group_size=32, bits=4)
    assert split_tiles.choose_split_tiles(kernel_layers(model), int8_activations=True) == ""


def test_a_daemon_load_with_another_value_fails_with_a_message_that_names_it(tmp_path, monkeypatch):
    """A checkpoint on the kernel, loaded as mlxd loads it: the choice is logged in the weights' line, and a value
    of MLXD_SMALL_SPLIT_TILES the loader does not take ends the load with a ModelLoadError that names it."""
    import json

    from mlx_lm.utils import load_tokenizer, save

    from mlxd_daemon.model_setup import load_for_serving
    from mlxd_daemon.options import DaemonOptions
    from mlxd_engine import ModelLoadError
    from mlxd_engine.loading.loader import embedded_model_path

    from .tiny_llama import TINY_LLAMA

    source = embedded_model_path()
    vocab = json.loads((source / "config.json").read_text())["vocab_size"]
    model = tiny_llama(seed=4, vocab_size=vocab)
    nn.quantize(model, group_size=32, bits=4)
    config = {**TINY_LLAMA, "vocab_size": vocab, "quantization": {"group_size": 32, "bits": 4}}
    save(tmp_path, source, model, load_tokenizer(source), config)

    monkeypatch.setenv(split_tiles.ENV, "1")
    loaded = load_for_serving(DaemonOptions(model=str(tmp_path), cpu_weights="kernel"))
    assert f"tiles of 3-6 rows: 4-bit split ({split_tiles.ENV}=1)" in loaded.weights, loaded.weights
    monkeypatch.setenv(split_tiles.ENV, "on")
    with pytest.raises(ModelLoadError, match=f"{split_tiles.ENV}='on'"):
        load_for_serving(DaemonOptions(model=str(tmp_path), cpu_weights="kernel"))


def test_a_ratio_near_the_margin_is_timed_again_and_the_mean_decides(monkeypatch):
    model = tiny_llama()
    nn.quantize(model, group_size=32, bits=4)
    monkeypatch.delenv(split_tiles.ENV, raising=False)
    timings = iter([{4: 0.90, 6: 0.98}, {4: 0.90, 6: 0.94}, {4: 0.80, 6: 0.90}])
    monkeypatch.setattr(split_tiles, "time_forms", lambda layers: next(timings))
    phrase = split_tiles.choose_split_tiles(kernel_layers(model))  # 6 rows: 0.98, near 0.97, then (0.98 + 0.94) / 2
    assert phrase == "tiles of 3-6 rows: 4-bit split (split / whole: 4 rows 0.900, 6 rows 0.960)"
    assert mlxd_qmatmul.small_split_tiles(4)
    assert next(timings) == {4: 0.80, 6: 0.90}  # timed twice, not three times
