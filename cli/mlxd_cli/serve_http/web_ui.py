"""The web UI: ``GET /`` a chat page, ``GET /ui/ticks`` the scheduler live (``--webui``, the default).

Contract: the pages are static files shipped in this package (``webui/``: plain HTML, JavaScript and CSS,
no build step, nothing fetched from elsewhere), read once at import and served from memory under ``/``,
``/ui/ticks`` and ``/ui/assets/<name>``; any other asset name is a 404. The files hold nothing secret, so
they are served without the API key (``settings.web_ui_open_path``). Each page says whether the API needs a
key, never which (``<meta name="mlxd-api-key" content="required">`` with ``--api-key``, ``"optional"``
without): ``api.js`` then asks the user for the key before the page's first request and sends it on every
request. Every answer carries a
Content-Security-Policy that allows only this origin's scripts, styles and connections (no inline script),
so text a model writes cannot run as script even if the page's renderer had a hole. With ``--no-webui``
(also ``--no-ui``, llama-server's names) none of these paths is served (404).

For a browser that used llama-server's web UI at this address: ``/manifest.webmanifest`` (this page as a web
app) and ``/_app/version.json`` (a version that UI's update check sees change) beside the pages, and
``/sw.js`` always (``worker_router``, with ``--no-webui`` too, as llama-server without its UI): a service
worker that unregisters itself and empties its caches, so the browser stops showing a cached llama-server UI.

``GET /ui/ticks/stream`` (SSE; the API key like every API path) feeds the live view: one event per
``tick_feed.FEED_INTERVAL_S`` holding a daemon's ticks of that interval and its status figures
(``tick_feed.feed_update``); ``?daemon=N`` picks the N-th ``--daemon`` (default the first). One trace
subscription per daemon serves every viewer; a daemon's ``tick_feed.MAX_VIEWERS`` + 1st viewer gets a 429.
"""

from __future__ import annotations

import json
from importlib import resources

from fastapi import APIRouter, Request
from fastapi.responses import Response

from .context import gateway
from .errors import ApiError
from .streaming import SSE_HEADERS, ClosingStreamingResponse, sse_event
from .tick_feed import MAX_VIEWERS, ViewersFull

router = APIRouter()
worker_router = APIRouter()  # /sw.js, with or without the pages

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",  # a new release's page is picked up at once (the files are small)
}


def _read_files() -> dict[str, bytes]:
    """Every file of ``webui/`` by name."""
    folder = resources.files(__package__).joinpath("webui")
    return {entry.name: entry.read_bytes() for entry in folder.iterdir() if entry.name.endswith(tuple(CONTENT_TYPES))}


FILES = _read_files()
# What a page says of the API key (never the key itself), as shipped and as served with --api-key
KEY_OPTIONAL = b'<meta name="mlxd-api-key" content="optional">'
KEY_REQUIRED = b'<meta name="mlxd-api-key" content="required">'
KEYED_PAGES = {name: FILES[name].replace(KEY_OPTIONAL, KEY_REQUIRED) for name in ("index.html", "ticks.html")}


def _file(name: str, content: bytes | None = None) -> Response:
    if name not in FILES:
        raise ApiError(404, "no such web UI file", code="not_found")
    content_type = CONTENT_TYPES[name[name.rindex(".") :]]
    return Response(FILES[name] if content is None else content, media_type=content_type, headers=SECURITY_HEADERS)


def _page(request: Request, name: str) -> Response:
    """A page, saying whether the API needs a key (so that it asks before its first request)."""
    return _file(name, KEYED_PAGES[name] if gateway(request).settings.api_keys else FILES[name])


@router.get("/", include_in_schema=False)
async def chat_page(request: Request) -> Response:
    """The chat page."""
    return _page(request, "index.html")


@router.get("/ui/ticks", include_in_schema=False)
async def ticks_page(request: Request) -> Response:
    """The scheduler's ticks, live."""
    return _page(request, "ticks.html")


@router.get("/ui/assets/{name}", include_in_schema=False)
async def asset(name: str) -> Response:
    """A script or style sheet of the pages (only the files shipped; no other path)."""
    if name.endswith(".html"):
        raise ApiError(404, "no such web UI file", code="not_found")
    return _file(name)


@router.get("/ui/ticks/stream", include_in_schema=False)
async def ticks_stream(request: Request, daemon: int = 0) -> Response:
    """The live view's feed: a daemon's ticks and status figures, as server-sent events."""
    context = gateway(request)
    handles = context.pool.handles
    if not 0 <= daemon < len(handles):
        raise ApiError(400, f"daemon must be a daemon's index, 0 to {len(handles) - 1}", param="daemon")
    feed = context.tick_feed(handles[daemon])
    try:
        viewer = feed.join()
    except ViewersFull:
        raise ApiError(
            429, f"the live view already has {MAX_VIEWERS} viewers of this daemon", code="too_many_requests"
        ) from None

    async def events():
        try:
            while True:
                yield sse_event(json.dumps(await viewer.get(), separators=(",", ":")))
        finally:
            await feed.leave(viewer)

    return ClosingStreamingResponse(events(), media_type="text/event-stream", headers=SSE_HEADERS)


APP_VERSION = "mlx-serve-http web UI"  # not a build of llama-server's UI, whose update check then sees a change
# llama-server's answer for a browser that kept its UI's service worker (server-http.cpp, without the UI)
SELF_REMOVING_WORKER = """
self.addEventListener('install', () => self.skipWaiting());
self.addEventListener('activate', (e) => e.waitUntil((async () => {
    await self.registration.unregister();
    for (const key of await caches.keys()) await caches.delete(key);
    for (const c of await self.clients.matchAll({ type: 'window' })) c.navigate(c.url);
})()));
"""


@router.get("/manifest.webmanifest", include_in_schema=False)
async def manifest() -> Response:
    """The chat page as a web app (what a browser that installed llama-server's UI here re-reads)."""
    body = {"name": "mlx-serve-http", "short_name": "mlx-serve-http", "start_url": "/", "display": "browser"}
    return Response(json.dumps(body), media_type="application/manifest+json", headers=SECURITY_HEADERS)


@router.get("/_app/version.json", include_in_schema=False)
async def app_version() -> Response:
    """The version llama-server's UI polls to learn that the page was replaced."""
    return Response(json.dumps({"version": APP_VERSION}), media_type="application/json", headers=SECURITY_HEADERS)


@worker_router.get("/sw.js", include_in_schema=False)
async def service_worker() -> Response:
    """A service worker that unregisters itself and empties its caches (see the module docstring)."""
    return Response(SELF_REMOVING_WORKER, media_type="text/javascript; charset=utf-8", headers=SECURITY_HEADERS)
