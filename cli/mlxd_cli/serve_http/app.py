"""The mlx-serve-http application: ``create_app(settings)`` and the gateway middleware.

Contract:
    * ``create_app`` returns a FastAPI app serving the OpenAI routes (``openai_routes``) and the
      llama-server routes (``llama_routes``) in front of a ``DaemonPool``; the pool is started and
      stopped with the app (lifespan), so one process could host several apps.
    * ``GatewayMiddleware`` (pure ASGI, so streaming and disconnects pass through untouched) runs
      before any route, in this order: count the request in the metrics; demand
      ``Authorization: Bearer KEY`` when an API key is set (every path but /health; compared in
      constant time); refuse bodies over ``max_body_bytes`` with 413, by Content-Length and by
      counting the bytes that actually arrive; refuse with 429 + Retry-After, at once, a request
      beyond ``max_concurrency`` in flight (no queue: the daemons already queue).
    * The helpers both route modules use to answer from a ``GenerationStream``: SSE framing,
      ``ClosingStreamingResponse`` (closes its body iterator however the response ends, a client
      disconnect included, so the daemon gets Cancel at once), and ``collect_generation`` for
      non-streaming answers (also stops on a disconnect).
"""

from __future__ import annotations

import hmac
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import StreamingResponse

from mlxd_protocol import Chunk, DaemonError, DaemonTimeout, Done

from .daemon_pool import DaemonPool, GenerationStream
from .errors import ApiError, from_daemon_failure, install_error_handlers
from .metrics import GatewayMetrics

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
# Paths that never take a concurrency slot: they must answer even when the gateway is saturated.
UNLIMITED_PATHS = frozenset({"/health", "/metrics"})
OPEN_PATHS = frozenset({"/health"})  # reachable without the API key (load balancers probe it)
DEFAULT_MAX_REQUESTS_PER_CLIENT = 32  # one client cannot hold every row of every daemon
CLIENT_CLOSED_STATUS = 499  # recorded when the client left before any response started


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


def create_app(settings: Settings) -> FastAPI:
    """Build the gateway application.

    Args:
        settings: Daemons, limits and the API key.

    Returns:
        The FastAPI app (serve it with uvicorn).
    """
    from . import llama_routes, openai_routes  # here, not above: the routes import this module's helpers

    pool = DaemonPool(settings.daemons, health_interval_s=settings.health_interval_s)
    metrics = GatewayMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await pool.start()
        try:
            yield
        finally:
            await pool.stop()

    app = FastAPI(title="mlx-serve-http", version="0.1.0", lifespan=lifespan,
                  description="OpenAI- and llama-server-compatible HTTP front for the mlxd daemon.")
    app.state.settings = settings
    app.state.pool = pool
    app.state.metrics = metrics
    app.state.token_texts = {}  # token id -> text, for logprobs (the vocabulary is finite)
    install_error_handlers(app)
    app.include_router(openai_routes.router)
    app.include_router(llama_routes.router)
    app.add_middleware(GatewayMiddleware, settings=settings, metrics=metrics)
    return app


