"""What the gateway checks about who is asking before it reads a body: Host, Origin, Content-Type.

Contract (pure functions; ``middleware`` applies them, in this order):
    * ``host_problem``: the ``Host`` header must name one of ``Settings.allowed_hosts`` (the port is not
      compared): by default the loopback names plus the address the gateway listens on, so a web page
      that rebinds its own DNS name to 127.0.0.1 (DNS rebinding) is refused and cannot read replies.
      ``allowed_hosts`` None turns the check off (``--allowed-hosts '*'``, and the default when listening
      on a wildcard address such as 0.0.0.0, which clients reach by names the gateway cannot know).
      A request without a Host header (HTTP/1.0, not a browser) passes.
    * ``origin_problem``: a request carrying ``Origin`` (only browsers send it) must come from an origin
      in ``--cors-origins`` or from the gateway's own origin (its /docs page); any other web page is
      refused, even for requests a browser sends without a CORS preflight (simple POSTs).
    * ``content_type_problem``: a body is JSON: ``application/json`` and ``application/*+json`` are
      read as JSON, and so are a body without a Content-Type (as FastAPI and vLLM do) and
      ``application/x-www-form-urlencoded`` (what ``curl -d`` sends; llama-server reads it as JSON).
      Anything else (``text/plain``, ``multipart/form-data``, ...) is refused with 415.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from .errors import ApiError
from .settings import LOOPBACK_HOSTS

WILDCARD_ADDRESSES = frozenset({"", "0.0.0.0", "::", "[::]", "*"})
# Read as JSON besides application/json and application/*+json.
JSON_READ_ANYWAY = frozenset({"", "application/x-www-form-urlencoded"})


def host_name(host: str) -> str:
    """A Host header (or an address) reduced to what is compared: lower case, no port, no brackets.

    Args:
        host: ``name``, ``name:port``, ``[v6]`` or ``[v6]:port`` (a bare IPv6 address is kept whole).

    Returns:
        The name, e.g. ``"localhost"``, ``"127.0.0.1"``, ``"::1"``.
    """
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".")


def default_allowed_hosts(bind_host: str, given: list[str] | None) -> frozenset[str] | None:
    """The host names a gateway listening on ``bind_host`` answers to.

    Args:
        bind_host: The ``--host`` address.
        given: The ``--allowed-hosts`` names, or None when the option was not given.

    Returns:
        The names to accept (the loopback names and ``bind_host`` always among them), or None for no
        check ("*" given, or a wildcard address and nothing given).
    """
    wildcard = bind_host.strip() in WILDCARD_ADDRESSES
    own = set(LOOPBACK_HOSTS) | (set() if wildcard else {host_name(bind_host)})
    if given is not None:
        names = {host_name(name) for name in given if name.strip()}
        return None if "*" in names else frozenset(names | own)
    return None if wildcard else frozenset(own)


def host_problem(host: str | None, allowed: frozenset[str] | None) -> ApiError | None:
    """The error to answer for a Host header outside ``allowed``, else None."""
    if host is None or allowed is None or host_name(host) in allowed:
        return None
    return ApiError(
        400, "the Host header names a host this server does not answer to (see --allowed-hosts)", code="invalid_host"
    )


def origin_problem(origin: str | None, host: str | None, cors_origins: tuple[str, ...]) -> ApiError | None:
    """The error to answer for a browser request from a foreign origin, else None.

    Args:
        origin: The Origin header (None when absent: not a browser, or a same-origin GET).
        host: The Host header.
        cors_origins: The origins ``--cors-origins`` allows ("*": any).
    """
    if origin is None or "*" in cors_origins or origin.rstrip("/") in cors_origins:
        return None
    if host is not None and origin != "null" and urlsplit(origin).netloc.lower() == host.strip().lower():
        return None  # the gateway's own pages (/docs)
    return ApiError(
        403,
        "requests from this web origin are refused; start the server with --cors-origins to allow it",
        code="origin_not_allowed",
    )


def content_type_problem(content_type: str | None) -> ApiError | None:
    """The error to answer for a body that is not declared as JSON, else None."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media == "application/json" or media in JSON_READ_ANYWAY:
        return None
    if media.startswith("application/") and media.endswith("+json"):
        return None
    return ApiError(
        415, "the request body must be JSON: send Content-Type: application/json", code="unsupported_media_type"
    )
