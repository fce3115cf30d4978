"""The mlx-serve-http application: ``create_app(settings)``.

Contract: ``create_app`` returns a FastAPI app serving the OpenAI routes (``openai_routes``) and the
llama-server routes (``llama_routes``) in front of a ``DaemonPool``, behind the ``GatewayMiddleware``
(``middleware``). The pool is started and stopped with the app (lifespan), so one process could host
several apps. Routes reach the gateway only through the ``GatewayContext`` stored on the app
(``context.gateway(request)``); they import the helpers they need (``streaming``, ``context``), never
this module.
"""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI

from . import llama_routes, openai_routes
from .context import GatewayContext, install_context
from .daemon_pool import DaemonPool
from .errors import install_error_handlers
from .metrics import GatewayMetrics
from .middleware import GatewayMiddleware
from .settings import DEFAULT_MAX_BODY_BYTES, Settings

__all__ = ["DEFAULT_MAX_BODY_BYTES", "Settings", "create_app"]


def create_app(settings: Settings) -> FastAPI:
    """Build the gateway application.

    Args:
        settings: Daemons, limits and the API key.

    Returns:
        The FastAPI app (serve it with uvicorn).
    """
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
    install_context(app, GatewayContext(settings=settings, pool=pool, metrics=metrics))
    install_error_handlers(app)
    app.include_router(openai_routes.router)
    app.include_router(llama_routes.router)
    app.add_middleware(GatewayMiddleware, settings=settings, metrics=metrics)
    return app