class GatewayMiddleware:
    """Metrics, auth, body-size and concurrency limits; see the module docstring.

    Args:
        app: The wrapped ASGI app.
        settings: The limits and the API key.
        metrics: Where requests are counted.
    """

    def __init__(self, app, settings: Settings, metrics: GatewayMetrics) -> None:
        self.app = app
        self.settings = settings
        self.metrics = metrics
        self._expected_auth = f"Bearer {settings.api_key}".encode() if settings.api_key else None
        self._per_client: dict[str, int] = {}

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        sent_status = CLIENT_CLOSED_STATUS

        async def send_recording_status(message) -> None:
            nonlocal sent_status
            if message["type"] == "http.response.start":
                sent_status = message["status"]
            await send(message)

        try:
            await self._guarded(scope, receive, send_recording_status, path)
        finally:
            self.metrics.count_request(path, sent_status)

    async def _guarded(self, scope, receive, send, path: str) -> None:
        if self._expected_auth is not None and path not in OPEN_PATHS and not self._authorized(scope):
            await _send_error(send, ApiError(401, "missing or wrong API key: send Authorization: Bearer <key>",
                                             code="invalid_api_key"), {"WWW-Authenticate": "Bearer"})
            return
        body_receive = await self._read_body(scope, receive, send)
        if body_receive is None:
            return  # refused (413 / 400) or the client left while sending
        limit = self.settings.max_concurrency
        limited = path not in UNLIMITED_PATHS
        if limited and limit is not None and self.metrics.in_flight >= limit:
            await _send_error(send, ApiError(429, f"the server is at its limit of {limit} requests in flight; "
                                                  "retry shortly", code="too_many_requests"))
            return
        client = (scope.get("client") or ("?", 0))[0]
        per_client = self.settings.max_requests_per_client
        if limited and per_client is not None and self._per_client.get(client, 0) >= per_client:
            await _send_error(send, ApiError(429, f"this client already has {per_client} requests in flight; "
                                                  "retry when one finishes", code="too_many_requests"))
            return
        if limited:
            self.metrics.in_flight += 1
            self._per_client[client] = self._per_client.get(client, 0) + 1
        try:
            await self.app(scope, body_receive, send)
        finally:
            if limited:
                self.metrics.in_flight -= 1
                self._per_client[client] -= 1
                if not self._per_client[client]:
                    del self._per_client[client]

    def _authorized(self, scope) -> bool:
        given = b""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                given = value
                break
        return hmac.compare_digest(given, self._expected_auth)

    async def _read_body(self, scope, receive, send):
        """Read the whole body under the size limit; return a receive that replays it.

        Returns None when the request was answered here (413, bad Content-Length) or the client
        disconnected while sending. Later receive() calls reach the server's, so routes still see
        the client's disconnect.
        """
        limit = self.settings.max_body_bytes
        declared = _header(scope, b"content-length")
        if declared is not None:
            if not declared.isdigit():
                await _send_error(send, ApiError(400, f"invalid Content-Length {declared!r}", code="invalid_header"))
                return None
            if int(declared) > limit:
                await _send_error(send, _too_large(limit))
                return None
        if scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            return receive
        _treat_body_as_json(scope)
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:  # a chunked upload (or a lying Content-Length): stop reading now
                await _send_error(send, _too_large(limit))
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay_body():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return replay_body


def _treat_body_as_json(scope) -> None:
    """Every POST body here is JSON; read it as such whatever Content-Type says.

    ``curl -d`` sends ``application/x-www-form-urlencoded``, and llama-server and mlx_lm.server
    parse the body as JSON regardless, so clients written for them must work here too.
    """
    content_type = _header(scope, b"content-type") or ""
    if "json" not in content_type.lower():
        headers = [(key, value) for key, value in scope.get("headers", ()) if key != b"content-type"]
        scope["headers"] = [*headers, (b"content-type", b"application/json")]


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"the request body is larger than the limit of {limit} bytes (--max-body-bytes)",
                    code="request_too_large")


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1").strip()
    return None


