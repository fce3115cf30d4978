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
    * Chat sessions (samples with a ``turn``): ``summarize_batch`` adds ``turns``, one entry per turn
      number (TTFT p50 / p95 over the batch's sessions, median prompt and cached tokens);
      ``summarize_rounds`` combines them over rounds, and ``ratio_rows`` adds each turn's TTFT speedup
      per round: the baseline's TTFT p50 / the target's (above 1: the target answers sooner). Cached
      tokens come from ``usage.prompt_tokens_details.cached_tokens`` (OpenAI, mlx_lm.server), mlxd's
      ``usage.cached_tokens`` or ``timings.cache_n`` (llama-server), in that order
      (``cached_prompt_tokens``); None when the server reports none of them.
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
    return (
        _first_count(sources, DRAFTED_KEYS),
        _first_count(sources, ACCEPTED_KEYS),
        _first_count(sources, VERIFY_KEYS),
    )


def _sum_or_none(values: Iterable[int | None]) -> int | None:
    present = [value for value in values if value is not None]
    return sum(present) if present else None


def _count(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def cached_prompt_tokens(usage: dict | None, timings: dict | None) -> int | None:
    """Prompt tokens a server says it took from its prompt cache for one request.

    Args:
        usage: The ``usage`` object (OpenAI ``prompt_tokens_details.cached_tokens``, mlxd ``cached_tokens``).
        timings: The ``timings`` object (llama-server and mlxd ``cache_n``).

    Returns:
        The count, or None when none of those fields is present.
    """
    usage = usage if isinstance(usage, dict) else {}
    details = usage.get("prompt_tokens_details")
    for value in (
        (details or {}).get("cached_tokens") if isinstance(details, dict) else None,
        usage.get("cached_tokens"),
        (timings or {}).get("cache_n") if isinstance(timings, dict) else None,
    ):
        if (count := _count(value)) is not None:
            return count
    return None


def summarize_turns(samples: Sequence[Any]) -> list[dict[str, Any]]:
    """Per-turn figures of a batch of chat sessions.

    Args:
        samples: The batch's samples; those without a ``turn`` are ignored.

    Returns:
        One dict per turn number, in order: ``turn``, ``requests``, ``errors``, ``ttft_p50_s``,
        ``ttft_p95_s``, ``prompt_tokens_p50`` and ``cached_tokens_p50`` (None when not reported).
        Empty when no sample has a turn.
    """
    turns = sorted({sample.turn for sample in samples if getattr(sample, "turn", None) is not None})
    rows = []
    for turn in turns:
        mine = [sample for sample in samples if sample.turn == turn]
        good = [sample for sample in mine if sample.ok]
        ttfts = [sample.ttft_s for sample in good if sample.ttft_s is not None]
        prompt_tokens = [sample.prompt_tokens for sample in good if sample.prompt_tokens is not None]
        cached = [sample.cached_tokens for sample in good if sample.cached_tokens is not None]
        rows.append(
            {
                "turn": turn,
                "requests": len(mine),
                "errors": len(mine) - len(good),
                "ttft_p50_s": percentile(ttfts, 50),
                "ttft_p95_s": percentile(ttfts, 95),
                "prompt_tokens_p50": median(prompt_tokens),
                "cached_tokens_p50": median(cached),
            }
        )
    return rows


def summarize_batch(samples: Sequence[Any], wall_s: float) -> dict[str, Any]:
    """The figures of one batch (one target, one concurrency level, one style, one round).

    Args:
        samples: The batch's ``RequestSample``s (failed ones included).
        wall_s: Seconds from the batch's first request sent to its last request finished.

    Returns:
        A JSON-ready dict: requests, errors, completion_tokens, wall_s, aggregate_tok_s, decode_tok_s,
        ttft_p50_s, ttft_p95_s, itl_p50_s, itl_p95_s, latency_p50_s, latency_p95_s, drafted, accepted,
        verify_rounds, accepted_per_verify; for chat sessions also ``turns`` (``summarize_turns``).
    """
    good = [sample for sample in samples if sample.ok]
    tokens = sum(sample.completion_tokens for sample in good)
    decode = [
        speed
        for sample in good
        if (speed := decode_tokens_per_s(sample.completion_tokens, sample.token_times_s)) is not None
    ]
    ttfts = [sample.ttft_s for sample in good if sample.ttft_s is not None]
    gaps = [gap for sample in good for gap in inter_token_latencies(sample.token_times_s)]
    latencies = [sample.latency_s for sample in good]
    counts = [draft_counts(sample.timings, getattr(sample, "usage", None)) for sample in good]
    drafted = _sum_or_none(count[0] for count in counts)
    accepted = _sum_or_none(count[1] for count in counts)
    verify_rounds = _sum_or_none(count[2] for count in counts)
    summary = {
        "requests": len(samples),
        "errors": len(samples) - len(good),
        "completion_tokens": tokens,
        "wall_s": wall_s,
        "aggregate_tok_s": tokens / wall_s if good and wall_s > 0 else None,
        "decode_tok_s": median(decode),
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p95_s": percentile(ttfts, 95),
        "itl_p50_s": percentile(gaps, 50),
        "itl_p95_s": percentile(gaps, 95),
        "latency_p50_s": percentile(latencies, 50),
        "latency_p95_s": percentile(latencies, 95),
        "drafted": drafted,
        "accepted": accepted,
        "verify_rounds": verify_rounds,
        "accepted_per_verify": accepted / verify_rounds if accepted is not None and verify_rounds else None,
    }
    turns = summarize_turns(samples)
    if turns:  # chat sessions only
        summary["turns"] = turns
    return summary


SPREAD_METRICS = (
    "aggregate_tok_s",
    "decode_tok_s",
    "ttft_p50_s",
    "ttft_p95_s",
    "itl_p50_s",
    "itl_p95_s",
    "latency_p50_s",
    "latency_p95_s",
    "accepted_per_verify",
)
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
    if any(batch.get("turns") for batch in per_round):
        combined["turns"] = combine_turns([batch.get("turns") or [] for batch in per_round])
    return combined


TURN_SPREAD_METRICS = ("ttft_p50_s", "ttft_p95_s", "prompt_tokens_p50", "cached_tokens_p50")


def combine_turns(per_round: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Combine one cell's per-turn figures (``summarize_turns``, one list per round) over rounds.

    Args:
        per_round: Per round, that batch's ``turns`` list.

    Returns:
        One dict per turn: ``turn``, ``requests`` and ``errors`` summed, ``spread`` of each of
        ``TURN_SPREAD_METRICS``, and ``ttft_p50_s_per_round`` (None where a round had no such turn).
    """
    numbers = sorted({row["turn"] for rows in per_round for row in rows})
    combined = []
    for turn in numbers:
        rows = [next((row for row in rounds if row["turn"] == turn), None) for rounds in per_round]
        present = [row for row in rows if row is not None]
        entry: dict[str, Any] = {
            "turn": turn,
            "requests": sum(row["requests"] for row in present),
            "errors": sum(row["errors"] for row in present),
        }
        for metric in TURN_SPREAD_METRICS:
            entry[metric] = spread(row[metric] for row in present)
        entry["ttft_p50_s_per_round"] = [row["ttft_p50_s"] if row is not None else None for row in rows]
        combined.append(entry)
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
                mine = sorted(
                    (
                        batch
                        for batch in batches
                        if (batch.style, batch.concurrency, batch.target) == (style, concurrency, name)
                    ),
                    key=lambda batch: batch.round,
                )
                if not mine:
                    continue
                summaries = [batch.summary for batch in mine]
                cells.append(
                    {
                        "style": style,
                        "concurrency": concurrency,
                        "target": name,
                        **summarize_rounds(summaries),
                        "aggregate_tok_s_per_round": [summary["aggregate_tok_s"] for summary in summaries],
                    }
                )
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
        row = {
            "style": cell["style"],
            "concurrency": cell["concurrency"],
            "target": cell["target"],
            "baseline": baseline,
            "per_round": per_round,
            "ratio": spread(per_round),
        }
        if cell.get("turns") and base.get("turns"):
            row["turns"] = ttft_speedups(cell["turns"], base["turns"])
        rows.append(row)
    return rows


def ttft_speedups(turns: Sequence[dict[str, Any]], baseline_turns: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per turn, the baseline's TTFT p50 / the target's, round by round (above 1: the target is faster).

    Args:
        turns: The target cell's ``combine_turns`` output.
        baseline_turns: The baseline cell's.

    Returns:
        One dict per turn both have: ``turn``, ``per_round`` (None where undefined), ``ratio`` (``spread``).
    """
    base_by_turn = {entry["turn"]: entry for entry in baseline_turns}
    speedups = []
    for entry in turns:
        base = base_by_turn.get(entry["turn"])
        if base is None:
            continue
        # ratios_per_round divides its first argument by the second: baseline TTFT / target TTFT.
        per_round = ratios_per_round(base["ttft_p50_s_per_round"], entry["ttft_p50_s_per_round"])
        speedups.append({"turn": entry["turn"], "per_round": per_round, "ratio": spread(per_round)})
    return speedups
