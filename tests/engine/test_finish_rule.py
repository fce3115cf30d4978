"""The rule that ends a row: end-of-sequence or a caller's stop first, then max_tokens or the KV bound."""

from __future__ import annotations

from types import SimpleNamespace

from mlxd_engine import ends_on, finish_reason, reaches_length


def _seq(committed: int, max_kv: int = 16):
    return SimpleNamespace(kv=SimpleNamespace(committed=committed), max_kv=max_kv)


def test_stop_comes_before_length_and_a_callers_stop_counts():
    eos = {2}
    assert finish_reason(eos, _seq(16), 2, 99, 4) == "stop"  # at every bound, the EOS still says stop
    assert finish_reason(eos, _seq(3), 7, 1, 4, should_stop=lambda token: token == 7) == "stop"
    assert finish_reason(eos, _seq(3), 7, 4, 4) == "length"  # max_tokens reached
    assert finish_reason(eos, _seq(16), 7, 1, 4) == "length"  # storage full
    assert finish_reason(eos, _seq(3), 7, 3, 4) is None
    assert ends_on(eos, 2) and not ends_on(eos, 3)


def test_length_without_a_sequence_counts_tokens_only():
    assert reaches_length(None, 4, 4) and not reaches_length(None, 3, 4)
