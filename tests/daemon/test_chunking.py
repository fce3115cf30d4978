"""Chunk coalescing: first tokens at once, later ones at most once per interval, nothing lost or reordered."""

from __future__ import annotations

from mlxd_daemon.chunking import ChunkBuffer


def add(buffer: ChunkBuffer, token: int, now: float, logprob: float | None = None):
    logprobs = [{"token": token, "logprob": logprob}] if logprob else None
    return buffer.add([token], f"<{token}>", logprobs, now)


def test_first_chunk_goes_at_once_then_one_per_interval():
    buffer = ChunkBuffer("r", 0.005)
    first = add(buffer, 1, now=10.000)
    assert first.id == "r" and first.tokens == [1] and first.text == "<1>"
    assert add(buffer, 2, now=10.001) is None
    assert add(buffer, 3, now=10.002) is None
    assert not buffer.due(10.004)
    sent = add(buffer, 4, now=10.006)
    assert sent.tokens == [2, 3, 4] and sent.text == "<2><3><4>"
    assert buffer.take(10.007) is None


def test_kept_tokens_come_out_merged_in_order_with_logprobs():
    buffer = ChunkBuffer("r", 1.0)
    add(buffer, 1, 0.0, -0.1)
    add(buffer, 2, 0.1, -0.2)
    add(buffer, 3, 0.2)
    add(buffer, 4, 0.3, -0.4)
    assert buffer.due(1.5)
    kept = buffer.take(1.5)
    assert kept.tokens == [2, 3, 4] and kept.text == "<2><3><4>"
    assert [entry["token"] for entry in kept.logprobs] == [2, 4]
    assert not buffer.due(5.0) and buffer.take(5.0) is None


def test_text_without_tokens_is_kept_too():
    # the finish step may send a text tail with no token (a held-back stop-string prefix released)
    buffer = ChunkBuffer("r", 1.0)
    add(buffer, 1, 0.0)
    assert buffer.add([], "tail", None, 0.1) is None
    assert buffer.take(0.2).text == "tail"


def test_zero_interval_sends_every_chunk():
    buffer = ChunkBuffer("r", 0.0)
    assert [add(buffer, i, now=5.0).tokens for i in range(3)] == [[0], [1], [2]]
