"""How one mlx-serve-http gateway runs: ``Settings`` and its defaults (plain data, imported by every part)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_REQUESTS_PER_CLIENT = 32  # one client cannot hold every row of every daemon
# A client must send a request's headers within this many seconds of connecting (or of the previous
# response on a kept-alive connection), and its body within BODY_TIMEOUT_S of the headers: a client
# trickling bytes (slowloris) cannot hold a connection. Generous for any real client on any link.
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 60.0
# Host names every gateway answers to: the loopback names (DNS rebinding needs some other name).
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
# What a CORS preflight allows unless --cors-methods / --cors-headers say otherwise.
DEFAULT_CORS_METHODS = "GET, POST, DELETE"
DEFAULT_CORS_HEADERS = "Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta"
# The web UI's static files (web_ui.py): they hold nothing secret and a browser cannot send a key when it
# opens a page, so they are served without the API key; what the pages then ask of the API carries it.
# Beside them, the files a browser that used llama-server's web UI at this address asks for (web_ui.py).
WEB_UI_PAGES = frozenset({"/", "/ui/ticks", "/manifest.webmanifest", "/_app/version.json"})
# llama-server's self-removing service worker: served with the UI off too, and never behind the key.
SERVICE_WORKER_PATH = "/sw.js"
WEB_UI_ASSETS = "/ui/assets/"


def web_ui_open_path(path: str) -> bool:
    """Whether ``path`` is one of the web UI's static files (a page or an asset), served without the key."""
    return path in WEB_UI_PAGES or (path.startswith(WEB_UI_ASSETS) and "/" not in path[len(WEB_UI_ASSETS) :])


@dataclass
class Settings:
    """How one gateway runs.

    Attributes:
        daemons: Daemon endpoints to spread requests over (at least one).
        api_key: When set, every endpoint but /health (and /v1/health, the home page's files) demands
            ``Authorization: Bearer KEY`` for one of its keys: one key, or several separated by commas
            (llama-server's ``--api-key``); each key's requests draft from a shared store of their own.
        max_concurrency: Most requests in flight at once (None: no limit).
        max_body_bytes: Largest request body accepted.
        max_requests_per_client: Most requests in flight from one client address (None: no limit).
        health_interval_s: Seconds between health probes of each daemon.
        model_alias: The ``model`` every reply names (None: the checkpoint's name).
        model_aliases: Every name of the model (``--alias a,b``: the first is ``model_alias``), listed
            by /v1/models as ``aliases``.
        model_tags: Informational tags /v1/models lists (llama-server's ``--tags``).
        allowed_hosts: Host header names answered (lower case, no port; IPv6 without brackets); None:
            any (the check is off).
        cors_origins: Browser origins allowed to call the API (CORS); empty: none, "*" in it: any.
        cors_methods: ``Access-Control-Allow-Methods`` of a preflight (comma-separated; "*": any).
        cors_headers: ``Access-Control-Allow-Headers`` of a preflight (comma-separated; "*": any).
        cors_credentials: Allow credentialed requests (``Access-Control-Allow-Credentials: true``; with
            "*" origins the request's origin is echoed, as llama-server does).
        header_timeout_s: Longest wait for a request's headers.
        body_timeout_s: Longest wait for a request's whole body, once its headers came.
        default_n_predict: llama-server's ``--n-predict``: the token limit of a /completion, chat or
            completions request that sends none (None: until end of sequence, bounded by the context);
            not a cap.
        metrics_enabled: Serve ``/metrics`` (False: 501, as llama-server without ``--metrics``).
        slots_enabled: Serve ``/slots`` (False: 501, as llama-server with ``--no-slots``).
        ui_enabled: Serve the web UI: the chat page at ``/``, the scheduler live at ``/ui/ticks`` (False: 404,
            as llama-server with ``--no-webui``).
        ui_mcp_proxy: Serve llama-server's ``/cors-proxy`` (``cors_proxy``; False: 403, as llama-server
            without ``--ui-mcp-proxy``).
        verbose_replies: OpenAI-style replies carry llama-server's ``__verbose`` debug object unless the
            request sends ``verbose: false`` (llama-server with ``--verbose``).
    """

    daemons: list[str]
    api_key: str | None = None
    max_concurrency: int | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_requests_per_client: int | None = DEFAULT_MAX_REQUESTS_PER_CLIENT
    health_interval_s: float = 1.0
    model_alias: str | None = None
    model_aliases: tuple[str, ...] = ()
    model_tags: tuple[str, ...] = ()
    allowed_hosts: frozenset[str] | None = frozenset(LOOPBACK_HOSTS)
    cors_origins: tuple[str, ...] = ()
    cors_methods: str = DEFAULT_CORS_METHODS
    cors_headers: str = DEFAULT_CORS_HEADERS
    cors_credentials: bool = False
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    default_n_predict: int | None = None
    metrics_enabled: bool = True
    slots_enabled: bool = True
    ui_enabled: bool = True
    ui_mcp_proxy: bool = False
    verbose_replies: bool = False

    @property
    def api_keys(self) -> tuple[str, ...]:
        """The accepted API keys: ``api_key`` split at commas, blanks dropped (none: no key is asked for)."""
        if not self.api_key:
            return ()
        return tuple(dict.fromkeys(key.strip() for key in self.api_key.split(",") if key.strip()))
