"""mlx-bench statistics on hand-made numbers: percentiles, spreads, ratios, batch and cell summaries."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from mlxd_cli.bench.report import format_spread
from mlxd_cli.bench.runner import RequestSample
from mlxd_cli.bench.stats import (
    decode_tokens_per_s,
    draft_counts,
    inter_token_latencies,
    median,
    percentile,
    ratio_rows,
    ratios_per_round,
    spread,
    summarize_batch,
    summarize_cells,
    summarize_rounds,
)


def test_percentile_interpolates_linearly_between_order_statistics():
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile(values, 50) == pytest.approx(2.5)
    assert percentile(values, 95) == pytest.approx(3.85)  # numpy: 1 + 0.95 * 3 -> 3.85
    assert percentile(list(range(1, 101)), 95) == pytest.approx(95.05)
    assert percentile([7.0], 95) == 7.0
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_median_and_spread_skip_missing_values():
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([]) is None
    assert spread([10.0, None, 30.0, 20.0]) == {"median": 20.0, "min": 10.0, "max": 30.0, "n": 3}
    assert spread([None, None]) is None
    assert format_spread({"median": 1.2345, "min": 1.0, "max": 1.5, "n": 3}, digits=2) == "1.23 [1.00-1.50]"
    assert format_spread(None) == ""


def test_ratios_per_round_pair_rounds_and_leave_undefined_ones_out_of_the_spread():
    ratios = ratios_per_round([20.0, 33.0, None, 10.0], [10.0, 30.0, 5.0, 0.0])
    assert ratios[0] == pytest.approx(2.0) and ratios[1] == pytest.approx(1.1)
    assert ratios[2] is None and ratios[3] is None
    assert spread(ratios) == {"median": pytest.approx(1.55), "min": pytest.approx(1.1), "max": 2.0, "n": 2}
    with pytest.raises(ValueError):
        ratios_per_round([1.0], [1.0, 2.0])


def test_decode_speed_excludes_the_first_token_and_itl_are_chunk_gaps():
    times = [0.05, 0.06, 0.07, 0.09]
    assert decode_tokens_per_s(4, times) == pytest.approx(3 / 0.04)
    assert decode_tokens_per_s(8, times) == pytest.approx(7 / 0.04)  # usage says 8 tokens in 4 chunks
    assert decode_tokens_per_s(1, [0.05]) is None
    assert decode_tokens_per_s(2, [0.05, 0.05]) is None
    assert inter_token_latencies(times) == pytest.approx([0.01, 0.01, 0.02])
    assert inter_token_latencies([0.1]) == []


def test_draft_counts_read_mlxd_timings_then_usage():
    assert draft_counts({"draft_n": 8, "draft_n_accepted": 5, "draft_verify_n": 2}) == (8, 5, 2)
    assert draft_counts({"predicted_n": 3}, {"drafted_tokens": 4, "accepted_tokens": 1}) == (4, 1, None)
    assert draft_counts(None, None) == (None, None, None)
    assert draft_counts({"draft_n": True}) == (None, None, None)  # a bool is not a count


def _sample(ok=True, tokens=5, times=(0.1, 0.2, 0.3, 0.4, 0.5), latency=0.6, timings=None):
    return RequestSample(
        target="t",
        index=0,
        ok=ok,
        error=None if ok else "HTTP 500: boom",
        ttft_s=times[0] if ok else None,
        token_times_s=list(times) if ok else [],
        completion_tokens=tokens if ok else 0,
        latency_s=latency,
        timings=timings,
    )


def test_summarize_batch_counts_successes_only_and_pools_gaps():
    samples = [
        _sample(tokens=5, times=(0.1, 0.2, 0.3, 0.4, 0.5), latency=0.6, timings={"draft_n": 4, "draft_n_accepted": 3}),
        _sample(tokens=3, times=(0.3, 0.5, 0.7), latency=0.8, timings={"draft_n": 2, "draft_n_accepted": 1}),
        _sample(ok=False, latency=0.05),
    ]
    summary = summarize_batch(samples, wall_s=2.0)
    assert summary["requests"] == 3 and summary["errors"] == 1
    assert summary["completion_tokens"] == 8
    assert summary["aggregate_tok_s"] == pytest.approx(4.0)
    assert summary["decode_tok_s"] == pytest.approx(median([4 / 0.4, 2 / 0.4]))
    assert summary["ttft_p50_s"] == pytest.approx(0.2)
    assert summary["itl_p50_s"] == pytest.approx(0.1)  # gaps 0.1 x4 and 0.2 x2
    assert summary["itl_p95_s"] == pytest.approx(0.2)
    assert summary["latency_p50_s"] == pytest.approx(0.7)
    assert (summary["drafted"], summary["accepted"]) == (6, 4)
    assert summary["verify_rounds"] is None and summary["accepted_per_verify"] is None


def test_a_batch_where_everything_failed_has_no_speed():
    summary = summarize_batch([_sample(ok=False), _sample(ok=False)], wall_s=1.0)
    assert summary["errors"] == 2 and summary["aggregate_tok_s"] is None and summary["ttft_p50_s"] is None


def test_rounds_cells_and_ratios_vs_a_baseline():
    def batch(round_index, target, aggregate, concurrency=4, style="copy", drafted=None):
        summary = {
            "aggregate_tok_s": aggregate,
            "decode_tok_s": 10.0,
            "requests": 8,
            "errors": 0,
            "completion_tokens": 100,
            "drafted": drafted,
            "accepted": drafted and drafted // 2,
            "verify_rounds": None,
        }
        return SimpleNamespace(round=round_index, concurrency=concurrency, style=style, target=target, summary=summary)

    batches = [
        batch(0, "off", 100.0),
        batch(0, "on", 150.0, drafted=10),
        batch(1, "off", 80.0),
        batch(1, "on", 160.0, drafted=20),
        batch(2, "off", 100.0),
        batch(2, "on", 120.0, drafted=30),
    ]
    combined = summarize_rounds([b.summary for b in batches if b.target == "on"])
    assert combined["aggregate_tok_s"] == {"median": 150.0, "min": 120.0, "max": 160.0, "n": 3}
    assert combined["drafted"] == 60 and combined["accepted"] == 30
    assert combined["accepted_per_drafted"] == pytest.approx(0.5)
    assert combined["requests"] == 24

    cells = summarize_cells(batches, ["off", "on"])
    assert [(c["target"], c["aggregate_tok_s_per_round"]) for c in cells] == [
        ("off", [100.0, 80.0, 100.0]),
        ("on", [150.0, 160.0, 120.0]),
    ]
    rows = ratio_rows(cells, baseline="off")
    assert len(rows) == 1 and rows[0]["target"] == "on" and rows[0]["baseline"] == "off"
    assert rows[0]["per_round"] == pytest.approx([1.5, 2.0, 1.2])
    assert rows[0]["ratio"]["median"] == pytest.approx(1.5)
    assert (rows[0]["ratio"]["min"], rows[0]["ratio"]["max"]) == (pytest.approx(1.2), pytest.approx(2.0))
    reverse = ratio_rows(cells, baseline="on")
    assert reverse[0]["target"] == "off" and reverse[0]["ratio"]["median"] == pytest.approx(1 / 1.5)


@pytest.mark.integration  # starts a process
def test_importing_the_tool_loads_neither_mlx_nor_matplotlib():
    code = (
        "import sys, mlxd_cli.bench.main, mlxd_cli.bench.report, mlxd_cli.bench.targets; "
        "from mlxd_cli.bench.report import machine_facts; machine_facts(); "
        "assert not any(m == 'mlx' or m.startswith(('mlx.', 'matplotlib')) for m in sys.modules), "
        "sorted(m for m in sys.modules if m.startswith(('mlx.', 'matplotlib')) or m == 'mlx')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


@pytest.mark.skipif(not hasattr(os, "sched_getscheduler"), reason="Linux's scheduling calls")
def test_scheduling_names_a_real_time_policy_and_its_priority(monkeypatch):
    from mlxd_cli.bench import report

    monkeypatch.setattr(report.os, "sched_getscheduler", lambda pid: report.os.SCHED_FIFO)
    monkeypatch.setattr(report.os, "sched_getparam", lambda pid: report.os.sched_param(1))
    assert report.scheduling_policy() == "fifo 1"
    monkeypatch.setattr(report.os, "sched_getscheduler", lambda pid: report.os.SCHED_OTHER)
    monkeypatch.setattr(report.os, "sched_getparam", lambda pid: report.os.sched_param(0))
    assert report.scheduling_policy() == "normal"
    monkeypatch.delattr(report.os, "sched_getscheduler")
    assert report.scheduling_policy() == "n/a"
