"""Two daemons behind one gateway: requests spread over both, a stopped daemon is skipped (requests
sent its way fail over), and with every daemon down the gateway answers 503 + Retry-After."""

from __future__ import annotations

import threading
import time

import pytest

from mlxd_protocol import Client

from ..daemon.conftest import STORIES, private_endpoint, start_daemon, stop_daemon
from .conftest import Gateway

BODY = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}


def requests_served(endpoint: str) -> int:
    with Client(endpoint, timeout_s=5) as daemon:
        return daemon.status().totals["requests"]


@pytest.fixture(scope="module")
def two_daemons():
    if not STORIES.is_dir():
        pytest.skip(f"{STORIES} is not present")
    endpoints = [private_endpoint("a"), private_endpoint("b")]
    processes = [start_daemon(endpoint, "-m", str(STORIES), "--max-batch", "4") for endpoint in endpoints]
    gateway = Gateway(endpoints)
    yield gateway, endpoints
    gateway.stop()
    for process, endpoint in zip(processes, endpoints):
        stop_daemon(process, endpoint)


@pytest.mark.slow
def test_spread_failover_and_all_down(two_daemons):
    gateway, (first, second) = two_daemons
    http = gateway.client
    before = [requests_served(first), requests_served(second)]
    texts = {http.post("/v1/completions", json=BODY).json()["choices"][0]["text"] for _ in range(6)}
    assert len(texts) == 1  # same model, same greedy answer wherever it ran
    served = [requests_served(first) - before[0], requests_served(second) - before[1]]
    assert served == [3, 3], served  # idle daemons: ties go round-robin

    # Least busy first: while one long stream occupies a daemon, short requests go to the other.
    long_body = {"prompt": "Once upon a time", "max_tokens": 480, "stream": True}
    before = [requests_served(first), requests_served(second)]
    with http.stream("POST", "/v1/completions", json=long_body) as streaming:
        lines = streaming.iter_lines()  # kept: dropping the iterator would close the connection
        next(lines)
        busy = 0 if requests_served(first) - before[0] == 1 else 1
        for _ in range(3):
            assert http.post("/v1/completions", json=BODY).status_code == 200
        served = [requests_served(first) - before[0], requests_served(second) - before[1]]
        assert served[busy] == 1 and served[1 - busy] == 3, served

    # Stop one daemon; requests keep succeeding (one sent its way before the health task noticed is
    # retried on the other), and /health stays 200.
    with Client(first, timeout_s=5) as daemon:
        daemon.shutdown()
    results = []

    def one_request():
        response = http.post("/v1/completions", json=BODY)
        results.append(response.status_code)

    started = time.monotonic()
    workers = [threading.Thread(target=one_request) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert results == [200] * 4
    # Those sent to the stopped daemon moved on once it was marked down (two missed probes, ~3 s),
    # not only when its client was given up on (five misses, over 5 s).
    assert time.monotonic() - started < 4.8
    for _ in range(4):
        assert http.post("/v1/completions", json=BODY).status_code == 200
    assert http.get("/health").json() == {"status": "ok"}
    deadline = time.monotonic() + 10
    while 'mlxd_daemon_up{daemon="0"} 0' not in http.get("/metrics").text:
        assert time.monotonic() < deadline, "the stopped daemon is still reported up"
        time.sleep(0.2)

    # Every daemon down: 503 with Retry-After, in OpenAI's error shape; /health 503 too.
    with Client(second, timeout_s=5) as daemon:
        daemon.shutdown()
    deadline = time.monotonic() + 15
    while (health := http.get("/health")).status_code == 200:
        assert time.monotonic() < deadline, "/health stayed 200 with every daemon down"
        time.sleep(0.2)
    assert health.status_code == 503 and "error" in health.json()
    refused = http.post("/v1/completions", json=BODY)
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["type"] == "service_unavailable"
    assert http.get("/v1/models").status_code == 503


@pytest.mark.slow
def test_without_daemon_option_starts_one_with_the_daemon_options():
    if not STORIES.is_dir():
        pytest.skip(f"{STORIES} is not present")
    endpoint = private_endpoint("auto")  # the "default" endpoint for this gateway, through $MLXD_ENDPOINT
    gateway = Gateway(
        [],
        "-m",
        str(STORIES),
        "--draft-kind",
        "prompt-lookup",
        "--draft-block-size",
        "4",
        "--prompt-lookup-max-batch",
        "2",
        env={"MLXD_ENDPOINT": endpoint},
        timeout_s=120,
    )
    try:
        with Client(endpoint, timeout_s=5) as daemon:
            status = daemon.status()
        assert status.model.endswith("stories260K")
        assert status.options["draft_kind"] == "prompt-lookup" and status.options["draft_block_size"] == 4
        assert status.options["prompt_lookup_max_batch"] == 2
        answer = gateway.client.post("/completion", json={"prompt": "Lily and Ben went to the park.", "n_predict": 64})
        assert answer.status_code == 200 and answer.json()["timings"]["draft_kind"] == "prompt-lookup"
    finally:
        gateway.stop()
        with Client(endpoint, timeout_s=5) as daemon:
            daemon.shutdown()  # it was started detached: it outlives the gateway
