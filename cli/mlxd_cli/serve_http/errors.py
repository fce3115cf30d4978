"""Errors of mlx-serve-http: OpenAI's error body, the HTTP status of every failure, the handlers.

Contract:
    * Every error response, whatever raised it (a route, FastAPI's validation, Starlette's 404 / 405,
      the gateway middleware, a bug), has OpenAI's body
      ``{"error": {"message": str, "type": str, "param": str | null, "code": str | null}}``.
    * ``ApiError`` is the one exception routes raise; ``from_daemon_failure`` turns what the protocol
      client raises into one: ``invalid_request`` and a daemon's host-work limit -> 400, ``not_found`` ->
      404, a reply too large to send -> 413, ``overloaded`` -> 429, daemon down / timeout / shutting down
      -> 503, anything else -> 500. 429 and 503 carry ``Retry-After``. A prompt longer than the daemon's
      context is llama-server's 400 ``exceed_context_size_error`` with ``n_prompt_tokens`` and ``n_ctx``.
    * No body names a Python exception, a file path or a socket path: a 500 says only that something
      failed (the log has the details), a 503 why no daemon serves without naming its endpoint, and a
      daemon's own message has any path in it replaced by ``<path>`` (``public_text``).
    * Validation errors answer 400 (not FastAPI's 422) with the first problem named field by field.
    * On Anthropic's paths (``/v1/messages`` and below) the same errors have Anthropic's body instead,
      ``{"type": "error", "error": {"type": str, "message": str}}`` (``anthropic_error_body``), whoever
      answers them (a route, a handler here, the middleware).
"""

from __future__ import annotations

import json
import logging
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from mlxd_protocol import (
    BAD_FRAME,
    CANCELLED,
    CLIENT_CLOSED,
    DISCONNECTED,
    INVALID,
    NOT_FOUND,
    OVERLOADED,
    DaemonError,
    DaemonTimeout,
    ProtocolError,
)

from .schemas import ErrorResponse

log = logging.getLogger("mlx-serve-http")

RETRY_AFTER_S = 1  # what 429 / 503 tell clients to wait: daemons free up (or come back) quickly

# OpenAI's error "type" for each status we send.
_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
}
# Daemon codes that mean "this daemon cannot serve now", not "the request is bad".
UNAVAILABLE_CODES = frozenset({CLIENT_CLOSED, CANCELLED, DISCONNECTED})
# What a 500 says: the details (an exception, a library's state) are in the log, never in the body.
INTERNAL_MESSAGE = "internal error while answering this request (the server's log has the details)"
# A socket endpoint, or an absolute path of two or more parts (not a JSON pointer "#/a/b", not "a/b").
_PATH = re.compile(r"(?:ipc|tcp|inproc)://\S+|(?<![\w.#~/-])(?:~|[A-Za-z]:)?(?:/[\w.@+-]+){2,}/?")


def public_text(text: str) -> str:
    """``text`` with every socket endpoint and absolute file path replaced by ``<path>``."""
    return _PATH.sub("<path>", text)


# How mlxd words an invalid_request whose reply could not be sent: past the protocol's frame limit.
REPLY_TOO_LARGE_PREFIX = "the reply is larger than"
# How mlxd words a prompt longer than its context bound (docs/protocol.md): llama-server's
# exceed_context_size_error, with the two numbers as members of the error.
_CONTEXT_EXCEEDED = re.compile(r"prompt of (?P<prompt>\d+) tokens does not fit the context bound of (?P<ctx>\d+)")


def _status_of_daemon_code(code: str) -> int:
    """The HTTP status of a daemon error code.

    The codes a daemon may add within a protocol version are read by name: one saying a reply (or a
    frame) was too large is 413; one saying the request went over a limit of the daemon's host work
    (tokenizing, templating, compiling a grammar) is 400; any other unknown code is 500.
    """
    known = {INVALID: 400, NOT_FOUND: 404, OVERLOADED: 429, BAD_FRAME: 413}
    if code in known:
        return known[code]
    if code in UNAVAILABLE_CODES:
        return 503
    if "too_large" in code or "too_big" in code:
        return 413
    if "limit" in code:
        return 400
    return 500


