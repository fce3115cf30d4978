"""Several API keys (``--api-key a,b`` and ``--api-key-file``, as llama-server takes them): each is let in, and
each key's requests draft from a shared store of their own in the daemon (``draft_keys``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mlxd_cli.serve_http.draft_keys import key_id
from mlxd_cli.serve_http.main import joined_api_keys
from mlxd_cli.serve_http.settings import Settings
from mlxd_protocol import Client

from .conftest import Gateway

PARK = "Lily and Ben went to the park."
BODY = {"prompt": PARK, "n_predict": 24, "temperature": 0, "ignore_eos": True, "speculative": {"kind": "prompt-lookup"}}


def _store_counts(endpoint: str) -> dict:
    with Client(endpoint) as daemon:
        return daemon.status().memory["shared_drafts"]


def test_each_key_is_let_in_and_drafts_from_its_own_store(stories_endpoint, tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("gamma\n\n")
    gateway = Gateway([stories_endpoint], "--api-key", "alpha, beta", "--api-key-file", str(keys))
    try:
        post = gateway.client.post
        assert post("/completion", json=BODY).status_code == 401
        assert post("/completion", json=BODY, headers={"Authorization": "Bearer alpha, beta"}).status_code == 401
        assert post("/completion", json=BODY, headers={"Authorization": "Bearer delta"}).status_code == 401
        before = _store_counts(stories_endpoint)
        contents = []
        for headers in (
            {"Authorization": "Bearer alpha"},
            {"Authorization": "Bearer beta"},
            {"x-api-key": "gamma"},
            {"x-api-key": "alpha"},
        ):
            response = post("/completion", json=BODY, headers=headers)
            assert response.status_code == 200, response.text
            contents.append(response.json()["content"])
        assert len(set(contents)) == 1  # drafts never change the output
        after = _store_counts(stories_endpoint)
        assert after["stores"] == before["stores"] + 3  # alpha's, beta's and gamma's
        assert after["documents"] == before["documents"] + 4
    finally:
        gateway.stop()


def test_keys_are_named_to_the_daemon_without_the_key():
    assert key_id("alpha") == key_id("alpha") != key_id("beta")
    assert "alpha" not in key_id("alpha")
    assert Settings(daemons=["ipc:///x"], api_key=" a ,b,,a").api_keys == ("a", "b")
    assert Settings(daemons=["ipc:///x"]).api_keys == ()


def test_the_key_file_joins_the_command_lines_keys(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("one\n  two  \n\n")
    assert joined_api_keys("zero", str(keys)) == "zero,one,two"
    assert joined_api_keys(None, str(keys)) == "one,two"
    assert joined_api_keys("zero", None) == "zero"
    keys.write_text("a,b\n")
    with pytest.raises(ValueError, match="comma"):
        joined_api_keys(None, str(keys))
    with pytest.raises(ValueError, match="cannot read"):
        joined_api_keys(None, str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="no key"):
        joined_api_keys(" , ", None)


def test_an_unreadable_key_file_is_a_clear_cli_error(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mlxd_cli.serve_http.main", "--daemon", "ipc:///nowhere"]
        + ["--api-key-file", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "--api-key-file" in result.stderr
