"""With an auth token, the tick-trace socket serves only subscribers that log in with it (mlx-inspect-tick
included); without one it serves anyone who can reach it, as before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from mlxd_protocol import Client, DaemonTimeout, Generate
from mlxd_protocol.client import TickSubscription
from mlxd_protocol.endpoints import trace_endpoint
from tests.daemon.conftest import private_endpoint, start_daemon

TOKEN = "trace-token-for-tests"


@pytest.fixture(scope="module")
def token_daemon(tmp_path_factory):
    token_file = tmp_path_factory.mktemp("trace") / "token"
    token_file.write_text(TOKEN + "\n")
    endpoint = private_endpoint("t")
    os.environ["MLXD_AUTH_TOKEN"] = TOKEN  # start_daemon's readiness ping authenticates with it
    try:
        process = start_daemon(endpoint, "-m", "embedded", "--auth-token-file", str(token_file))
    finally:
        del os.environ["MLXD_AUTH_TOKEN"]
    yield endpoint, token_file
    with Client(endpoint, timeout_s=5.0, auth_token=TOKEN) as client:
        client.shutdown()
    process.wait(timeout=20)


def keep_generating(endpoint: str, stop: threading.Event) -> threading.Thread:
    def run() -> None:
        with Client(endpoint, timeout_s=60, auth_token=TOKEN) as client:
            while not stop.is_set():
                list(client.generate(Generate(id=f"g{time.monotonic()}", prompt="Once", max_tokens=8, stream=False)))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def first_tick(subscription: TickSubscription):
    try:
        return next(subscription)
    except DaemonTimeout:
        return None
    finally:
        subscription.close()


def test_the_trace_needs_the_token(token_daemon):
    endpoint, _ = token_daemon
    stop = threading.Event()
    worker = keep_generating(endpoint, stop)
    try:
        import zmq

        context = zmq.Context.instance()
        anonymous = TickSubscription(context, trace_endpoint(endpoint), idle_timeout_s=3.0)
        wrong = TickSubscription(context, trace_endpoint(endpoint), idle_timeout_s=3.0, auth_token="wrong")
        with Client(endpoint, timeout_s=5.0, auth_token=TOKEN) as client:
            right = client.subscribe_ticks(idle_timeout_s=20.0)
            assert first_tick(right) is not None
        assert first_tick(anonymous) is None
        assert first_tick(wrong) is None
    finally:
        stop.set()
        worker.join(timeout=30)


def test_inspect_tick_passes_the_token(token_daemon):
    endpoint, token_file = token_daemon
    stop = threading.Event()
    env = {name: value for name, value in os.environ.items() if name != "MLXD_AUTH_TOKEN"}
    watcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlxd_cli.inspect_tick",
            "--endpoint",
            endpoint,
            "--json",
            "--count",
            "2",
            "--timeout",
            "30",
            "--auth-token-file",
            str(token_file),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    worker = keep_generating(endpoint, stop)
    try:
        out, err = watcher.communicate(timeout=60)
    finally:
        stop.set()
        worker.join(timeout=30)
    assert watcher.returncode == 0, err
    assert len([json.loads(line) for line in out.splitlines()]) == 2
