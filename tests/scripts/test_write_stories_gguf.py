"""stories260K written as a GGUF file (``scripts/write_stories_gguf.py``) and served back through mlxd's own GGUF
import: the same tokens and the same greedy output as the checkpoint it was written from."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ..model_paths import STORIES_260K

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import llama_server_compat as compat  # noqa: E402
import write_stories_gguf as writer  # noqa: E402

TEXTS = ["Once upon a time", "Lily and Ben went to the park.", "  two  spaces\nand a line", "émoji 🙂 1234"]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    if not STORIES_260K.is_dir():
        pytest.skip(f"{STORIES_260K} is not present")
    return writer.write_gguf(STORIES_260K, tmp_path_factory.mktemp("gguf") / "stories260K.gguf")


def test_the_gguf_copy_serves_the_same_model(written, stories_model, tmp_path, monkeypatch):
    import mlx.core as mx
    from mlx_lm import generate

    from mlxd_engine import load

    monkeypatch.setenv("MLXD_CACHE_DIR", str(tmp_path))  # the import's converted directory goes here
    copy = load(written)
    assert copy.path == str(written)  # reported as the GGUF file, not its converted directory
    for text in TEXTS:
        assert list(copy.tokenizer.encode(text)) == list(stories_model.tokenizer.encode(text))
    ids = mx.array([list(stories_model.tokenizer.encode(TEXTS[1]))])
    assert mx.allclose(copy.model(ids), stories_model.model(ids), atol=1e-4).item()
    assert generate(copy.model, copy.tokenizer, prompt=TEXTS[0], max_tokens=48) == generate(
        stories_model.model, stories_model.tokenizer, prompt=TEXTS[0], max_tokens=48
    )


def test_a_checkpoint_it_cannot_write_is_refused(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "qwen3"}')
    with pytest.raises(ValueError, match="rope_traditional"):
        writer.write_gguf(tmp_path, tmp_path / "x.gguf")


def test_the_launcher_serves_the_hub_model_as_a_gguf_copy_written_once(tmp_path, monkeypatch):
    if not STORIES_260K.is_dir():
        pytest.skip(f"{STORIES_260K} is not present")
    monkeypatch.setenv("MLXD_CACHE_DIR", str(tmp_path))
    args = compat.parse_llama_args(["--hf-repo", "ggml-org/test-model-stories260K"])
    served, checkpoint = compat.resolve_model(args)
    assert served.suffix == ".gguf" and served.is_file() and served.is_relative_to(tmp_path)
    assert checkpoint == compat.STORIES_260K
    written_at = served.stat().st_mtime_ns
    assert compat.resolve_model(args)[0] == served and served.stat().st_mtime_ns == written_at
    # the checkpoint has no chat template: the GGUF served gets llama-server's chatml fallback
    command = compat.daemon_command(args, served, "ipc:///tmp/x.sock", checkpoint)
    assert command[command.index("--chat-template") + 1] == "chatml"
