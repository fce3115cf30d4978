"""llama-server's ``/cors-proxy``: a GET or POST forwarded to the ``url`` it names (``--ui-mcp-proxy``).

Contract: llama-server's web UI reaches MCP servers in other origins through this route; it is off
unless the gateway runs with ``--ui-mcp-proxy`` (then 403 ``feature_disabled``, as llama-server). On, a
``GET`` or ``POST /cors-proxy?url=URL`` is sent to URL (http or https, a host, no user or password in
it), with the request's body and only the headers the client names explicitly:
``x-llama-server-proxy-header-NAME: VALUE`` goes out as ``NAME: VALUE``, and nothing else of the
request's headers (its API key, cookies, proxy credentials) does. The target's status, content type and
body come back, the body streamed as it arrives. A URL that cannot be forwarded is 400; a target that
cannot be reached is 502. Like every route but /health and the home page's files it needs the API key.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from .context import gateway
from .errors import ERROR_RESPONSES, ApiError

router = APIRouter()
PROXY_HEADER_PREFIX = "x-llama-server-proxy-header-"
TIMEOUT_S = 600.0  # llama-server's read and write timeouts for a proxied request (10 minutes)
# the target's headers passed back (not its encoding: the body goes back decoded; not hop-by-hop ones)
KEPT_RESPONSE_HEADERS = ("content-type", "cache-control", "mcp-session-id", "mcp-protocol-version")


def target_url(url: str | None) -> str:
    """The URL to forward to, checked as llama-server checks it.

    Raises:
        ApiError(400): no URL, a scheme other than http / https, no host, or credentials in it.
    """
    if not url:
        raise ApiError(400, "url: the target URL is required (/cors-proxy?url=...)", param="url")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as error:
        raise ApiError(400, f"url: invalid target URL ({error})", param="url") from None
    if parts.scheme not in ("http", "https"):
        raise ApiError(400, f"url: unsupported URL scheme in target URL: {parts.scheme or '(none)'}", param="url")
    if not parts.hostname:
        raise ApiError(400, "url: invalid target URL: missing host", param="url")
    if parts.username is not None or parts.password is not None:
        raise ApiError(400, "url: authentication in target URL is not supported", param="url")
    return url


def forwarded_headers(request: Request) -> dict[str, str]:
    """The headers the client asked to send: ``x-llama-server-proxy-header-NAME`` -> ``NAME``."""
    headers = {}
    for name, value in request.headers.items():
        if name.lower().startswith(PROXY_HEADER_PREFIX) and len(name) > len(PROXY_HEADER_PREFIX):
            headers[name[len(PROXY_HEADER_PREFIX) :]] = value
    return headers


@router.api_route("/cors-proxy", methods=["GET", "POST"], responses=ERROR_RESPONSES, include_in_schema=False)
async def cors_proxy(request: Request) -> StreamingResponse:
    """The target's answer to this request (see the module docstring)."""
    if not gateway(request).settings.ui_mcp_proxy:
        raise ApiError(
            403, "this feature is disabled (start the server with --ui-mcp-proxy)", error_type="feature_disabled"
        )
    url = target_url(request.query_params.get("url"))
    body = await request.body() if request.method == "POST" else None
    client = httpx.AsyncClient(timeout=TIMEOUT_S, follow_redirects=False, trust_env=False)
    try:
        outgoing = client.build_request(request.method, url, headers=forwarded_headers(request), content=body)
        answer = await client.send(outgoing, stream=True)
    except httpx.HTTPError as error:
        await client.aclose()
        raise ApiError(
            502, f"the target URL could not be reached: {type(error).__name__}", code="bad_gateway"
        ) from None

    async def close() -> None:
        await answer.aclose()
        await client.aclose()

    headers = {name: answer.headers[name] for name in KEPT_RESPONSE_HEADERS if name in answer.headers}
    return StreamingResponse(
        answer.aiter_bytes(), status_code=answer.status_code, headers=headers, background=BackgroundTask(close)
    )
