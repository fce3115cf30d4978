"""The gateway middleware: metrics, browser checks, auth, body limits and concurrency limits, before any route.

Contract: ``GatewayMiddleware`` (pure ASGI, so streaming and disconnects pass through untouched) runs before any
route, in this order: count the request in the metrics; refuse a Host header the gateway does not answer to (400) and
a browser request from a foreign origin (403), as ``request_guard`` says; demand ``Authorization: Bearer KEY`` or
``x-api-key: KEY`` (Anthropic's header) for one of the API keys when keys are set (every path but /health, /v1/health
and the web UI's static files, ``settings.web_ui_open_path``; compared in constant time, with every key), and run the
request with its key's draft store (``draft_keys``); refuse a body that is not JSON (415); refuse bodies over
``max_body_bytes`` with 413, by Content-Length and by counting the bytes that actually arrive; answer 408 and close
the connection when the body does not arrive within ``body_timeout_s``; refuse with 429 + Retry-After, at once, a
request beyond ``max_concurrency`` in flight (no queue: the daemons already queue) or beyond
``max_requests_per_client`` from one address. Its errors have OpenAI's body, Anthropic's on ``/v1/messages`` paths
(``errors.uses_anthropic_shape``). Response header names go out capitalised (``Content-Type``), as llama-server writes
them (``canonical_header_names``).
"""

from __future__ import annotations

import asyncio
import hmac

from .draft_keys import REQUEST_DRAFT_KEY, key_id
from .errors import ApiError
from .metrics import GatewayMetrics
from .request_guard import content_type_problem, host_problem, origin_problem
from .settings import SERVICE_WORKER_PATH, Settings, web_ui_open_path

# Paths that never take a concurrency slot: they must answer even when the gateway is saturated.
# (The live view's feed holds no daemon row and has its own bound on viewers, tick_feed.MAX_VIEWERS.)
UNLIMITED_PATHS = frozenset({"/health", "/v1/health", "/metrics", "/ui/ticks/stream"})
# reachable without the API key: the health checks (load balancers probe them) and llama-server's service worker
OPEN_PATHS = frozenset({"/health", "/v1/health", SERVICE_WORKER_PATH})
CLIENT_CLOSED_STATUS = 499  # recorded when the client left before any response started


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
        # each key: (its Authorization value, its x-api-key value, its draft store's id)
        self._keys = [(f"Bearer {key}".encode(), key.encode(), key_id(key)) for key in settings.api_keys]
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
                message = {**message, "headers": canonical_header_names(message.get("headers", ()))}
            await send(message)

        try:
            await self._guarded(scope, receive, send_recording_status, path)
        finally:
            self.metrics.count_request(path, sent_status)

    async def _guarded(self, scope, receive, send, path: str) -> None:
        host = _header(scope, b"host")
        refused = host_problem(host, self.settings.allowed_hosts) or origin_problem(
            _header(scope, b"origin"), host, self.settings.cors_origins
        )
        if refused is not None:
            await _send_error(send, path, refused)
            return
        draft_key = self._key_of(scope) if self._keys else None
        if self._keys and not self._open(path) and draft_key is None:
            await _send_error(
                send,
                path,
                ApiError(
                    401,
                    "missing or wrong API key: send Authorization: Bearer <key> or x-api-key: <key>",
                    code="invalid_api_key",
                ),
                {"WWW-Authenticate": "Bearer"},
            )
            return
        body_receive = await self._read_body(scope, receive, send)
        if body_receive is None:
            return  # refused (413 / 400) or the client left while sending
        limit = self.settings.max_concurrency
        limited = path not in UNLIMITED_PATHS
        if limited and limit is not None and self.metrics.in_flight >= limit:
            await _send_error(
                send,
                path,
                ApiError(
                    429,
                    f"the server is at its limit of {limit} requests in flight; retry shortly",
                    code="too_many_requests",
                ),
            )
            return
        client = (scope.get("client") or ("?", 0))[0]
        per_client = self.settings.max_requests_per_client
        if limited and per_client is not None and self._per_client.get(client, 0) >= per_client:
            await _send_error(
                send,
                path,
                ApiError(
                    429,
                    f"this client already has {per_client} requests in flight; retry when one finishes",
                    code="too_many_requests",
                ),
            )
            return
        if limited:
            self.metrics.in_flight += 1
            self._per_client[client] = self._per_client.get(client, 0) + 1
        token = REQUEST_DRAFT_KEY.set(draft_key)
        try:
            await self.app(scope, body_receive, send)
        finally:
            REQUEST_DRAFT_KEY.reset(token)
            if limited:
                self.metrics.in_flight -= 1
                self._per_client[client] -= 1
                if not self._per_client[client]:
                    del self._per_client[client]

    def _open(self, path: str) -> bool:
        """Whether ``path`` is answered without the API key: /health, and the web UI's files while it is on."""
        return path in OPEN_PATHS or (self.settings.ui_enabled and web_ui_open_path(path))

    def _key_of(self, scope) -> str | None:
        """The draft store id of the key the request sent: its first Authorization header is ``Bearer KEY``
        or its first x-api-key header is ``KEY``, for one of the keys; None when neither is. Every key is
        compared, both ways, in constant time, so timing tells nothing of which key or header matched."""
        bearer = api_key = None
        for name, value in scope.get("headers", ()):
            if name == b"authorization" and bearer is None:
                bearer = value
            elif name == b"x-api-key" and api_key is None:
                api_key = value
        found = None
        for expected_auth, expected_key, draft_key in self._keys:
            bearer_ok = hmac.compare_digest(bearer or b"", expected_auth)
            api_key_ok = hmac.compare_digest(api_key or b"", expected_key)
            if (bearer_ok or api_key_ok) and found is None:
                found = draft_key
        return found

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
                await _send_error(
                    send, scope["path"], ApiError(400, f"invalid Content-Length {declared!r}", code="invalid_header")
                )
                return None
            if int(declared) > limit:
                await _send_error(send, scope["path"], _too_large(limit))
                return None
        if scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            return receive
        refused = content_type_problem(_header(scope, b"content-type"))
        if refused is not None:
            await _send_error(send, scope["path"], refused)
            return None
        _treat_body_as_json(scope)
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.settings.body_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return None
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > limit:  # a chunked upload (or a lying Content-Length): stop reading now
                        await _send_error(send, scope["path"], _too_large(limit))
                        return None
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            timeout = ApiError(
                408,
                f"the request body did not arrive within {self.settings.body_timeout_s:g} s",
                code="request_timeout",
            )
            await _send_error(send, scope["path"], timeout, {"Connection": "close"})
            return None
        body = b"".join(chunks)
        replayed = False

        async def replay_body():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return replay_body


