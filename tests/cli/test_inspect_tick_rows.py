"""mlx-inspect-tick's row summaries."""

from __future__ import annotations

from mlxd_cli.inspect_tick import describe_row


def test_a_verify_row_names_its_draft_source_when_the_trace_gives_one():
    assert describe_row({"action": "verify", "drafted": 5, "accepted": 3}) == "verify 3/5"
    assert describe_row({"action": "verify", "drafted": 5, "accepted": 3, "detail": "shared"}) == "verify 3/5 (shared)"