async def _send_error(send, error: ApiError, extra_headers: dict[str, str] | None = None) -> None:
    """Answer an error straight from the middleware, in OpenAI's shape."""
    body = json.dumps(error.body()).encode()
    headers = {"content-type": "application/json", "content-length": str(len(body)), **error.headers(),
               **(extra_headers or {})}
    await send({"type": "http.response.start", "status": error.status,
                "headers": [(key.lower().encode(), value.encode()) for key, value in headers.items()]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


# ---- answering from a generation stream (used by both route modules) --------------------------

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # proxies must not buffer tokens


def sse_event(payload: bytes | str) -> bytes:
    """One server-sent event carrying ``payload`` (a JSON document or ``[DONE]``)."""
    data = payload if isinstance(payload, bytes) else payload.encode()
    return b"data: " + data + b"\n\n"


class ClosingStreamingResponse(StreamingResponse):
    """A StreamingResponse that always closes its body iterator when the response ends.

    Starlette stops iterating when the client disconnects but leaves a generator suspended at a
    ``yield`` for the garbage collector; closing it here runs its ``finally`` now, which cancels
    the generation on the daemon instead of letting it run to max_tokens.
    """

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                await close()


async def sse_body(stream: GenerationStream, request: Request,
                   events_for: Callable[[Chunk | Done], AsyncIterator[bytes]], opening: bytes | None = None,
                   ) -> AsyncIterator[bytes]:
    """The body of a streaming answer: ``opening`` (if any), then ``events_for(reply)`` for every reply.

    Shared by every streaming route, which only says what each reply becomes. The stream ends after the
    Done's events, or when the client has gone (the ``finally`` cancels the generation on the daemon). A
    daemon failure mid-stream is told in-band as one error event, in OpenAI's error shape.
    """
    try:
        if opening is not None:
            yield opening
        async for reply in stream:
            async for event in events_for(reply):
                yield event
            if isinstance(reply, Done) or await request.is_disconnected():
                return
    except ApiError as error:
        yield sse_event(error.encoded())
    except Exception as error:  # noqa: BLE001 - the daemon failed mid-stream: tell the client in-band
        yield sse_event(from_daemon_failure(error).encoded())
    finally:
        await stream.aclose()


def unsent_part(streamed_text: str, streamed_tokens: list[int], done: Done) -> tuple[str, list[int]]:
    """The text and tokens of a Done that no Chunk carried yet.

    docs/protocol.md says a streaming Done carries only what was not sent in chunks, while the
    daemon sends the whole output in the Done; accept both: when the Done's tokens are every token
    (they begin with the streamed ones and number usage.completion_tokens) it holds the whole output.

    Args:
        streamed_text: The text of every Chunk so far.
        streamed_tokens: The tokens of every Chunk so far.
        done: The generation's Done.

    Returns:
        (text, tokens) to add after the streamed ones.
    """
    if not streamed_tokens and not streamed_text:
        return done.text, list(done.tokens)
    whole = (len(done.tokens) == done.usage.get("completion_tokens", -1)
             and done.tokens[: len(streamed_tokens)] == streamed_tokens and done.text.startswith(streamed_text))
    if whole:
        return done.text[len(streamed_text):], list(done.tokens[len(streamed_tokens):])
    return done.text, list(done.tokens)


class StreamedOutput:
    """What a stream sent so far, to take only the new part of its Done (see ``unsent_part``)."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.tokens: list[int] = []

    def add(self, reply: Chunk | Done) -> tuple[str, list[int]]:
        """Record a reply.

        Args:
            reply: The next Chunk, or the Done.

        Returns:
            The reply's new text and tokens.
        """
        if isinstance(reply, Done):
            text, tokens = unsent_part("".join(self.parts), self.tokens, reply)
        else:
            text, tokens = reply.text, list(reply.tokens)
        self.parts.append(text)
        self.tokens.extend(tokens)
        return text, tokens

    @property
    def text(self) -> str:
        return "".join(self.parts)


@dataclass
class CollectedGeneration:
    """A whole generation gathered from its stream (for non-streaming answers)."""

    text: str
    tokens: list[int]
    logprobs: list[dict]
    done: Done


async def collect_generation(stream: GenerationStream, request: Request) -> CollectedGeneration | None:
    """Read a stream to its Done, stopping early (and cancelling) if the HTTP client went away.

    Args:
        stream: An open generation.
        request: The HTTP request (to notice a disconnect between chunks).

    Returns:
        The text, tokens, logprob entries and Done; None when the client disconnected.

    Raises:
        ApiError: The daemon failed mid-generation.
    """
    output = StreamedOutput()
    logprobs: list[dict] = []
    try:
        async for reply in stream:
            output.add(reply)
            if isinstance(reply, Done):
                return CollectedGeneration(output.text, output.tokens, logprobs, reply)
            logprobs.extend(reply.logprobs or ())
            if await request.is_disconnected():
                return None
    except (DaemonError, DaemonTimeout) as error:
        raise from_daemon_failure(error) from error
    finally:
        await stream.aclose()
    raise from_daemon_failure(DaemonError("internal", "the stream ended without a done"))