def canonical_header_names(headers) -> list[tuple[bytes, bytes]]:
    """Response header names as HTTP servers write them (``Content-Type``, ``Process-Start-Time-Unix``).

    Names are case-insensitive, but Starlette lowercases them, and clients written against llama-server
    (which sends them as named) sometimes look them up case-sensitively in a plain dict.
    """
    return [(b"-".join(part[:1].upper() + part[1:] for part in name.split(b"-")), value) for name, value in headers]


def _treat_body_as_json(scope) -> None:
    """Read a body sent without a Content-Type, or as ``curl -d`` sends it, as JSON.

    ``curl -d`` sends ``application/x-www-form-urlencoded``, and llama-server and mlx_lm.server
    parse the body as JSON regardless, so clients written for them must work here too; other
    content types were refused before (``request_guard.content_type_problem``).
    """
    content_type = _header(scope, b"content-type") or ""
    if "json" not in content_type.lower():
        headers = [(key, value) for key, value in scope.get("headers", ()) if key != b"content-type"]
        scope["headers"] = [*headers, (b"content-type", b"application/json")]


def _too_large(limit: int) -> ApiError:
    return ApiError(
        413, f"the request body is larger than the limit of {limit} bytes (--max-body-bytes)", code="request_too_large"
    )


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1").strip()
    return None


async def _send_error(send, path: str, error: ApiError, extra_headers: dict[str, str] | None = None) -> None:
    """Answer an error straight from the middleware, in OpenAI's shape (Anthropic's on its paths)."""
    body = error.encoded(path)
    headers = {
        "content-type": "application/json",
        "content-length": str(len(body)),
        **error.headers(),
        **(extra_headers or {}),
    }
    await send(
        {
            "type": "http.response.start",
            "status": error.status,
            "headers": [(key.lower().encode(), value.encode()) for key, value in headers.items()],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})