# For /openapi.json: every route may answer these, all with the OpenAI error body.
ERROR_RESPONSES: dict[int | str, dict] = {
    status: {"model": ErrorResponse, "description": description}
    for status, description in (
        (400, "invalid request (or a Host header this server does not answer to)"),
        (401, "missing or wrong API key"),
        (403, "a browser request from an origin not in --cors-origins"),
        (408, "the request body did not arrive in time"),
        (413, "request body too large"),
        (415, "the request body is not declared as JSON"),
        (429, "too many requests in flight, or the daemon is overloaded (see Retry-After)"),
        (500, "internal error"),
        (503, "no daemon available (see Retry-After)"),
    )
}


class ApiError(Exception):
    """An error answered to the HTTP client in OpenAI's shape.

    Args:
        status: The HTTP status code.
        message: What went wrong, for a human.
        param: The request field at fault, if any.
        code: A short machine-readable code (e.g. "overloaded").
        error_type: OpenAI's error type; derived from ``status`` when None.
        extra: Further members of the error object.
    """

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        error_type: str | None = None,
        extra: dict | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.extra = extra or {}  # more members of the error object (llama-server's n_prompt_tokens, n_ctx)
        self.error_type = error_type or _TYPE_BY_STATUS.get(
            status, "server_error" if status >= 500 else "invalid_request_error"
        )

    def body(self) -> dict:
        """The JSON body: ``{"error": {...}}``."""
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
                **self.extra,
            }
        }

    def headers(self) -> dict[str, str]:
        """Extra response headers: Retry-After for the statuses a client should retry."""
        return {"Retry-After": str(RETRY_AFTER_S)} if self.status in (429, 503) else {}

    def body_for(self, path: str) -> dict:
        """The JSON body for a request to ``path``: Anthropic's shape on its paths, else OpenAI's."""
        return anthropic_error_body(self) if uses_anthropic_shape(path) else self.body()

    def response(self, path: str = "") -> JSONResponse:
        """The error as a response (to a request for ``path``)."""
        return JSONResponse(self.body_for(path), status_code=self.status, headers=self.headers())

    def encoded(self, path: str = "") -> bytes:
        """The body as bytes, for raw ASGI middleware and SSE error events."""
        return json.dumps(self.body_for(path)).encode()


# ---- Anthropic's Messages API: its error body on its paths -----------------------------------

ANTHROPIC_PATH = "/v1/messages"
# Anthropic's error "type" for each status we send (429 from an overloaded daemon: "overloaded_error").
_ANTHROPIC_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}


def uses_anthropic_shape(path: str) -> bool:
    """Whether errors of a request for ``path`` take Anthropic's body (``/v1/messages`` and below)."""
    return path == ANTHROPIC_PATH or path.startswith(ANTHROPIC_PATH + "/")


def anthropic_error_body(error: ApiError) -> dict:
    """Anthropic's error body: ``{"type": "error", "error": {"type": ..., "message": ...}}``."""
    kind = _ANTHROPIC_TYPE_BY_STATUS.get(error.status, "api_error" if error.status >= 500 else "invalid_request_error")
    if error.code == OVERLOADED:
        kind = "overloaded_error"
    return {"type": "error", "error": {"type": kind, "message": error.message}}


class NoDaemonAvailable(Exception):
    """No daemon of the pool is up (or every one was tried for this request)."""


