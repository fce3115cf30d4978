"""The cache layout at load: refusals with a clear message (engine, ``load``, the daemon), model facts read
robustly (wrapped configs, context length, KV bytes in the weights' dtype), the batched mask form."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import tempfile

import pytest

from ..conftest import STORIES_260K
from .architectures import ARCHITECTURES, alone, batched, build, loaded, prompt


class MadeUpCache:
    """A cache class mlxd has never heard of."""

    offset = 0


def _made_up_cache_model():
    import mlx.core as mx
    from mlx_lm.models import llama

    class Model(llama.Model):
        def make_cache(self):
            return [MadeUpCache() for _ in self.layers]

    mx.random.seed(0)
    model = Model(llama.ModelArgs.from_dict(ARCHITECTURES["llama"][1]))
    mx.eval(model.parameters())
    return model


def test_a_composite_with_an_unserved_part_is_refused():
    from mlx_lm.models.cache import CacheList, KVCache

    from mlxd_engine import Engine, ModelLoadError

    model = _made_up_cache_model()
    type(model).make_cache = lambda self: [CacheList(KVCache(), MadeUpCache()) for _ in self.layers]
    with pytest.raises(
        ModelLoadError,
        match=r"^model type 'llama': layer 0 uses CacheList\(KVCache, MadeUpCache\) "
        r"\(a composite of caches one of which is not served\)",
    ):
        Engine(loaded("llama", model=model))


def test_a_made_up_cache_class_is_refused_by_name():
    from mlxd_engine import Engine, ModelLoadError

    with pytest.raises(ModelLoadError) as refused:
        Engine(loaded("llama", model=_made_up_cache_model()))
    assert str(refused.value) == (
        "model type 'llama': layer 0 uses MadeUpCache (a cache class mlxd does not know), "
        "which mlxd's KV storage does not serve yet"
    )


def _checkpoint(tmp_path, name: str, tokenizer_edit=None):
    """A loadable mlx-lm directory: the case's config and random weights, stories260K's tokenizer."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    if not STORIES_260K.is_dir():
        pytest.skip(f"{STORIES_260K} is not present (its tokenizer is borrowed)")
    directory = tmp_path / name
    directory.mkdir(parents=True)
    model = build(name)
    mx.save_safetensors(str(directory / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (directory / "config.json").write_text(json.dumps(ARCHITECTURES[name][1]))
    for file in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(STORIES_260K / file, directory / file)
    if tokenizer_edit is not None:
        config = json.loads((directory / "tokenizer_config.json").read_text())
        tokenizer_edit(config)
        (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def test_load_refuses_chunked_attention(tmp_path):
    from mlxd_engine import ModelLoadError, load

    with pytest.raises(
        ModelLoadError,
        match=r"^model type 'llama4': layer 0 uses ChunkedKVCache \(chunked attention\), "
        r"which mlxd's KV storage does not serve yet$",
    ):
        load(_checkpoint(tmp_path, "llama4"))


@pytest.mark.integration  # starts a process
def test_daemon_exits_before_ready_on_a_refused_model(tmp_path):
    directory = _checkpoint(tmp_path, "llama4")
    endpoint = f"ipc://{tempfile.mkdtemp(prefix='mlxd-t-', dir='/tmp')}/d.sock"
    result = subprocess.run(
        [sys.executable, "-m", "mlxd_daemon", "--endpoint", endpoint, "-m", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "mlxd ready" not in result.stdout
    assert "model type 'llama4': layer 0 uses ChunkedKVCache (chunked attention)" in result.stderr


def test_wrapped_config_loads_with_its_facts(tmp_path):
    from mlxd_engine import load
    from mlxd_engine.cache_layout import kv_bytes_per_token

    model = load(_checkpoint(tmp_path, "mistral3"))
    assert (model.model_type, model.n_layers, model.vocab_size) == ("mistral3", 2, 128)
    assert (model.context_length, model.context_source) == (4096, "config")  # from text_config
    assert kv_bytes_per_token(model) == 2 * 2 * 2 * 16 * 4  # layers x (K, V) x kv heads x head_dim x float32


def test_context_length_without_max_position_embeddings_is_logged(tmp_path, caplog):
    from mlxd_engine import Engine, load

    assert "max_position_embeddings" not in ARCHITECTURES["gemma2"][1]
    with caplog.at_level(logging.WARNING, logger="mlxd.engine"):
        from_tokenizer = load(_checkpoint(tmp_path, "gemma2"))
    assert (from_tokenizer.context_length, from_tokenizer.context_source) == (512, "tokenizer")
    assert "model_max_length, 512 tokens" in caplog.text

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mlxd.engine"):
        guessed = load(_checkpoint(tmp_path / "b", "gemma2", lambda config: config.pop("model_max_length")))
    assert (guessed.context_length, guessed.context_source) == (8192, "fallback")
    assert "serving at most 8192 tokens per sequence" in caplog.text
    assert Engine(guessed, max_kv_size=20000).max_kv_size == 20000  # a guess does not cap the caller's figure
    assert Engine(from_tokenizer, max_kv_size=20000).max_kv_size == 512


def test_kv_bytes_follow_the_weights_dtype_and_each_cache_entry():
    import mlx.core as mx
    from mlx.utils import tree_map

    from mlxd_engine.cache_layout import kv_bytes_per_token

    full = loaded("qwen3")
    assert kv_bytes_per_token(full) == 2 * 2 * 2 * 16 * 4
    half_model = build("qwen3")
    half_model.update(tree_map(lambda a: a.astype(mx.float16), half_model.parameters()))
    assert kv_bytes_per_token(loaded("qwen3", model=half_model)) == 2 * 2 * 2 * 16 * 2
    # gemma4 with KV sharing: two cache entries for four layers, 1 KV head of 16 (sliding) and of 32 (global)
    assert kv_bytes_per_token(loaded("gemma4_text_kv_shared")) == 2 * 16 * 4 + 2 * 32 * 4


def test_mask_form_follows_the_attention():
    """gemma2 splits the heads into 5-D scores and takes [B, 1, 1, n, L] masks; the rest take [B, 1, n, L]."""
    assert loaded("gemma2").layout().mask_axes == 5
    assert loaded("llama").layout().mask_axes == 4
    assert loaded("deepseek_v3").layout().mask_axes == 4


def test_a_model_whose_rows_no_mask_keeps_apart_runs_rows_one_at_a_time(monkeypatch):
    """Where no batched mask form works the engine forwards rows one at a time, and still matches them alone."""
    from mlxd_engine import Engine

    model = loaded("llama")
    model.layout().mask_axes = None  # as the probe leaves it for such a model
    engine = Engine(model, max_sequences=2, compile_decode=False)  # every forward is a call of the model
    prompts = [prompt(30, 1), prompt(20, 2)]
    singles = [alone(engine, p, 8) for p in prompts]
    batch_sizes = []
    original = type(model.model).__call__
    monkeypatch.setattr(
        type(model.model),
        "__call__",
        lambda self, inputs, cache=None: batch_sizes.append(inputs.shape[0]) or original(self, inputs, cache),
    )
    assert batched(engine, prompts, 8) == singles
    assert batch_sizes and set(batch_sizes) == {1}
    assert len(batch_sizes) == 2 + 2 * 7  # two prefills, then seven steps of two rows, each row on its own
