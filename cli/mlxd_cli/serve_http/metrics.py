"""Gateway metrics in the Prometheus text format (version 0.0.4), without a client library.

Contract:
    * ``GatewayMetrics`` counts what the gateway sees: requests by endpoint and status, prompt and
      generated tokens, and the decode speed of the last ``RECENT_REQUESTS`` generations.
    * ``render`` adds what the daemons report, one series per daemon (label ``daemon``: its place in the
      gateway's ``--daemon`` list, 0 first; an endpoint can be a socket path, which no reply names): up, queued,
      active (the batch being decoded), and from ``Status.totals`` the speculative-decoding counters
      draft_tokens, draft_accepted, verify_rounds, declined_gate, declined_governor, declined_cost, padded_forwards.
    * Endpoint labels are the known routes only (anything else is "other"), so a scan of random
      URLs cannot grow the number of series.

Metric names:
    mlxd_http_requests_total{endpoint,status}  counter
    mlxd_http_requests_in_flight               gauge
    mlxd_http_prompt_tokens_total              counter
    mlxd_http_generated_tokens_total           counter
    mlxd_http_tokens_per_second                gauge (mean decode tok/s of the last requests)
    mlxd_daemon_up{daemon}                     gauge
    mlxd_daemon_queued{daemon}                 gauge
    mlxd_daemon_active{daemon}                 gauge
    mlxd_daemon_draft_tokens_total{daemon}     counter
    mlxd_daemon_draft_accepted_total{daemon}   counter
    mlxd_daemon_verify_rounds_total{daemon}    counter
    mlxd_daemon_declined_gate_total{daemon}    counter
    mlxd_daemon_declined_governor_total{daemon} counter
    mlxd_daemon_declined_cost_total{daemon}    counter
    mlxd_daemon_padded_forwards_total{daemon}  counter
    mlxd_daemon_draft_tokens_by_source_total{daemon,source}    counter (prompt, output, prediction, shared)
    mlxd_daemon_draft_accepted_by_source_total{daemon,source}  counter

llama-server's names (``llamacpp:``), from the same generations (``LlamaTotals``) and the daemons' Status:
    llamacpp:prompt_tokens_total, prompt_tokens_cached_total, prompt_seconds_total, tokens_predicted_total,
    tokens_predicted_seconds_total, n_decode_total (forward passes: one prefill and one per later token of
    each generation), n_tokens_max (longest sequence seen), spec_decode_num_draft_tokens_total,
    spec_decode_num_accepted_tokens_total, spec_decode_num_drafts_total (verify rounds)   counters
    llamacpp:prompt_tokens_seconds, predicted_tokens_seconds (mean rates of those totals),
    requests_processing (rows decoding), requests_deferred (queued), n_busy_slots_per_decode   gauges
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass

from mlxd_protocol import Status

RECENT_REQUESTS = 16
KNOWN_ENDPOINTS = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/models",
        "/completion",
        "/tokenize",
        "/detokenize",
        "/health",
        "/v1/health",
        "/metrics",
        "/openapi.json",
        "/docs",
        "/completions",
        "/chat/completions",
        "/models",
        "/props",
        "/slots",
        "/apply-template",
        "/v1/chat/completions/input_tokens",
        "/chat/completions/input_tokens",
        "/v1/responses",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/embeddings",
        "/embedding",
        "/embeddings",
    }
)
# Status.totals key -> metric name suffix.
DAEMON_TOTALS = {
    "draft_tokens": "draft_tokens_total",
    "draft_accepted": "draft_accepted_total",
    "verify_rounds": "verify_rounds_total",
    "declined_gate": "declined_gate_total",
    "declined_governor": "declined_governor_total",
    "declined_cost": "declined_cost_total",
    "padded_forwards": "padded_forwards_total",
}
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class GatewayMetrics:
    """Counters the gateway keeps; all methods are called from the event loop only."""

    def __init__(self) -> None:
        self.requests: Counter[tuple[str, int]] = Counter()
        self.in_flight = 0
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.recent_tokens_per_s: deque[float] = deque(maxlen=RECENT_REQUESTS)
        self.llama = LlamaTotals()
        self.started = time.time()  # llama-server's Process-Start-Time-Unix header

    def count_request(self, path: str, status: int) -> None:
        """Record one answered HTTP request.

        Args:
            path: The URL path.
            status: The HTTP status sent.
        """
        self.requests[(path if path in KNOWN_ENDPOINTS else "other", status)] += 1

    def count_generation(self, usage: dict, timings: dict) -> None:
        """Record one finished generation from its Done.

        Args:
            usage: ``Done.usage`` (prompt_tokens, completion_tokens).
            timings: ``Done.timings`` (predicted_per_second).
        """
        self.prompt_tokens += int(usage.get("prompt_tokens", 0))
        self.generated_tokens += int(usage.get("completion_tokens", 0))
        speed = timings.get("predicted_per_second")
        if speed:  # 0 for a one-token reply: no decode step was timed
            self.recent_tokens_per_s.append(float(speed))
        self.llama.add(timings)

    def render(self, daemons: list[tuple[str, bool, Status | None]]) -> str:
        """The metrics page.

        Args:
            daemons: (endpoint, up, fresh Status or None) for each daemon.

        Returns:
            Prometheus text exposition.
        """
        lines: list[str] = []
        _family(
            lines,
            "mlxd_http_requests_total",
            "counter",
            "HTTP requests answered, by endpoint and status",
            [
                (f'endpoint="{path}",status="{status}"', count)
                for (path, status), count in sorted(self.requests.items())
            ],
        )
        _family(lines, "mlxd_http_requests_in_flight", "gauge", "HTTP requests being served", [("", self.in_flight)])
        _family(
            lines,
            "mlxd_http_prompt_tokens_total",
            "counter",
            "prompt tokens of finished generations",
            [("", self.prompt_tokens)],
        )
        _family(
            lines,
            "mlxd_http_generated_tokens_total",
            "counter",
            "tokens generated for HTTP clients",
            [("", self.generated_tokens)],
        )
        recent = self.recent_tokens_per_s
        _family(
            lines,
            "mlxd_http_tokens_per_second",
            "gauge",
            f"mean decode tokens/s of the last {RECENT_REQUESTS} generations",
            [("", round(sum(recent) / len(recent), 3) if recent else 0.0)],
        )
        labels = {endpoint: f'daemon="{index}"' for index, (endpoint, _, _) in enumerate(daemons)}
        _family(
            lines,
            "mlxd_daemon_up",
            "gauge",
            "1 when the daemon answered its last health probe",
            [(labels[endpoint], int(up)) for endpoint, up, _ in daemons],
        )
        answered = [(endpoint, status) for endpoint, _, status in daemons if status is not None]
        _family(
            lines,
            "mlxd_daemon_queued",
            "gauge",
            "requests waiting for a decode slot",
            [(labels[endpoint], status.queued) for endpoint, status in answered],
        )
        _family(
            lines,
            "mlxd_daemon_active",
            "gauge",
            "sequences being decoded together (batch size)",
            [(labels[endpoint], status.active) for endpoint, status in answered],
        )
        kv = [(endpoint, status.memory.get("kv") or {}) for endpoint, status in answered]
        _family(
            lines,
            "mlxd_daemon_kv_blocks_used",
            "gauge",
            "paged KV blocks holding tokens (paged storage only)",
            [(labels[endpoint], usage["blocks_used"]) for endpoint, usage in kv if "blocks_used" in usage],
        )
        _family(
            lines,
            "mlxd_daemon_kv_blocks_cached",
            "gauge",
            "paged KV blocks the prefix cache holds, shared with sequences or not (paged storage only)",
            [(labels[endpoint], usage["blocks_cached"]) for endpoint, usage in kv if "blocks_cached" in usage],
        )
        _family(
            lines,
            "mlxd_daemon_kv_blocks",
            "gauge",
            "paged KV blocks in the pool (paged storage only)",
            [(labels[endpoint], usage["blocks"]) for endpoint, usage in kv if "blocks" in usage],
        )
        _family(
            lines,
            "mlxd_daemon_kv_slots_free",
            "gauge",
            "free KV slots (contiguous storage only)",
            [(labels[endpoint], usage["slots_free"]) for endpoint, usage in kv if "slots_free" in usage],
        )
        _family(
            lines,
            "mlxd_daemon_kv_allocated_bytes",
            "gauge",
            "bytes of KV buffers allocated",
            [(labels[endpoint], usage.get("allocated_bytes", 0)) for endpoint, usage in kv],
        )
        cached = [(endpoint, usage["prefix_cache"]) for endpoint, usage in kv if "prefix_cache" in usage]
        for key, kind, help_text in PREFIX_CACHE_FIGURES:
            _family(
                lines,
                f"mlxd_daemon_prefix_cache_{key}",
                kind,
                help_text,
                [(labels[endpoint], stats.get(key.removesuffix("_total"), 0)) for endpoint, stats in cached],
            )
        for key, suffix in DAEMON_TOTALS.items():
            _family(
                lines,
                f"mlxd_daemon_{suffix}",
                "counter",
                f"daemon total {key} since it started",
                [(labels[endpoint], status.totals.get(key, 0)) for endpoint, status in answered],
            )
        for kind in ("tokens", "accepted"):
            _family(
                lines,
                f"mlxd_daemon_draft_{kind}_by_source_total",
                "counter",
                f"daemon total draft {kind} by where the drafts came from since it started",
                [
                    (f'{labels[endpoint]},source="{source}"', count)
                    for endpoint, status in answered
                    for source, count in _by_source(status.totals, kind)
                ],
            )
        self.llama.render(lines, answered)
        return "\n".join(lines) + "\n"


# the prefix cache's figures (mlxd status: memory.kv.prefix_cache), as metric name suffix, kind and help
PREFIX_CACHE_FIGURES = [
    ("entries", "gauge", "prefix cache entries held"),
    ("bytes", "gauge", "bytes the prefix cache holds"),
    ("hits_total", "counter", "requests that reused a cached prefix"),
    ("tokens_saved_total", "counter", "prompt tokens taken from the prefix cache instead of prefilled"),
]


def _by_source(totals: dict, kind: str) -> list[tuple[str, int]]:
    """(source, count) of the Status.totals keys ``draft_<kind>_<source>`` (the daemon names its sources)."""
    prefix = f"draft_{kind}_"
    return sorted(
        (key.removeprefix(prefix), int(count))
        for key, count in totals.items()
        if key.startswith(prefix) and key.removeprefix(prefix).isidentifier()
    )


def _family(lines: list[str], name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
    lines.append(f"# HELP {name} {help_text}")
    lines.append(f"# TYPE {name} {kind}")
    for labels, value in samples:
        lines.append(f"{name}{{{labels}}} {value}" if labels else f"{name} {value}")


@dataclass
class LlamaTotals:
    """What llama-server's ``llamacpp:`` metrics count, summed over finished generations' timings."""

    prompt_tokens: int = 0
    prompt_cached: int = 0
    prompt_ms: float = 0.0
    predicted_tokens: int = 0
    predicted_ms: float = 0.0
    decodes: int = 0
    tokens_max: int = 0
    draft_tokens: int = 0
    draft_accepted: int = 0
    drafts: int = 0

    def add(self, timings: dict) -> None:
        """Count one finished generation from its Done's timings."""
        prompt_n, predicted_n = int(timings.get("prompt_n", 0)), int(timings.get("predicted_n", 0))
        self.prompt_tokens += prompt_n
        self.prompt_cached += int(timings.get("cache_n", 0))
        self.prompt_ms += float(timings.get("prompt_ms", 0.0))
        self.predicted_tokens += predicted_n
        self.predicted_ms += float(timings.get("predicted_ms", 0.0))
        self.decodes += (1 if prompt_n else 0) + max(predicted_n - 1, 0)
        self.tokens_max = max(self.tokens_max, prompt_n + int(timings.get("cache_n", 0)) + predicted_n)
        self.draft_tokens += int(timings.get("draft_n", 0))
        self.draft_accepted += int(timings.get("draft_n_accepted", 0))
        self.drafts += int(timings.get("draft_verify_n", 0))

    def render(self, lines: list[str], answered: list[tuple[str, Status]]) -> None:
        """Append the llamacpp: families (``answered``: (endpoint, Status) of the daemons that answered)."""
        counters = [
            ("prompt_tokens_total", "prompt tokens processed", self.prompt_tokens),
            ("prompt_tokens_cached_total", "prompt tokens taken from the prefix cache", self.prompt_cached),
            ("prompt_seconds_total", "prompt processing time", self.prompt_ms / 1e3),
            ("tokens_predicted_total", "generation tokens processed", self.predicted_tokens),
            ("tokens_predicted_seconds_total", "generation processing time", self.predicted_ms / 1e3),
            ("n_decode_total", "forward passes of the generations (a prefill, then one per token)", self.decodes),
            ("n_tokens_max", "largest sequence (prompt and output) seen", self.tokens_max),
            ("spec_decode_num_draft_tokens_total", "draft tokens proposed", self.draft_tokens),
            ("spec_decode_num_accepted_tokens_total", "draft tokens accepted", self.draft_accepted),
            ("spec_decode_num_drafts_total", "verify rounds", self.drafts),
        ]
        for name, help_text, value in counters:
            _family(lines, f"llamacpp:{name}", "counter", help_text, [("", value)])
        active = sum(status.active for _, status in answered)
        gauges = [
            (
                "prompt_tokens_seconds",
                "average prompt throughput in tokens/s",
                self.prompt_tokens / (self.prompt_ms / 1e3) if self.prompt_ms else 0.0,
            ),
            (
                "predicted_tokens_seconds",
                "average generation throughput in tokens/s",
                self.predicted_tokens / (self.predicted_ms / 1e3) if self.predicted_ms else 0.0,
            ),
            ("requests_processing", "requests being decoded", active),
            ("requests_deferred", "requests waiting for a row", sum(status.queued for _, status in answered)),
            ("n_busy_slots_per_decode", "rows decoding together now", active),
        ]
        for name, help_text, value in gauges:
            _family(lines, f"llamacpp:{name}", "gauge", help_text, [("", value)])
