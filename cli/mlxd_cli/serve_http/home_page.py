"""The home page: ``GET /`` answers a small HTML page about this server (``--ui``, the default).

Contract: the page names the model(s) the daemons that answer serve and links the API's docs
(``/docs``), ``/v1/models`` and ``/health`` (and ``/metrics`` when it is served). It is no chat UI:
llama-server serves its web UI at ``/``, and a browser pointed there gets this page instead of a 404.
With ``--no-ui`` (llama-server's name) nothing is served at ``/`` (404). Like every path but /health it
needs the API key when one is set.
"""

from __future__ import annotations

import html

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from .context import gateway

router = APIRouter()

PAGE = """<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>mlx-serve-http</title></head>
<body>
<h1>mlx-serve-http</h1>
<p>An OpenAI- and llama-server-compatible API in front of mlxd, serving: {models}.</p>
<p>There is no chat UI here. The API: <a href="/docs">/docs</a> (every route),
<a href="/v1/models">/v1/models</a>, <a href="/health">/health</a>{metrics}.</p>
</body>
</html>
"""


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
async def home(request: Request) -> HTMLResponse:
    """This server in a few lines, for a browser pointed at it."""
    context = gateway(request)
    names = [context.model_name(handle) for handle in context.pool.up_handles() if handle.status is not None]
    models = ", ".join(html.escape(name) for name in dict.fromkeys(names)) or "no model yet (loading)"
    metrics = ', <a href="/metrics">/metrics</a>' if context.settings.metrics_enabled else ""
    return HTMLResponse(PAGE.format(models=models, metrics=metrics))
