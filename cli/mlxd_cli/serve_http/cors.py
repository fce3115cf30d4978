"""CORS for the gateway: which browser origins may read its replies, with llama-server's options.

Contract: ``CorsMiddleware`` (pure ASGI, outermost, so it answers preflights before the API key is
asked for and its headers reach error replies too) is installed only when ``Settings.cors_origins``
names origins. For a request whose ``Origin`` is allowed (in ``cors_origins``, or any with "*"):
    * every reply carries ``Access-Control-Allow-Origin``: "*" when any origin is allowed without
      credentials, else the request's origin echoed (with ``Vary: Origin``), since browsers refuse "*"
      on a credentialed request (llama-server's ``--cors-credentials`` with ``--cors-origins *``);
      plus ``Access-Control-Allow-Credentials: true`` when ``cors_credentials``;
    * a preflight (``OPTIONS`` with ``Origin`` and ``Access-Control-Request-Method``) is answered here,
      200 with ``Access-Control-Allow-Methods`` / ``-Headers`` set to ``cors_methods`` / ``cors_headers``
      as written ("*" is sent as "*", as llama-server sends it), ``Access-Control-Allow-Credentials``
      ("true" or "false") and ``Access-Control-Max-Age``.
Header names are sent capitalised, as llama-server sends them (some clients read them case-sensitively).
A preflight from an origin not allowed, or asking for a method or header not allowed, gets 400 with
no ``Access-Control-Allow-Origin`` (the browser then refuses the request); the request itself, should a
page send it without a preflight, is refused with 403 by ``request_guard.origin_problem``.
"""

from __future__ import annotations

from .settings import Settings

MAX_AGE_S = 600
# Request headers a browser sends without asking (CORS-safelisted); always allowed.
SAFELISTED_HEADERS = frozenset({"accept", "accept-language", "content-language", "content-type"})


def split_list(value: str) -> tuple[str, ...]:
    """A comma-separated option as its items (stripped, empty ones dropped)."""
    return tuple(item.strip() for item in value.split(",") if item.strip())


class CorsMiddleware:
    """See the module docstring.

    Args:
        app: The wrapped ASGI app.
        settings: ``cors_origins``, ``cors_methods``, ``cors_headers`` and ``cors_credentials``.
    """

    def __init__(self, app, settings: Settings) -> None:
        self.app = app
        self.any_origin = "*" in settings.cors_origins
        self.origins = frozenset(settings.cors_origins)
        self.credentials = settings.cors_credentials
        self.methods_header = settings.cors_methods
        self.methods = frozenset(method.upper() for method in split_list(settings.cors_methods))
        self.headers_header = settings.cors_headers
        self.headers = frozenset(header.lower() for header in split_list(settings.cors_headers))

    def allowed(self, origin: str) -> bool:
        return self.any_origin or origin.rstrip("/") in self.origins

    def origin_headers(self, origin: str) -> list[tuple[bytes, bytes]]:
        """The headers every reply to an allowed ``origin`` carries."""
        if self.any_origin and not self.credentials:
            headers = [(b"Access-Control-Allow-Origin", b"*")]
        else:
            headers = [(b"Access-Control-Allow-Origin", origin.encode("latin-1")), (b"Vary", b"Origin")]
        if self.credentials:
            headers.append((b"Access-Control-Allow-Credentials", b"true"))
        return headers

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        origin = request_method = requested_headers = None
        for name, value in scope.get("headers", ()):
            if name == b"origin":
                origin = value.decode("latin-1").strip()
            elif name == b"access-control-request-method":
                request_method = value.decode("latin-1").strip()
            elif name == b"access-control-request-headers":
                requested_headers = value.decode("latin-1")
        if origin is None:
            await self.app(scope, receive, send)
            return
        if scope["method"] == "OPTIONS" and request_method is not None:
            await self._preflight(send, origin, request_method, requested_headers)
            return
        if not self.allowed(origin):
            await self.app(scope, receive, send)
            return
        extra = self.origin_headers(origin)

        async def send_with_cors(message) -> None:
            if message["type"] == "http.response.start":
                names = {name.lower() for name, _ in extra if name != b"Vary"}
                kept = [(name, value) for name, value in message.get("headers", ()) if name.lower() not in names]
                message = {**message, "headers": [*kept, *extra]}
            await send(message)

        await self.app(scope, receive, send_with_cors)

    async def _preflight(self, send, origin: str, method: str, requested_headers: str | None) -> None:
        failures = []
        if not self.allowed(origin):
            failures.append("origin")
        if "*" not in self.methods and method.upper() not in self.methods:
            failures.append("method")
        if "*" not in self.headers and requested_headers is not None:
            asked = {header.lower() for header in split_list(requested_headers)}
            if asked - self.headers - SAFELISTED_HEADERS:
                failures.append("headers")
        headers = [
            (b"Access-Control-Allow-Methods", self.methods_header.encode("latin-1")),
            (b"Access-Control-Allow-Headers", self.headers_header.encode("latin-1")),
            (b"Access-Control-Allow-Credentials", b"true" if self.credentials else b"false"),
            (b"Access-Control-Max-Age", str(MAX_AGE_S).encode()),
            (b"Vary", b"Origin, Access-Control-Request-Method, Access-Control-Request-Headers"),
        ]
        if failures:  # no Allow-Origin: the browser refuses the request
            body = f"Disallowed CORS {', '.join(failures)}".encode()
            status = 400
        else:
            body, status = b"", 200
            headers = [self.origin_headers(origin)[0], *headers]  # Allow-Origin (Allow-Credentials: above)
        headers += [(b"Content-Type", b"text/plain; charset=utf-8"), (b"Content-Length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})
