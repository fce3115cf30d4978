"""What a route may use of the gateway: a narrow context object, not the app's internals.

Contract: ``create_app`` stores one ``GatewayContext`` on the app (``install_context``); a route gets it
with ``gateway(request)``. It holds the settings and the daemon pool (to open generations and make
calls), and is the only way a route reaches state the app keeps: ``count_generation(done)`` (the
metrics of a finished generation), ``token_texts(entries)`` (the text of logprob tokens, cached per
gateway: the vocabulary is finite), ``model_name(handle)`` (the ``model`` of every reply: the
``--alias``, else the last component of the daemon's model path, never a whole path) and
``tick_feed(handle)`` (the daemon's tick trace for the web UI's live view, one ``TickFeed`` per daemon).
Routes never read or write ``app.state`` themselves.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from fastapi import FastAPI
from starlette.requests import Request

from mlxd_protocol import Done

from .daemon_pool import DaemonHandle, DaemonPool, call_daemon
from .metrics import GatewayMetrics
from .settings import Settings
from .tick_feed import TickFeed


@dataclass
class GatewayContext:
    settings: Settings
    pool: DaemonPool
    metrics: GatewayMetrics
    _token_texts: dict[int, str] = field(default_factory=dict, repr=False)  # token id -> text
    _tick_feeds: dict[str, TickFeed] = field(default_factory=dict, repr=False)  # endpoint -> its feed

    def tick_feed(self, handle: DaemonHandle) -> TickFeed:
        """The tick trace of a daemon, shared by every viewer of the live view."""
        feed = self._tick_feeds.get(handle.endpoint)
        if feed is None:
            feed = self._tick_feeds[handle.endpoint] = TickFeed(handle)
        return feed

    def model_name(self, handle: DaemonHandle) -> str:
        """The model id replies carry for a daemon: the alias, else its checkpoint's name."""
        if self.settings.model_alias:
            return self.settings.model_alias
        return checkpoint_name(handle.status.model) if handle.status is not None else "mlxd"

    def count_generation(self, done: Done) -> None:
        """Record a finished generation (tokens, speed) in the metrics."""
        self.metrics.count_generation(done.usage, done.timings)

    async def token_texts(self, entries: list[dict]) -> dict[int, str]:
        """Text of every token (sampled and alternatives) in logprob entries.

        Args:
            entries: The daemon's logprob entries ``{"token", "logprob", "top": [[id, logprob], ...]}``.

        Returns:
            token id -> text, for every token the entries name (and those cached before).
        """
        cache = self._token_texts
        wanted = {entry["token"] for entry in entries} | {
            pair[0] for entry in entries for pair in entry.get("top") or ()
        }
        missing = sorted(token for token in wanted if token not in cache)
        if missing:
            pool = self.pool
            # SentencePiece drops the leading space of the first token decoded: decode the token twice
            # and keep what the second copy added, which is its text in the middle of a sequence.
            # (mypy cannot infer the type of a lambda with a default argument: the ignores below)
            alone, twice = await asyncio.gather(
                asyncio.gather(
                    *(
                        call_daemon(pool, lambda client, token=token: client.detokenize([token]))  # type: ignore[misc]
                        for token in missing
                    )
                ),
                asyncio.gather(
                    *(
                        call_daemon(
                            pool,
                            lambda client, token=token: client.detokenize([token, token]),  # type: ignore[misc]
                        )
                        for token in missing
                    )
                ),
            )
            cache.update(
                (token, double[len(single) :] if double.startswith(single) else single)
                for token, single, double in zip(missing, alone, twice)
            )
        return cache


def checkpoint_name(model: str) -> str:
    """The last component of a model path or hub id (``/models/SmolLM2-135M/`` -> ``SmolLM2-135M``).

    Args:
        model: The model as the daemon reports it (a local path, a hub id, a .gguf file).

    Returns:
        Its name, which reveals no directory of the server.
    """
    name = model.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
    return name or "mlxd"


def install_context(app: FastAPI, context: GatewayContext) -> None:
    """Attach the gateway's context to ``app`` (done once, by ``create_app``)."""
    app.state.gateway = context


def gateway(request: Request) -> GatewayContext:
    """The context of the gateway serving ``request``."""
    return request.app.state.gateway
