"""The header read timeout of mlx-serve-http, in the HTTP server layer (uvicorn).

Contract: ``header_timeout_protocol(seconds)`` returns uvicorn's HTTP/1.1 protocol class (httptools when
installed, else h11: uvicorn's own choice) with one rule added: a connection must deliver a request's
headers within ``seconds`` of being opened, or of the previous response on a kept-alive connection,
else it is closed. uvicorn has no such timeout (its keep-alive timer stops at the first byte), so a
client sending headers at one byte a second would hold its connection forever. The body's timeout is
the gateway middleware's (the app only sees a request once its headers are complete).
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.auto import AutoHTTPProtocol


def header_timeout_protocol(seconds: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class closing connections whose headers take over ``seconds``.

    Args:
        seconds: Longest wait for a request's headers.

    Returns:
        A protocol class to pass as ``uvicorn.run(..., http=...)``.
    """

    class HeaderTimeoutProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm_header_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_header_timer()  # the next request's headers get the same time

        def connection_lost(self, exc: Exception | None) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None
            super().connection_lost(exc)

        def _arm_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
            self._header_timer = self.loop.call_later(seconds, self._header_deadline)

        def _header_deadline(self) -> None:
            self._header_timer = None
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete:
                return  # the headers came: a request is being answered
            if not self.transport.is_closing():
                self.transport.close()

    return HeaderTimeoutProtocol
