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
"""

from __future__ import annotations

from collections import Counter, deque

from mlxd_protocol import Status

RECENT_REQUESTS = 16
KNOWN_ENDPOINTS = frozenset({
    "/v1/chat/completions", "/v1/completions", "/v1/models", "/completion", "/tokenize", "/detokenize",
    "/health", "/metrics", "/openapi.json", "/docs",
})
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

    def render(self, daemons: list[tuple[str, bool, Status | None]]) -> str:
        """The metrics page.

        Args:
            daemons: (endpoint, up, fresh Status or None) for each daemon.

        Returns:
            Prometheus text exposition.
        """
        lines: list[str] = []
        _family(lines, "mlxd_http_requests_total", "counter", "HTTP requests answered, by endpoint and status",
                [(f'endpoint="{path}",status="{status}"', count) for (path, status), count in sorted(self.requests.items())])
        _family(lines, "mlxd_http_requests_in_flight", "gauge", "HTTP requests being served", [("", self.in_flight)])
        _family(lines, "mlxd_http_prompt_tokens_total", "counter", "prompt tokens of finished generations",
                [("", self.prompt_tokens)])
        _family(lines, "mlxd_http_generated_tokens_total", "counter", "tokens generated for HTTP clients",
                [("", self.generated_tokens)])
        recent = self.recent_tokens_per_s
        _family(lines, "mlxd_http_tokens_per_second", "gauge",
                f"mean decode tokens/s of the last {RECENT_REQUESTS} generations",
                [("", round(sum(recent) / len(recent), 3) if recent else 0.0)])
        labels = {endpoint: f'daemon="{index}"' for index, (endpoint, _, _) in enumerate(daemons)}
        _family(lines, "mlxd_daemon_up", "gauge", "1 when the daemon answered its last health probe",
                [(labels[endpoint], int(up)) for endpoint, up, _ in daemons])
        answered = [(endpoint, status) for endpoint, _, status in daemons if status is not None]
        _family(lines, "mlxd_daemon_queued", "gauge", "requests waiting for a decode slot",
                [(labels[endpoint], status.queued) for endpoint, status in answered])
        _family(lines, "mlxd_daemon_active", "gauge", "sequences being decoded together (batch size)",
                [(labels[endpoint], status.active) for endpoint, status in answered])
        kv = [(endpoint, status.memory.get("kv") or {}) for endpoint, status in answered]
        _family(lines, "mlxd_daemon_kv_blocks_used", "gauge", "paged KV blocks holding tokens (paged storage only)",
                [(labels[endpoint], usage["blocks_used"]) for endpoint, usage in kv if "blocks_used" in usage])
        _family(lines, "mlxd_daemon_kv_blocks_cached", "gauge",
                "paged KV blocks the prefix cache holds, shared with sequences or not (paged storage only)",
                [(labels[endpoint], usage["blocks_cached"]) for endpoint, usage in kv if "blocks_cached" in usage])
        _family(lines, "mlxd_daemon_kv_blocks", "gauge", "paged KV blocks in the pool (paged storage only)",
                [(labels[endpoint], usage["blocks"]) for endpoint, usage in kv if "blocks" in usage])
        _family(lines, "mlxd_daemon_kv_slots_free", "gauge", "free KV slots (contiguous storage only)",
                [(labels[endpoint], usage["slots_free"]) for endpoint, usage in kv if "slots_free" in usage])
        _family(lines, "mlxd_daemon_kv_allocated_bytes", "gauge", "bytes of KV buffers allocated",
                [(labels[endpoint], usage.get("allocated_bytes", 0)) for endpoint, usage in kv])
        cached = [(endpoint, usage["prefix_cache"]) for endpoint, usage in kv if "prefix_cache" in usage]
        for key, kind, help_text in PREFIX_CACHE_FIGURES:
            _family(lines, f"mlxd_daemon_prefix_cache_{key}", kind, help_text,
                    [(labels[endpoint], stats.get(key.removesuffix("_total"), 0)) for endpoint, stats in cached])
        for key, suffix in DAEMON_TOTALS.items():
            _family(lines, f"mlxd_daemon_{suffix}", "counter", f"daemon total {key} since it started",
                    [(labels[endpoint], status.totals.get(key, 0)) for endpoint, status in answered])
        return "\n".join(lines) + "\n"


# the prefix cache's figures (mlxd status: memory.kv.prefix_cache), as metric name suffix, kind and help
PREFIX_CACHE_FIGURES = [
    ("entries", "gauge", "prefix cache entries held"),
    ("bytes", "gauge", "bytes the prefix cache holds"),
    ("hits_total", "counter", "requests that reused a cached prefix"),
    ("tokens_saved_total", "counter", "prompt tokens taken from the prefix cache instead of prefilled"),
]


def _family(lines: list[str], name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
    lines.append(f"# HELP {name} {help_text}")
    lines.append(f"# TYPE {name} {kind}")
    for labels, value in samples:
        lines.append(f"{name}{{{labels}}} {value}" if labels else f"{name} {value}")

