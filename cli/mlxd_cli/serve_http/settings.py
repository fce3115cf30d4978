"""How one mlx-serve-http gateway runs: ``Settings`` and its defaults (plain data, imported by every part)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_REQUESTS_PER_CLIENT = 32  # one client cannot hold every row of every daemon


@dataclass
class Settings:
    """How one gateway runs.

    Attributes:
        daemons: Daemon endpoints to spread requests over (at least one).
        api_key: When set, every endpoint but /health demands ``Authorization: Bearer <api_key>``.
        max_concurrency: Most requests in flight at once (None: no limit).
        max_body_bytes: Largest request body accepted.
        max_requests_per_client: Most requests in flight from one client address (None: no limit).
        health_interval_s: Seconds between health probes of each daemon.
    """

    daemons: list[str]
    api_key: str | None = None
    max_concurrency: int | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_requests_per_client: int | None = DEFAULT_MAX_REQUESTS_PER_CLIENT
    health_interval_s: float = 1.0
