"""Chunk coalescing: first chunk at once, later ones at most once per interval, nothing lost or reordered."""

from __future__ import annotations

from mlxd_daemon.chunking import ChunkBuffer
from mlxd_protocol import Chunk


def chunk(token: int, logprob: float | None = None) -> Chunk:
    return Chunk(id="r", tokens=[token], text=f"<{token}>", logprobs=[{"token": token, "logprob": logprob}] if logprob else None)


def test_first_chunk_goes_at_once_then_one_per_interval():
    buffer = ChunkBuffer(0.005)
    assert buffer.add(chunk(1), now=10.000).tokens == [1]
    assert buffer.add(chunk(2), now=10.001) is None
    assert buffer.add(chunk(3), now=10.002) is None
    assert not buffer.due(10.004)
    sent = buffer.add(chunk(4), now=10.006)
    assert sent.tokens == [2, 3, 4] and sent.text == "<2><3><4>"
    assert buffer.take(10.007) is None


def test_kept_tokens_come_out_merged_in_order_with_logprobs():
    buffer = ChunkBuffer(1.0)
    buffer.add(chunk(1, -0.1), now=0.0)
    buffer.add(chunk(2, -0.2), now=0.1)
    buffer.add(chunk(3), now=0.2)
    buffer.add(chunk(4, -0.4), now=0.3)
    assert buffer.due(1.5)
    kept = buffer.take(1.5)
    assert kept.tokens == [2, 3, 4] and kept.text == "<2><3><4>"
    assert [entry["token"] for entry in kept.logprobs] == [2, 4]


def test_zero_interval_sends_every_chunk():
    buffer = ChunkBuffer(0.0)
    assert [buffer.add(chunk(i), now=5.0).tokens for i in range(3)] == [[0], [1], [2]]
