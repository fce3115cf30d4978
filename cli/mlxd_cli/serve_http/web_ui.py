"""The web UI: ``GET /`` a chat page, ``GET /ui/ticks`` the scheduler live (``--webui``, the default).

Contract: the pages are static files shipped in this package (``webui/``: plain HTML, JavaScript and CSS,
no build step, nothing fetched from elsewhere), read once at import and served from memory under ``/``,
``/ui/ticks`` and ``/ui/assets/<name>``; any other asset name is a 404. The files hold nothing secret, so
they are served without the API key (``settings.web_ui_open_path``): with ``--api-key`` the page asks the
user for the key and sends it on every API request it makes (``api.js``). Every answer carries a
Content-Security-Policy that allows only this origin's scripts, styles and connections (no inline script),
so text a model writes cannot run as script even if the page's renderer had a hole. With ``--no-webui``
(also ``--no-ui``, llama-server's names) none of these paths is served (404).

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


def _file(name: str) -> Response:
    if name not in FILES:
        raise ApiError(404, "no such web UI file", code="not_found")
    content_type = CONTENT_TYPES[name[name.rindex(".") :]]
    return Response(FILES[name], media_type=content_type, headers=SECURITY_HEADERS)


@router.get("/", include_in_schema=False)
async def chat_page() -> Response:
    """The chat page."""
    return _file("index.html")


@router.get("/ui/ticks", include_in_schema=False)
async def ticks_page() -> Response:
    """The scheduler's ticks, live."""
    return _file("ticks.html")


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
