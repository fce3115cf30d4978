"""mlx-generate --local on the default model's GGUF file equals the same on the shared mlx directory, token for token.

The GGUF is the one set-up downloads (``mlxd_engine.loading.default_model``); the test converts it afresh into a
private cache, so it checks the whole path a user takes: file -> conversion -> load -> CPU weight rule -> decode.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mlxd_engine.loading.default_model import downloaded_gguf

from ..model_paths import SMOLLM2

GGUF = downloaded_gguf()
PROMPTS = (
    "What is the capital of France?",
    "Repeat the following sentence exactly: the cat sat on the mat by the door.",
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        GGUF is None or not SMOLLM2.is_dir(),
        reason="needs the downloaded SmolLM2 GGUF (make setup) and the shared SmolLM2 directory",
    ),
]


def local_generate(model: str, prompt: str, cache: str) -> dict:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlxd_cli.generate",
            "--local",
            "-m",
            model,
            "--temp",
            "0",
            "--max-tokens",
            "32",
            "--json",
            prompt,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, MLXD_CACHE_DIR=cache),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


def test_gguf_file_and_shared_directory_generate_the_same_tokens(tmp_path):
    for prompt in PROMPTS:
        from_gguf = local_generate(str(GGUF), prompt, str(tmp_path))
        from_directory = local_generate(str(SMOLLM2), prompt, str(tmp_path))
        assert from_gguf["tokens"] == from_directory["tokens"], prompt
        assert from_gguf["text"] == from_directory["text"] and from_gguf["text"].strip()
    assert len(list((tmp_path / "gguf").iterdir())) == 1  # converted once, into the private cache
