"""The command-line tools as a user runs them: mlx-generate, mlx-inspect-tick, mlxd status/stop."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from mlxd_protocol import Client

from ..daemon.conftest import STORIES, private_endpoint, start_daemon, stop_daemon, stories_daemon  # noqa: F401

pytestmark = pytest.mark.skipif(not STORIES.is_dir(), reason=f"{STORIES} is not present")


def run(*args: str, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], input=stdin, capture_output=True, text=True, timeout=timeout)


def generate(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return run("mlxd_cli.generate", *args, **kwargs)


def test_generate_streams_text_and_stats(stories_daemon):  # noqa: F811 (the fixture imported above)
    result = generate("--endpoint", stories_daemon, "--max-tokens", "20", "Once upon a time")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(", there was a little girl")
    assert "20 tokens" in result.stderr and "tok/s" in result.stderr


def test_generate_json_and_stdin(stories_daemon):  # noqa: F811 (the fixture imported above)
    result = generate("--endpoint", stories_daemon, "--max-tokens", "12", "--json", "-", stdin="Once upon a time")
    assert result.returncode == 0, result.stderr
    reply = json.loads(result.stdout)
    assert len(reply["tokens"]) == 12 and reply["finish_reason"] == "length"
    assert reply["timings"]["predicted_n"] == 12 and reply["text"].startswith(", there was")


def test_generate_local_equals_daemon(stories_daemon):  # noqa: F811 (the fixture imported above)
    remote = json.loads(generate("--endpoint", stories_daemon, "--max-tokens", "16", "--json", "Lily").stdout)
    local = generate("--local", "-m", str(STORIES), "--max-tokens", "16", "--json", "Lily")
    assert local.returncode == 0, local.stderr
    assert json.loads(local.stdout)["tokens"] == remote["tokens"]


def test_generate_ignore_eos_runs_to_max_tokens():
    """The embedded model ends a copy with end-of-sequence; --ignore-eos keeps going to --max-tokens."""
    prompt = "Repeat the following sentence exactly: The cat sat on the mat."
    plain = generate("--local", "-m", "embedded", "--max-tokens", "24", "--json", prompt)
    assert plain.returncode == 0, plain.stderr
    plain_reply = json.loads(plain.stdout)
    assert plain_reply["finish_reason"] == "stop" and len(plain_reply["tokens"]) < 24
    forced = generate("--local", "-m", "embedded", "--max-tokens", "24", "--ignore-eos", "--json", prompt)
    assert forced.returncode == 0, forced.stderr
    forced_reply = json.loads(forced.stdout)
    assert forced_reply["finish_reason"] == "length" and len(forced_reply["tokens"]) == 24
    assert forced_reply["tokens"][: len(plain_reply["tokens"])] == plain_reply["tokens"]


def test_generate_bad_input_is_a_clean_error(stories_daemon):  # noqa: F811 (the fixture imported above)
    empty = generate("--endpoint", stories_daemon, "")
    assert empty.returncode != 0 and "empty" in empty.stderr and "Traceback" not in empty.stderr
    blank = generate("--endpoint", stories_daemon, "  \n")  # the protocol's prompt check, blank counted as empty
    assert blank.returncode == 2 and "prompt: must not be empty" in blank.stderr
    nobody = generate("--endpoint", private_endpoint(), "--no-autostart", "hi")
    assert nobody.returncode == 1 and "no daemon" in nobody.stderr.lower() or "timed out" in nobody.stderr.lower()
    assert "Traceback" not in nobody.stderr


def test_inspect_tick_json(stories_daemon):  # noqa: F811 (the fixture imported above)
    watcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlxd_cli.inspect_tick",
            "--endpoint",
            stories_daemon,
            "--json",
            "--count",
            "5",
            "--timeout",
            "60",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.5)  # let the subscription reach the daemon
    generate("--endpoint", stories_daemon, "--max-tokens", "30", "Once upon a time")
    out, err = watcher.communicate(timeout=60)
    assert watcher.returncode == 0, err
    ticks = [json.loads(line) for line in out.splitlines()]
    assert len(ticks) == 5
    assert {"tick", "batch", "pipelined", "rows", "duration_ms"} <= set(ticks[0])
    assert any(t["pipelined"] for t in ticks)


def test_status_and_stop_exit_codes():
    endpoint = private_endpoint()
    assert run("mlxd_daemon", "status", "--endpoint", endpoint).returncode == 1
    process = start_daemon(endpoint, "-m", str(STORIES))
    try:
        status = run("mlxd_daemon", "status", "--endpoint", endpoint, "--json")
        assert status.returncode == 0 and json.loads(status.stdout)["model"].endswith("stories260K")
        second = run("mlxd_daemon", "--endpoint", endpoint, "-m", str(STORIES))
        assert second.returncode == 1 and "already answers" in second.stderr
        assert run("mlxd_daemon", "stop", "--endpoint", endpoint).returncode == 0
        assert process.wait(timeout=20) == 0
    finally:
        stop_daemon(process, endpoint)
    socket_path = endpoint.removeprefix("ipc://")
    import os

    assert not os.path.exists(socket_path) and not os.path.exists(
        os.path.join(os.path.dirname(socket_path), "mlxd.pid")
    )


def test_public_bind_needs_the_flag():
    result = run("mlxd_daemon", "--endpoint", "tcp://0.0.0.0:47123", "-m", str(STORIES))
    assert result.returncode != 0 and "--allow-public" in result.stderr


def test_missing_model_is_a_clean_error():
    result = run("mlxd_daemon", "--endpoint", private_endpoint(), "-m", "/nonexistent/model")
    assert result.returncode == 2 and "does not exist" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_generate_autostarts_a_daemon_and_reuses_it():
    endpoint = private_endpoint()
    first = generate("--endpoint", endpoint, "-m", str(STORIES), "--max-tokens", "8", "Once upon a time", timeout=180)
    assert first.returncode == 0, first.stderr
    try:
        with Client(endpoint, timeout_s=5) as client:
            pid = client.status().pid
        second = generate("--endpoint", endpoint, "--max-tokens", "8", "Once upon a time")
        assert second.stdout == first.stdout
        with Client(endpoint, timeout_s=5) as client:
            assert client.status().pid == pid
    finally:
        run("mlxd_daemon", "stop", "--endpoint", endpoint)
