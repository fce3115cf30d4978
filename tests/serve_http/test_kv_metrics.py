"""The KV pool's use shows in /metrics (and in the daemon's status) for both storage backends."""

from __future__ import annotations

import pytest

from mlxd_protocol import Client
from tests.daemon.conftest import STORIES, private_endpoint, start_daemon, stop_daemon
from tests.serve_http.conftest import Gateway

pytestmark = pytest.mark.skipif(not STORIES.is_dir(), reason=f"{STORIES} is not present")


def _paged_daemon(name: str, *options: str):
    """stories260K served from a paged pool of 2048 tokens, with ``options``: (endpoint, process)."""
    endpoint = private_endpoint(name)
    args = ("-m", str(STORIES), "--decode-storage-backend", "paged", "--kv-pool-tokens", "2048", *options)
    return endpoint, start_daemon(endpoint, *args)


def test_paged_pool_use_in_status_and_metrics():
    endpoint, daemon = _paged_daemon("k", "--kv-block-size", "32")
    gateway = Gateway([endpoint])
    try:
        assert (
            gateway.client.post("/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 8}).status_code
            == 200
        )
        with Client(endpoint, timeout_s=5) as client:
            kv = client.status().memory["kv"]
        # idle: only the prefix cache's entry holds blocks (the finished request's one block, shared by no one)
        assert kv["backend"] == "paged" and kv["blocks"] == 64 and kv["blocks_reserved"] == 0
        assert kv["dtype"] == "float32"  # stories260K computes in float32 and keeps it so by default
        assert kv["blocks_used"] == kv["blocks_cached"] == kv["blocks_cache_only"] == 1, kv
        metrics = gateway.client.get("/metrics").text
        assert 'mlxd_daemon_kv_blocks{daemon="0"} 64' in metrics
        assert 'mlxd_daemon_kv_blocks_used{daemon="0"} 1' in metrics
        assert 'mlxd_daemon_kv_blocks_cached{daemon="0"} 1' in metrics
    finally:
        gateway.stop()
        stop_daemon(daemon, endpoint)


def test_a_float16_cache_takes_half_the_pool_bytes():
    """``mlxd --kv-dtype float16``: stories260K's 5 layers x 4 key heads x 8 values, keys and values, take
    2 bytes a value (640 bytes a token, 1280 as float32) and the replies come as before."""
    endpoint, daemon = _paged_daemon("h", "--kv-dtype", "float16")
    gateway = Gateway([endpoint])
    try:
        reply = gateway.client.post("/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 8})
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 8
        with Client(endpoint, timeout_s=5) as client:
            kv = client.status().memory["kv"]
        assert kv["allocated_bytes"] == 2048 * 640 and kv["dtype"] == "float16", kv
    finally:
        gateway.stop()
        stop_daemon(daemon, endpoint)
