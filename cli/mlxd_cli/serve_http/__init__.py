"""``mlx-serve-http``: an OpenAI- and llama-server-compatible HTTP gateway in front of mlxd.

A thin asynchronous gateway (FastAPI + uvicorn): it validates requests, forwards them to one or more
mlxd daemons over the protocol's ``AsyncClient`` and streams the answers back. It tokenizes nothing
itself and never imports mlx. ``app.create_app(Settings)`` builds the application; ``main.main`` is
the command line.

Modules, each importing only those before it: ``settings`` (plain data), ``errors``, ``metrics``,
``daemon_pool`` (the daemons: health, choice, fail-over), ``context`` (what a route may use),
``streaming`` (SSE and collecting answers), ``middleware``, the routes (``openai_routes``,
``llama_routes``: they import ``context`` and ``streaming``, never ``app``), then ``app`` and ``main``.
"""

from .app import Settings, create_app

__all__ = ["Settings", "create_app"]
