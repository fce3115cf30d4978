"""The mlxd options mlx-serve-http passes to a daemon it starts."""

from __future__ import annotations

from mlxd_cli.serve_http.main import daemon_args


def test_only_the_options_given_are_passed():
    assert daemon_args(None, None, None) == []
    assert daemon_args("prompt-lookup", 4, None, shared_drafts=False) == [
        "--draft-kind",
        "prompt-lookup",
        "--draft-block-size",
        "4",
        "--no-shared-drafts",
    ]
    assert daemon_args(None, None, None, shared_drafts=True) == ["--shared-drafts"]
    assert daemon_args(None, None, None, kv_dtype="float16") == ["--kv-dtype", "float16"]
    assert daemon_args(None, None, None, cpu_weights="kernel-int8") == ["--cpu-weights", "kernel-int8"]
