"""Reading JSON from clients: one parse that refuses what no part of mlxd can carry.

Contract:
    * ``parse_json(data)`` returns the JSON value of ``data`` (bytes or text), or raises
      ``json.JSONDecodeError`` for text that is not JSON and ``UnsafeJson`` (a ``ValueError`` whose
      message is written for the client) for JSON that is valid but unusable: ``NaN`` / ``Infinity``
      (not JSON) or a number too large for a float, nesting deeper than ``MAX_JSON_DEPTH``, an integer
      outside the signed 64-bit range (what msgpack carries), a string or key holding a lone UTF-16
      surrogate (``"\\ud800"``: not Unicode, so it cannot be encoded), or bytes that are not UTF-8.
    * The checks cost little on ordinary bodies: each runs only when a scan of the raw bytes (C speed)
      finds what it looks for (many brackets, a long digit run, a surrogate escape).
    * ``JsonBodyRoute`` makes FastAPI read every route's body through ``parse_json``; an ``UnsafeJson`` is
      answered 400 ``invalid_json``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from itertools import accumulate
from typing import Any

from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request

# Far deeper than any chat message, tool schema or JSON schema a client sends; far below what the
# parser, pydantic and msgpack (512 levels) survive.
MAX_JSON_DEPTH = 128
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

_LONG_DIGITS = re.compile(rb"\d{19,}")  # every integer outside int64 has 19 digits or more
_BIG_EXPONENT = re.compile(rb"[eE][+-]?\d{3,}")
_SURROGATE = re.compile(rb"\\u[dD][89abcdefABCDEF]|\xed[\xa0-\xbf]")  # an escape, or CESU-8 bytes
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(byte for byte in range(256) if byte not in b"[]{}")
_DEPTH_STEP = tuple(1 if byte in b"[{" else -1 if byte in b"]}" else 0 for byte in range(256))


class UnsafeJson(ValueError):
    """Valid JSON that no part of mlxd can carry; the message says why, for the client."""


def _checked_int(text: str) -> int:
    digits = len(text) - text.startswith("-")
    value = int(text) if digits <= 20 else None  # never convert thousands of digits
    if value is None or not INT64_MIN <= value <= INT64_MAX:
        raise UnsafeJson(
            f"the integer {text[:24]}{'...' if len(text) > 24 else ''} is outside the signed 64-bit range [-2^63, 2^63)"
        )
    return value


def _checked_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise UnsafeJson(f"the number {text[:24]}{'...' if len(text) > 24 else ''} is too large")
    return value


def _refuse_constant(name: str) -> Any:
    raise UnsafeJson(f"{name} is not a JSON value (JSON has no NaN or Infinity)")


def nesting_depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in JSON text (strings skipped), at C speed."""
    skeleton = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_DEPTH_STEP.__getitem__, skeleton)), default=0)


def _lone_surrogate_at(value: Any, where: str) -> str | None:
    """The dotted path of the first string (or key) holding a lone surrogate, or None."""
    if isinstance(value, str):
        return where if any(0xD800 <= ord(char) <= 0xDFFF for char in value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{where}.{key}" if where else str(key)
            found = _lone_surrogate_at(key, f"{where or 'the body'}: a key") or _lone_surrogate_at(item, path)
            if found:
                return found
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = _lone_surrogate_at(item, f"{where}[{index}]")
            if found:
                return found
    return None


def parse_json(data: bytes | str) -> Any:
    """Parse JSON from a client, refusing what mlxd cannot carry (see the module docstring).

    Args:
        data: The JSON text, as bytes (a request body) or str (a field holding JSON text).

    Returns:
        The parsed value.

    Raises:
        json.JSONDecodeError: ``data`` is not JSON.
        UnsafeJson: It is JSON that mlxd refuses; the message says why.
    """
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    hooks: dict[str, Any] = {"parse_constant": _refuse_constant}  # json.loads's parse_* hooks
    if _LONG_DIGITS.search(raw) or _BIG_EXPONENT.search(raw):
        hooks.update(parse_int=_checked_int, parse_float=_checked_float)
    try:
        value = json.loads(raw, **hooks)
    except RecursionError:
        raise UnsafeJson(f"the JSON is nested deeper than {MAX_JSON_DEPTH} levels") from None
    except UnicodeDecodeError:
        raise UnsafeJson("the JSON is not valid UTF-8 text") from None
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and nesting_depth(raw) > MAX_JSON_DEPTH:
        raise UnsafeJson(f"the JSON is nested deeper than {MAX_JSON_DEPTH} levels")
    if _SURROGATE.search(raw):
        where = _lone_surrogate_at(value, "")
        if where is not None:
            raise UnsafeJson(
                f"{where or 'the value'}: holds a lone UTF-16 surrogate (\\ud800-\\udfff), which is not Unicode text"
            )
    return value


class UnsafeJsonBody(StarletteHTTPException):
    """An ``UnsafeJson`` request body, answered 400 by the gateway's error handler."""

    code = "invalid_json"

    def __init__(self, message: str) -> None:
        super().__init__(400, f"the request body: {message}")


class JsonBodyRequest(Request):
    """A Request whose ``json()`` is ``parse_json``."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            try:
                self._json = parse_json(await self.body())
            except UnsafeJson as error:
                raise UnsafeJsonBody(str(error)) from None
        return self._json


class JsonBodyRoute(APIRoute):
    """A FastAPI route that reads its JSON body with ``parse_json`` (``APIRouter(route_class=...)``)."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def handle(request: Request):
            return await handler(JsonBodyRequest(request.scope, request.receive))

        return handle
