"""The mlx-serve-http application: ``create_app(settings)``.

Contract: ``create_app`` returns a FastAPI app serving the OpenAI routes (``openai_routes``), the
llama-server routes (``llama_routes``, ``cors_proxy``) and, unless ``--no-webui``, the web UI (``web_ui``:
the chat page at /), in front of a ``DaemonPool``, behind the ``GatewayMiddleware`` (``middleware``) and, only when
``Settings.cors_origins`` names origins, the CORS middleware (``cors``; outermost, so it answers
preflights). The pool, and the ``DaemonSupervisor`` of a daemon the gateway
started, run with the app (lifespan), so one process could host several apps. Routes reach the gateway only
through the ``GatewayContext`` stored on the app (``context.gateway(request)``); they import the helpers they
need (``streaming``, ``context``), never this module.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

from fastapi import FastAPI

from . import (
    anthropic_routes,
    cors_proxy,
    embeddings_routes,
    llama_routes,
    openai_routes,
    responses_routes,
    web_ui,
)
from .context import GatewayContext, install_context
from .cors import CorsMiddleware
from .daemon_pool import DaemonPool
from .errors import install_error_handlers
from .metrics import GatewayMetrics
from .middleware import GatewayMiddleware
from .settings import DEFAULT_MAX_BODY_BYTES, Settings
from .supervisor import DaemonSupervisor

__all__ = ["DEFAULT_MAX_BODY_BYTES", "Settings", "create_app"]


def create_app(settings: Settings, supervisor: DaemonSupervisor | None = None) -> FastAPI:
    """Build the gateway application.

    Args:
        settings: Daemons, limits and the API key.
        supervisor: Restarts the daemon this gateway started (None: it started none).

    Returns:
        The FastAPI app (serve it with uvicorn).
    """
    pool = DaemonPool(settings.daemons, health_interval_s=settings.health_interval_s)
    metrics = GatewayMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await pool.start()
        supervising = None
        if supervisor is not None:

            def answers() -> bool:
                return any(handle.up for handle in pool.handles if handle.endpoint == supervisor.endpoint)

            supervising = asyncio.get_running_loop().create_task(supervisor.run(answers), name="mlxd-supervisor")
        try:
            yield
        finally:
            if supervising is not None:
                supervising.cancel()
                await asyncio.gather(supervising, return_exceptions=True)
            await pool.stop()

    app = FastAPI(
        title="mlx-serve-http",
        version="0.1.0",
        lifespan=lifespan,
        description="OpenAI- and llama-server-compatible HTTP front for the mlxd daemon.",
    )
    install_context(app, GatewayContext(settings=settings, pool=pool, metrics=metrics))
    install_error_handlers(app)
    app.include_router(openai_routes.router)
    app.include_router(llama_routes.router)
    app.include_router(embeddings_routes.router)
    app.include_router(anthropic_routes.router)
    app.include_router(responses_routes.responses_router())  # with its own store of responses
    if settings.ui_enabled:
        app.include_router(web_ui.router)
    app.include_router(web_ui.worker_router)  # with or without the pages, as llama-server
    app.include_router(cors_proxy.router)  # 403 unless --ui-mcp-proxy
    app.add_middleware(GatewayMiddleware, settings=settings, metrics=metrics)
    if settings.cors_origins:
        app.add_middleware(CorsMiddleware, settings=settings)
    return app