def from_daemon_failure(error: BaseException) -> ApiError:
    """Map what talking to a daemon raised to the HTTP error to answer.

    Args:
        error: A ``DaemonError``, ``DaemonTimeout``, ``ProtocolError`` or ``NoDaemonAvailable``.

    Returns:
        The ApiError (400 / 404 / 429 / 503 / 500) carrying the daemon's message.
    """
    if isinstance(error, NoDaemonAvailable):
        return ApiError(503, f"no mlxd daemon is available: {error}", code="daemon_unavailable")
    if isinstance(error, DaemonTimeout):
        return ApiError(503, "the daemon did not answer in time; retry shortly", code="daemon_timeout")
    if isinstance(error, ProtocolError):
        # Raised before sending: the request broke a protocol rule the HTTP schema did not catch.
        status = 413 if error.code == BAD_FRAME else 400
        return ApiError(status, public_text(error.message), code=INVALID if status == 400 else "request_too_large")
    if isinstance(error, DaemonError):
        status = _status_of_daemon_code(error.code)
        if status == 400 and error.message.startswith(REPLY_TOO_LARGE_PREFIX):
            return ApiError(413, public_text(error.message), code="reply_too_large")
        if status == 503:
            return ApiError(
                503,
                "the daemon stopped while answering this request (it exited, was restarted or stalled); retry shortly",
                code="daemon_unavailable",
            )
        if status == 500:
            log.error("daemon error %s: %s", error.code, error.message)
            return ApiError(500, INTERNAL_MESSAGE, code=error.code)
        if status == 429:
            return ApiError(429, f"the daemon is overloaded: {public_text(error.message)}", code=OVERLOADED)
        exceeded = _CONTEXT_EXCEEDED.search(error.message) if status == 400 else None
        if exceeded:
            n_prompt, n_ctx = int(exceeded["prompt"]), int(exceeded["ctx"])
            return ApiError(
                400,
                f"the request ({n_prompt} tokens) exceeds the available context size ({n_ctx} "
                "tokens), try increasing it",
                code="exceed_context_size",
                error_type="exceed_context_size_error",
                extra={"n_prompt_tokens": n_prompt, "n_ctx": n_ctx},
            )
        return ApiError(status, public_text(error.message), code=error.code)
    log.error("unexpected failure talking to a daemon: %r", error)
    return ApiError(500, INTERNAL_MESSAGE, code="internal")


def describe_validation_error(errors: list[dict]) -> tuple[str, str | None]:
    """Turn pydantic's error list into one message naming the field, and the field's dotted path.

    Args:
        errors: ``RequestValidationError.errors()``.

    Returns:
        (message, param): the first error explained, and its location (None for the whole body).
    """
    if not errors:
        return "the request is invalid", None
    first = errors[0]
    # Locations start with "body"; union members add their type name ("prompt", "str"): drop both.
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    kind = first.get("type", "")
    if kind == "json_invalid":
        detail = first.get("ctx", {}).get("error", first.get("msg", ""))
        return f"the request body is not valid JSON: {detail}", None
    if not location and kind == "missing":
        return "the request body is missing: send a JSON object (Content-Type: application/json)", None
    if not location and kind in ("model_attributes_type", "dict_type", "model_type"):
        return "the request body must be a JSON object (Content-Type: application/json)", None
    field_path = _field_path(first)
    # A value of the wrong type for a union field fails once per member: say what each wanted.
    same_field = [error for error in errors if _field_path(error) == field_path]
    message = " | ".join(
        dict.fromkeys(error.get("msg", "invalid value").removeprefix("Value error, ") for error in same_field)
    )
    others = len(errors) - len(same_field)
    more = f" (and {others} more problem{'s' if others > 1 else ''})" if others else ""
    return f"{field_path or 'body'}: {message}{more}", field_path or None


def _field_path(error: dict) -> str:
    return ".".join(str(part) for part in error.get("loc", ()) if part != "body" and _is_request_field(str(part)))


# pydantic appends the tried union member ("str", "list[int]", "TextContentPart", ...) to locations.
_TYPE_NAMES = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def _is_request_field(part: str) -> bool:
    """True for a location part that is a field name or list index, not a union member's type."""
    if part.isdigit():
        return True
    return part.isidentifier() and part[0].islower() and part not in _TYPE_NAMES


def install_error_handlers(app: FastAPI) -> None:
    """Make every error FastAPI or Starlette answers use OpenAI's body.

    Args:
        app: The application.
    """

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        return error.response(request.url.path)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
        message, param = describe_validation_error(list(error.errors()))
        return ApiError(400, message, param=param, code="invalid_value").response(request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        if error.status_code == 404:
            message = f"unknown endpoint {request.method} {request.url.path}"
        elif error.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
        else:
            message = str(error.detail)
        api_error = ApiError(
            error.status_code, message, code=getattr(error, "code", None) or _code_for(error.status_code)
        )
        response = api_error.response(request.url.path)
        for name, value in (error.headers or {}).items():
            response.headers[name] = value  # e.g. Allow on 405
        return response

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, error: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return ApiError(500, INTERNAL_MESSAGE, code="internal").response(request.url.path)


def _code_for(status: int) -> str:
    return {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(status, f"http_{status}")
