"""Authentication (auth token + hello), private ipc endpoint permissions, and the public-bind refusal."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import zmq

from mlxd_protocol import Client, DaemonError, Generate, StatusRequest, decode, encode, new_request_id
from mlxd_protocol.endpoints import socket_path
from tests.daemon.conftest import STORIES, private_endpoint, start_daemon

pytestmark = pytest.mark.skipif(not STORIES.is_dir(), reason=f"{STORIES} is not present")

TOKEN = "s3cret-token-for-tests"


@pytest.fixture(scope="module")
def auth_daemon(tmp_path_factory):
    if not STORIES.is_dir():
        pytest.skip("stories260K is not present")
    token_file = tmp_path_factory.mktemp("auth") / "token"
    token_file.write_text(TOKEN + "\n")
    endpoint = private_endpoint()
    process = start_daemon_with_token(endpoint, token_file)
    yield endpoint
    with Client(endpoint, timeout_s=5.0, auth_token=TOKEN) as client:
        client.shutdown()
    process.wait(timeout=20)


def start_daemon_with_token(endpoint: str, token_file: Path):
    os.environ["MLXD_AUTH_TOKEN"] = TOKEN  # start_daemon's readiness ping authenticates with it
    try:
        return start_daemon(endpoint, "-m", str(STORIES), "--auth-token-file", str(token_file))
    finally:
        del os.environ["MLXD_AUTH_TOKEN"]


def raw_request(endpoint: str, *messages) -> list:
    """Send messages on one fresh connection; return the reply to each (in order)."""
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(endpoint)
    replies = []
    try:
        for message in messages:
            socket.send(encode(message))
            assert socket.poll(10_000), "no reply"
            replies.append(decode(socket.recv()))
    finally:
        socket.close()
    return replies


def test_request_without_hello_is_unauthorized(auth_daemon, monkeypatch):
    monkeypatch.delenv("MLXD_AUTH_TOKEN", raising=False)
    [reply] = raw_request(auth_daemon, StatusRequest(id="s1"))
    assert reply.TYPE == "error" and reply.code == "unauthorized" and reply.id == "s1"
    with Client(auth_daemon, timeout_s=5.0) as client:
        with pytest.raises(DaemonError) as caught:
            client.status()
        assert caught.value.code == "unauthorized"


def test_wrong_token_is_unauthorized(auth_daemon):
    from mlxd_protocol import Hello

    hello, status = raw_request(auth_daemon, Hello(id="h1", token="wrong"), StatusRequest(id="s1"))
    assert hello.code == "unauthorized" and status.code == "unauthorized"
    with Client(auth_daemon, timeout_s=5.0, auth_token="wrong") as client:
        with pytest.raises(DaemonError) as caught:
            client.status()
        assert caught.value.code == "unauthorized"
        with pytest.raises(DaemonError):
            list(client.generate(Generate(id=new_request_id(), prompt="Once", max_tokens=2)))


def test_right_token_works_and_daemon_keeps_serving(auth_daemon):
    from mlxd_protocol import Hello

    hello, status = raw_request(auth_daemon, Hello(id="h1", token=TOKEN), StatusRequest(id="s1"))
    assert hello.TYPE == "status_result" and status.TYPE == "status_result"
    assert status.options["auth_token"] == "<set>"  # the secret is never reported
    with Client(auth_daemon, timeout_s=10.0, auth_token=TOKEN) as client:
        replies = list(client.generate(Generate(id=new_request_id(), prompt="Once upon", max_tokens=4)))
        assert replies[-1].TYPE == "done"
        assert client.tokenize("Once")


def test_async_client_authenticates(auth_daemon):
    import asyncio

    from mlxd_protocol import AsyncClient

    async def run():
        async with AsyncClient(auth_daemon, timeout_s=10.0, auth_token=TOKEN) as client:
            return (await client.status()).model

    assert asyncio.run(run())


def test_allow_public_without_token_is_refused(monkeypatch):
    env = {k: v for k, v in os.environ.items() if k != "MLXD_AUTH_TOKEN"}
    result = subprocess.run(
        [sys.executable, "-m", "mlxd_daemon", "--endpoint", "tcp://0.0.0.0:5799", "--allow-public"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 2
    assert "--allow-public needs an auth token" in result.stderr


def test_public_tcp_without_allow_public_is_refused():
    if not STORIES.is_dir():
        pytest.skip("stories260K is not present")
    env = {k: v for k, v in os.environ.items() if k != "MLXD_AUTH_TOKEN"}
    result = subprocess.run(
        [sys.executable, "-m", "mlxd_daemon", "-m", str(STORIES), "--endpoint", "tcp://0.0.0.0:5798"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode != 0
    assert "cannot listen" in result.stderr and "allow-public" in result.stderr


def test_ipc_socket_is_private(auth_daemon):
    path = socket_path(auth_daemon)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_default_endpoint_is_private_ipc(monkeypatch):
    from mlxd_protocol.endpoints import default_endpoint, ensure_private_dir

    monkeypatch.delenv("MLXD_ENDPOINT", raising=False)
    endpoint = default_endpoint()
    assert endpoint.startswith("ipc://")
    ensure_private_dir(endpoint)
    assert stat.S_IMODE(socket_path(endpoint).parent.stat().st_mode) == 0o700
