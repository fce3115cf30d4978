"""A real mlxd process on a private ipc endpoint, for daemon and CLI tests."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from mlxd_protocol import Client

from ..markers import mark_directory
from ..model_paths import STORIES_260K

ROOT = Path(__file__).resolve().parents[2]
STORIES = STORIES_260K


def start_daemon(endpoint: str, *args: str, timeout_s: float = 120.0) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    process = subprocess.Popen(
        [sys.executable, "-m", "mlxd_daemon", "--endpoint", endpoint, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + timeout_s
    line = process.stdout.readline()
    if not line.startswith("mlxd ready"):
        process.kill()
        raise RuntimeError(f"mlxd did not start: {line!r} {process.stderr.read()[-2000:]}")
    with Client(endpoint, timeout_s=5.0) as client:
        while not client.ping(0.5):
            if time.monotonic() > deadline:
                raise RuntimeError("mlxd did not answer")
    return process


def stop_daemon(process: subprocess.Popen, endpoint: str) -> int:
    if process.poll() is None:
        try:
            with Client(endpoint, timeout_s=5.0) as client:
                client.shutdown()
        except Exception:  # noqa: BLE001 - fall back to a signal
            process.terminate()
    try:
        return process.wait(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()


def private_endpoint(name: str = "d") -> str:
    # ipc paths are limited to ~100 bytes: keep them short
    directory = Path(tempfile.mkdtemp(prefix="mlxd-t-", dir="/tmp"))
    directory.chmod(0o700)
    atexit.register(shutil.rmtree, directory, True)  # the daemon removes its sockets; this the folder
    return f"ipc://{directory}/{name}.sock"


@pytest.fixture(scope="module")
def stories_daemon():
    if not STORIES.is_dir():
        pytest.skip("stories260K is not present")
    endpoint = private_endpoint()
    process = start_daemon(endpoint, "-m", str(STORIES), "--max-batch", "8")
    yield endpoint
    stop_daemon(process, endpoint)


def pytest_collection_modifyitems(items):
    mark_directory(items, __file__, "integration")
