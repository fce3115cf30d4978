"""Faults through the gateway, with real processes: a daemon killed mid-stream, then back; a full queue."""

from __future__ import annotations

import signal
import threading
import time

import httpx
import pytest

from tests.daemon.conftest import STORIES, private_endpoint, start_daemon, stop_daemon
from tests.serve_http.conftest import Gateway

pytestmark = pytest.mark.skipif(not STORIES.is_dir(), reason=f"{STORIES} is not present")

LONG = {"prompt": "Once upon a time", "n_predict": 480, "ignore_eos": True}


@pytest.fixture()
def stories_only():
    if not STORIES.is_dir():
        pytest.skip("stories260K is not present")


def wait_health(gateway: Gateway, status: int, within_s: float, since: float | None = None) -> float:
    """Seconds from ``since`` (default: now) until /health answers ``status``; polled every 20 ms."""
    start = time.monotonic() if since is None else since
    while time.monotonic() - start < within_s:
        try:
            if gateway.client.get("/health", timeout=5).status_code == status:
                return time.monotonic() - start
        except httpx.TransportError:
            pass
        time.sleep(0.02)
    raise AssertionError(f"/health did not become {status} within {within_s} s")


# A killed daemon is noticed at once (the gateway's socket monitor reports the disconnect), not after
# missed health probes: its streams end with an error event, and /health says 503, within this.
DEATH_NOTICED_WITHIN_S = 1.0


def test_daemon_killed_mid_stream_then_back(stories_only):
    endpoint = private_endpoint("k")
    daemon = start_daemon(endpoint, "-m", str(STORIES), "--max-batch", "4")
    gateway = Gateway([endpoint])
    try:
        outcome = None
        killed_at = None
        with gateway.client.stream("POST", "/completion", json={**LONG, "stream": True}, timeout=30) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if killed_at is None and line.startswith("data: "):
                    daemon.send_signal(signal.SIGKILL)
                    daemon.wait(timeout=10)
                    killed_at = time.monotonic()
                    continue
                if '"error"' in line:
                    outcome = "error-event"
                    break
                if '"stop": true' in line or '"stop":true' in line:
                    outcome = "finished-before-kill"
                    break
            stream_ended_s = time.monotonic() - killed_at
        assert outcome == "error-event", outcome
        health_503_s = wait_health(gateway, 503, 15, since=killed_at)
        print(f"\nkilled mid-stream: error event after {stream_ended_s:.3f} s, /health 503 after {health_503_s:.3f} s")
        assert stream_ended_s < DEATH_NOTICED_WITHIN_S, stream_ended_s
        assert health_503_s < DEATH_NOTICED_WITHIN_S, health_503_s
        failed = gateway.client.post("/completion", json={"prompt": "Once", "n_predict": 4}, timeout=30)
        assert failed.status_code == 503 and "Retry-After" in failed.headers

        daemon = start_daemon(endpoint, "-m", str(STORIES), "--max-batch", "4")
        assert wait_health(gateway, 200, 10) < 10
        ok = gateway.client.post("/completion", json={"prompt": "Once", "n_predict": 4}, timeout=30)
        assert ok.status_code == 200, ok.text
        assert ok.json()["content"] is not None

        # an idle daemon killed: no request sees it die, only the connection does
        daemon.send_signal(signal.SIGKILL)
        daemon.wait(timeout=10)
        idle_503_s = wait_health(gateway, 503, 15, since=time.monotonic())
        print(f"killed while idle: /health 503 after {idle_503_s:.3f} s")
        assert idle_503_s < DEATH_NOTICED_WITHIN_S, idle_503_s
    finally:
        gateway.stop()
        stop_daemon(daemon, endpoint)


def test_full_queue_answers_429_with_retry_after(stories_only):
    endpoint = private_endpoint("q")
    daemon = start_daemon(endpoint, "-m", str(STORIES), "--max-batch", "1", "--max-queue", "1")
    gateway = Gateway([endpoint])
    try:
        for _attempt in range(3):
            results: list[httpx.Response] = []
            lock = threading.Lock()

            def one(lock=lock, results=results):
                with httpx.Client(base_url=gateway.url, timeout=60) as client:
                    response = client.post("/completion", json=LONG)
                with lock:
                    results.append(response)

            threads = [threading.Thread(target=one) for _ in range(3)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=90)
            assert all(not thread.is_alive() for thread in threads), "a request hung"
            refused = [r for r in results if r.status_code == 429]
            assert all(r.status_code in (200, 429) for r in results), [(r.status_code, r.text[:200]) for r in results]
            if refused:
                assert refused[0].headers.get("Retry-After")
                assert "overloaded" in refused[0].text
                break
        else:
            pytest.fail("three concurrent long requests never overflowed a queue of 1")
        assert gateway.client.get("/health").status_code == 200
    finally:
        gateway.stop()
        stop_daemon(daemon, endpoint)


def test_a_late_daemon_delays_new_requests_instead_of_failing_them(stories_only):
    """A daemon that answers no probe for a few seconds (here stopped with SIGSTOP: a tick longer than two
    probes, or a machine whose other work starves it) is marked down, but a request arriving then waits for
    it, as a busy server's queue would, and succeeds once it answers again: not a 503."""
    endpoint = private_endpoint("late")
    daemon = start_daemon(endpoint, "-m", str(STORIES), "--max-batch", "4")
    gateway = Gateway([endpoint])
    body = {"prompt": "Once", "n_predict": 4}
    try:
        assert gateway.client.post("/completion", json=body, timeout=30).status_code == 200
        daemon.send_signal(signal.SIGSTOP)
        try:
            wait_health(gateway, 503, 15)  # two unanswered probes: down
            results: list[httpx.Response] = []
            waiting = threading.Thread(
                target=lambda: results.append(gateway.client.post("/completion", json=body, timeout=60))
            )
            waiting.start()
            time.sleep(1.5)
            assert not results, "the request did not wait for the late daemon"
        finally:
            daemon.send_signal(signal.SIGCONT)
        waiting.join(timeout=60)
        assert [r.status_code for r in results] == [200], [r.text[:200] for r in results]
        assert wait_health(gateway, 200, 10) < 10
    finally:
        gateway.stop()
        stop_daemon(daemon, endpoint)
