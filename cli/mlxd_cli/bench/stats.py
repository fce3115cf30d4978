"""Statistics of mlx-bench: pure functions over numbers and request samples (no I/O, no clocks).

Contract:
    * ``percentile(values, q)`` interpolates linearly between order statistics (numpy's default);
      every function returns None instead of a number when it has nothing to work on (no samples,
      all requests failed, a zero denominator), and reports leave None blank.
    * A request sample (``runner.RequestSample``) holds ``ok``, ``completion_tokens``, ``ttft_s``,
      ``latency_s``, ``token_times_s`` (arrival of each content chunk, seconds after the request was
      sent) and ``timings`` (the server's extension object or mlxd's ``Done.timings``, may be None).
    * Per request: decode tok/s = (tokens - 1) / (last content chunk - first content chunk); inter-token
      latencies are the gaps between consecutive content chunks (a chunk carrying several tokens, as
      speculative decoding may send, is one gap).
    * ``summarize_batch`` gives one batch's figures: aggregate tok/s = completion tokens of the
      successful requests / the batch's wall time; decode tok/s = the median over its requests;
      TTFT, ITL (pooled over all gaps of the batch) and request latency p50 / p95; errors; draft counts
      summed from the timings (``draft_n``, ``draft_n_accepted``, and a verify-round count when the
      server reports one).
    * ``spread`` is median / min / max over rounds; ``ratios_per_round`` divides one target's per-round
      figure by the baseline's from the same round.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

# Keys servers use for speculative-decoding counts, in order of preference (timings first, then usage).
DRAFTED_KEYS = ("draft_n", "drafted_tokens", "draft_tokens")
ACCEPTED_KEYS = ("draft_n_accepted", "accepted_tokens", "draft_accepted")
VERIFY_KEYS = ("draft_verify_n", "verify_rounds", "draft_rounds")


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile with linear interpolation.

    Args:
        values: Numbers in any order.
        q: Percentile in [0, 100].

    Returns:
        The percentile, or None for no values.
    """
    if not values:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def median(values: Sequence[float]) -> float | None:
    """The median, or None for no values.

    Args:
        values: Numbers.

    Returns:
        The median.
    """
    return statistics.median(values) if values else None


def spread(values: Iterable[float | None]) -> dict[str, Any] | None:
    """Median and min-max of the values that are not None.

    Args:
        values: One figure per round (None where a round had none).

    Returns:
        ``{"median", "min", "max", "n"}``, or None when no value is left.
    """
    present = [value for value in values if value is not None]
    if not present:
        return None
    return {"median": statistics.median(present), "min": min(present), "max": max(present), "n": len(present)}


def ratios_per_round(values: Sequence[float | None], baseline: Sequence[float | None]) -> list[float | None]:
    """Divide each round's figure by the baseline's figure of the same round.

    Args:
        values: A target's figure per round.
        baseline: The baseline's figure per round (same length).

    Returns:
        One ratio per round; None where either side is missing or the baseline is zero.
    """
    if len(values) != len(baseline):
        raise ValueError(f"rounds differ: {len(values)} values vs {len(baseline)} baseline values")
    return [value / base if value is not None and base else None for value, base in zip(values, baseline)]


def decode_tokens_per_s(completion_tokens: int, token_times_s: Sequence[float]) -> float | None:
    """Per-request decode speed: (tokens - 1) / (last token time - first token time).

    Args:
        completion_tokens: Tokens the request produced.
        token_times_s: Arrival times of the content chunks (seconds after the request was sent).

    Returns:
        Tokens per second after the first, or None with fewer than two tokens or chunks.
    """
    if completion_tokens < 2 or len(token_times_s) < 2:
        return None
    span = token_times_s[-1] - token_times_s[0]
    return (completion_tokens - 1) / span if span > 0 else None


def inter_token_latencies(token_times_s: Sequence[float]) -> list[float]:
    """Gaps between consecutive content chunks.

    Args:
        token_times_s: Arrival times of the content chunks.

    Returns:
        ``len(token_times_s) - 1`` gaps in seconds.
    """
    return [later - earlier for earlier, later in zip(token_times_s, token_times_s[1:])]


def _first_count(sources: Sequence[dict], keys: Sequence[str]) -> int | None:
    for source in sources:
        for key in keys:
            value = source.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return int(value)
    return None


def draft_counts(timings: dict | None, usage: dict | None = None) -> tuple[int | None, int | None, int | None]:
    """Speculative-decoding counts of one request, from its timings (or usage) object.

    Args:
        timings: The server's ``timings`` (mlxd: ``draft_n``, ``draft_n_accepted``), or None.
        usage: The ``usage`` object, consulted when timings lack a count.

    Returns:
        ``(drafted, accepted, verify_rounds)``, each None when not reported.
    """
    sources = [source for source in (timings, usage) if isinstance(source, dict)]
    return (_first_count(sources, DRAFTED_KEYS), _first_count(sources, ACCEPTED_KEYS),
            _first_count(sources, VERIFY_KEYS))


def _sum_or_none(values: Iterable[int | None]) -> int | None:
    present = [value for value in values if value is not None]
    return sum(present) if present else None


