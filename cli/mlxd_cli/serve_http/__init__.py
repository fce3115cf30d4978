"""``mlx-serve-http``: an OpenAI- and llama-server-compatible HTTP gateway in front of mlxd.

A thin asynchronous gateway (FastAPI + uvicorn): it validates requests, forwards them to one or more
mlxd daemons over the protocol's ``AsyncClient`` and streams the answers back. It tokenizes nothing
itself and never imports mlx. ``app.create_app(Settings)`` builds the application; ``main.main`` is
the command line.

Modules, each importing only those before it: ``settings`` (plain data), ``json_body`` (reading JSON
from clients), ``errors``, ``metrics``, ``daemon_pool`` (the daemons: health, choice, fail-over),
``supervisor`` (restarting a daemon the gateway started), ``context`` (what a route may use),
``streaming`` (SSE and collecting answers), ``request_guard`` (Host, Origin, Content-Type),
``middleware``, ``http_timeouts`` (the header read timeout, in the server layer), the pieces of an answer
the routes share (``openai_replies``, ``llama_answer``), the routes (``openai_routes``, ``llama_routes``,
``web_ui``: the web page and its live view's feed from ``tick_feed``;
they import ``context`` and ``streaming``, never ``app``), then ``app`` and ``main``.
"""

from .app import Settings, create_app

__all__ = ["Settings", "create_app"]
