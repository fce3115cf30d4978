"""The gateway supervises the daemon it started (kill -9: reaped, restarted, /health 200 again) and only
waits for a daemon it did not start. Real processes on the embedded model."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from mlxd_protocol import Client
from mlxd_protocol.autostart import daemon_answers
from tests.daemon.conftest import private_endpoint, start_daemon, stop_daemon
from tests.serve_http.conftest import EMBEDDED, Gateway

pytestmark = pytest.mark.skipif(not (EMBEDDED / "config.json").is_file(), reason="the embedded model is not there")

BACK_WITHIN_S = 10.0  # the bound: /health 200 again this soon after a kill -9
GONE_WITHIN_S = 1.0  # a killed daemon is noticed (503) this soon
LONG = {"prompt": "Once upon a time", "n_predict": 4000, "ignore_eos": True}


def children(pid: int) -> list[tuple[int, str, str]]:
    """(pid, state letter, command line) of every child process of ``pid``, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        state, parent = stat.rsplit(")", 1)[1].split()[:2]  # the command name may hold spaces
        if int(parent) == pid:
            found.append((int(entry.name), state, cmdline))
    return found


def health_status(gateway: Gateway) -> int:
    try:
        return gateway.client.get("/health", timeout=5).status_code
    except Exception:  # noqa: BLE001 - a refused connection counts as not healthy
        return 0


def wait_for(predicate, within_s: float, what: str) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > within_s:
            raise AssertionError(f"{what}: not within {within_s} s")
        time.sleep(0.05)
    return time.monotonic() - start


def daemon_pid(endpoint: str) -> int:
    with Client(endpoint, timeout_s=5) as client:
        return client.status().pid


def test_a_daemon_the_gateway_started_is_reaped_and_restarted_after_kill_9():
    endpoint = private_endpoint("sup")
    gateway = Gateway([], "-m", str(EMBEDDED), "--max-concurrency", "8", env={"MLXD_ENDPOINT": endpoint}, timeout_s=120)
    try:
        first_pid = daemon_pid(endpoint)
        assert first_pid in [pid for pid, _, _ in children(gateway.process.pid)]
        answers: list = []
        in_flight = threading.Thread(
            target=lambda: answers.append(gateway.client.post("/completion", json=LONG, timeout=60))
        )
        in_flight.start()
        wait_for(lambda: Client(endpoint, timeout_s=5).status().active >= 1, 30, "the long request running")

        os.kill(first_pid, signal.SIGKILL)
        killed_at = time.monotonic()
        in_flight.join(timeout=30)
        failed = answers[0]
        assert failed.status_code == 503, failed.text
        assert failed.json()["error"]["code"] == "daemon_unavailable" and "Retry-After" in failed.headers
        assert endpoint.removeprefix("ipc://") not in failed.text
        wait_for(lambda: health_status(gateway) == 503 or time.monotonic() - killed_at > GONE_WITHIN_S, 5, "503")

        wait_for(lambda: health_status(gateway) == 200, BACK_WITHIN_S - (time.monotonic() - killed_at), "/health 200")
        back_s = time.monotonic() - killed_at
        second_pid = daemon_pid(endpoint)
        assert second_pid != first_pid
        processes = children(gateway.process.pid)
        assert [pid for pid, state, _ in processes if state == "Z"] == [], processes
        assert first_pid not in [pid for pid, _, _ in processes]  # reaped, not left behind
        ok = gateway.client.post("/completion", json={"prompt": "Once", "n_predict": 4})
        assert ok.status_code == 200 and ok.json()["model"] == EMBEDDED.name
        print(f"\nkill -9: /health 200 again after {back_s:.2f} s (pid {first_pid} -> {second_pid})")
    finally:
        gateway.stop()
        if daemon_answers(endpoint):
            with Client(endpoint, timeout_s=5) as client:
                client.shutdown()  # started detached: it outlives the gateway


def test_a_daemon_given_by_address_is_waited_for_never_restarted():
    endpoint = private_endpoint("ext")
    daemon = start_daemon(endpoint, "-m", str(EMBEDDED), "--max-batch", "2")
    gateway = Gateway([endpoint])
    try:
        daemon.send_signal(signal.SIGKILL)
        daemon.wait(timeout=10)
        wait_for(lambda: health_status(gateway) == 503, GONE_WITHIN_S + 1, "/health 503")
        time.sleep(3.0)  # a supervisor would have restarted it by now
        assert not daemon_answers(endpoint)
        assert health_status(gateway) == 503
        assert not [cmd for _, _, cmd in children(gateway.process.pid) if "mlxd_daemon" in cmd]
        body = gateway.client.get("/health").json()
        assert endpoint.removeprefix("ipc://") not in str(body) and "ipc://" not in str(body)

        daemon = start_daemon(endpoint, "-m", str(EMBEDDED), "--max-batch", "2")
        wait_for(lambda: health_status(gateway) == 200, BACK_WITHIN_S, "/health 200 once it is back")
    finally:
        gateway.stop()
        stop_daemon(daemon, endpoint)