def summarize_batch(samples: Sequence[Any], wall_s: float) -> dict[str, Any]:
    """The figures of one batch (one target, one concurrency level, one style, one round).

    Args:
        samples: The batch's ``RequestSample``s (failed ones included).
        wall_s: Seconds from the batch's first request sent to its last request finished.

    Returns:
        A JSON-ready dict: requests, errors, completion_tokens, wall_s, aggregate_tok_s, decode_tok_s,
        ttft_p50_s, ttft_p95_s, itl_p50_s, itl_p95_s, latency_p50_s, latency_p95_s, drafted, accepted,
        verify_rounds, accepted_per_verify.
    """
    good = [sample for sample in samples if sample.ok]
    tokens = sum(sample.completion_tokens for sample in good)
    decode = [speed for sample in good
              if (speed := decode_tokens_per_s(sample.completion_tokens, sample.token_times_s)) is not None]
    ttfts = [sample.ttft_s for sample in good if sample.ttft_s is not None]
    gaps = [gap for sample in good for gap in inter_token_latencies(sample.token_times_s)]
    latencies = [sample.latency_s for sample in good]
    counts = [draft_counts(sample.timings, getattr(sample, "usage", None)) for sample in good]
    drafted = _sum_or_none(count[0] for count in counts)
    accepted = _sum_or_none(count[1] for count in counts)
    verify_rounds = _sum_or_none(count[2] for count in counts)
    return {
        "requests": len(samples),
        "errors": len(samples) - len(good),
        "completion_tokens": tokens,
        "wall_s": wall_s,
        "aggregate_tok_s": tokens / wall_s if good and wall_s > 0 else None,
        "decode_tok_s": median(decode),
        "ttft_p50_s": percentile(ttfts, 50), "ttft_p95_s": percentile(ttfts, 95),
        "itl_p50_s": percentile(gaps, 50), "itl_p95_s": percentile(gaps, 95),
        "latency_p50_s": percentile(latencies, 50), "latency_p95_s": percentile(latencies, 95),
        "drafted": drafted, "accepted": accepted, "verify_rounds": verify_rounds,
        "accepted_per_verify": accepted / verify_rounds if accepted is not None and verify_rounds else None,
    }


SPREAD_METRICS = ("aggregate_tok_s", "decode_tok_s", "ttft_p50_s", "ttft_p95_s", "itl_p50_s", "itl_p95_s",
                  "latency_p50_s", "latency_p95_s", "accepted_per_verify")
SUMMED_METRICS = ("requests", "errors", "completion_tokens", "drafted", "accepted", "verify_rounds")


def summarize_rounds(per_round: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Combine one cell's batch summaries (one per round) into medians, spreads and totals.

    Args:
        per_round: ``summarize_batch`` results, in round order.

    Returns:
        ``{metric: spread(...)}`` for each of ``SPREAD_METRICS`` and ``{metric: sum}`` (None when never
        reported) for each of ``SUMMED_METRICS``, plus ``rounds``.
    """
    combined: dict[str, Any] = {"rounds": len(per_round)}
    for metric in SPREAD_METRICS:
        combined[metric] = spread(batch.get(metric) for batch in per_round)
    for metric in SUMMED_METRICS:
        combined[metric] = _sum_or_none(batch.get(metric) for batch in per_round)
    drafted, accepted = combined["drafted"], combined["accepted"]
    combined["accepted_per_drafted"] = accepted / drafted if drafted and accepted is not None else None
    return combined


def summarize_cells(batches: Sequence[Any], target_names: Sequence[str]) -> list[dict[str, Any]]:
    """One entry per prompt style x concurrency x target, combining that cell's rounds.

    Args:
        batches: Batch records (``round``, ``concurrency``, ``style``, ``target``, ``summary``).
        target_names: Targets in report order.

    Returns:
        Dicts with ``style``, ``concurrency``, ``target``, ``summarize_rounds(...)``'s keys and
        ``aggregate_tok_s_per_round`` (None where a round had no successful request), ordered by style
        (first seen), concurrency, then target order.
    """
    styles = list(dict.fromkeys(batch.style for batch in batches))
    concurrencies = list(dict.fromkeys(batch.concurrency for batch in batches))
    cells = []
    for style in styles:
        for concurrency in concurrencies:
            for name in target_names:
                mine = sorted((batch for batch in batches if (batch.style, batch.concurrency, batch.target)
                               == (style, concurrency, name)), key=lambda batch: batch.round)
                if not mine:
                    continue
                summaries = [batch.summary for batch in mine]
                cells.append({"style": style, "concurrency": concurrency, "target": name,
                              **summarize_rounds(summaries),
                              "aggregate_tok_s_per_round": [summary["aggregate_tok_s"] for summary in summaries]})
    return cells


def ratio_rows(cells: Sequence[dict[str, Any]], baseline: str) -> list[dict[str, Any]]:
    """Aggregate tok/s of every target relative to the baseline, per round, for every style x concurrency.

    Args:
        cells: ``summarize_cells`` output.
        baseline: The baseline target's name.

    Returns:
        Dicts with ``style``, ``concurrency``, ``target``, ``baseline``, ``per_round`` (ratios, None where
        undefined) and ``ratio`` (``spread`` of the per-round ratios, None when none is defined).
    """
    by_key = {(cell["style"], cell["concurrency"], cell["target"]): cell for cell in cells}
    rows = []
    for cell in cells:
        if cell["target"] == baseline:
            continue
        base = by_key.get((cell["style"], cell["concurrency"], baseline))
        if base is None:
            continue
        per_round = ratios_per_round(cell["aggregate_tok_s_per_round"], base["aggregate_tok_s_per_round"])
        rows.append({"style": cell["style"], "concurrency": cell["concurrency"], "target": cell["target"],
                     "baseline": baseline, "per_round": per_round, "ratio": spread(per_round)})
    return rows
