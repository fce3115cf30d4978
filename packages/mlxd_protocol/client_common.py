"""What the three clients share (``Client``, ``AsyncClient``, ``LocalClient``): their errors, request ids,
the Tokenize they send, the auth token and its Hello, the DEALER socket, and the unwrapping of a reply.

Contract: an ``Error`` reply becomes ``DaemonError(code, message)``; silence becomes ``DaemonTimeout``. The
blocking client re-exports these names (``from mlxd_protocol.client import DaemonError`` keeps working).
"""

import os
import socket
import uuid
from typing import TypeVar

import zmq

from .codec import ProtocolError, decode
from .endpoints import TRACE_USER, parse_endpoint
from .messages import AUTH_TOKEN_ENV, INTERNAL, MAX_FRAME_BYTES, TICK_TOPIC, Error, Hello, Message, Tick, Tokenize

ReplyT = TypeVar("ReplyT", bound=Message)  # the reply type a request calls for
SocketT = TypeVar("SocketT", bound=zmq.Socket)

# Frames queued at close (typically a Cancel) get this long to leave; the socket itself never
# lingers, so a dead daemon cannot make a client hang.
CLOSE_LINGER_MS = 100
# What the socket monitor reports: a connection made (again), a connection dropped.
CONNECTION_EVENTS = zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED


class DaemonError(Exception):
    """The daemon answered with an Error, or with a reply that breaks the protocol.

    Attributes:
        code: The Error's code (see ``messages``), e.g. "invalid_request".
        message: The daemon's explanation.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class DaemonTimeout(TimeoutError):
    """No reply in time: the daemon is down, stuck, or listening elsewhere."""


def new_request_id() -> str:
    """Make a request id.

    Returns:
        16 hex characters from a random UUID (64 random bits: collisions are not a concern).
    """
    return uuid.uuid4().hex[:16]


def tokenize_request(
    text: str | None = None,
    messages: list[dict] | None = None,
    add_special_tokens: bool = True,
    tools: list[dict] | None = None,
    *,
    add_generation_prompt: bool = True,
    chat_template_kwargs: dict | None = None,
    continue_final_message: bool = False,
    return_text: bool = False,
) -> Tokenize:
    """The Tokenize every client sends for its ``tokenize`` and ``render_chat`` (fields as ``Tokenize``'s)."""
    return Tokenize(
        text=text,
        messages=messages,
        add_special_tokens=add_special_tokens,
        tools=tools,
        add_generation_prompt=add_generation_prompt,
        chat_template_kwargs=chat_template_kwargs,
        continue_final_message=continue_final_message,
        return_text=return_text,
        id=new_request_id(),
    )


def resolve_auth_token(auth_token: str | None) -> str | None:
    """The token to authenticate with: ``auth_token``, else ``$MLXD_AUTH_TOKEN``, else None."""
    if auth_token is not None:
        return auth_token or None
    return os.environ.get(AUTH_TOKEN_ENV) or None


def needs_hello(client, message: Message) -> Hello | None:
    """The Hello carrying the client's token to send before ``message``, once per connection."""
    if client.auth_token is None or client._authenticated or isinstance(message, Hello):
        return None
    client._authenticated = True
    return Hello(client=type(client).__name__, id=new_request_id(), token=client.auth_token)


def connect_dealer(context: zmq.Context[SocketT], endpoint: str) -> SocketT:
    """Open a DEALER socket connected to ``endpoint`` (shared by the blocking and async clients).

    Args:
        context: A ``zmq.Context`` or ``zmq.asyncio.Context``.
        endpoint: The daemon's endpoint.

    Returns:
        The connected socket.

    Raises:
        ValueError: The endpoint is malformed.
    """
    parse_endpoint(endpoint)  # a clear ValueError instead of zmq's "Invalid argument"
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.IPV6, 1)  # so tcp://[::1]:port works; IPv4 still works
    socket.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
    socket.connect(endpoint)
    return socket


def something_listens(endpoint: str, timeout_s: float = 0.25) -> bool:
    """Whether anything accepts connections at ``endpoint``: False only where none can (an ipc socket file that
    does not exist or refuses, a tcp port that refuses), so a probe of a daemon that is not there answers at once
    instead of waiting out its timeout (each daemon start and each autostart probes first). True when unsure.

    Raises:
        ValueError: The endpoint is malformed.
    """
    parsed = parse_endpoint(endpoint)
    try:
        if parsed.scheme == "ipc":
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.settimeout(timeout_s)
                probe.connect(str(parsed.path))
        else:
            assert parsed.host is not None and parsed.port is not None
            host = parsed.host.removeprefix("[").removesuffix("]")
            socket.create_connection((host, parsed.port), timeout=timeout_s).close()
    except (FileNotFoundError, ConnectionRefusedError):
        return False
    except (OSError, UnicodeError):  # a timeout, an unresolved or unencodable name, a permission: let the ping find out
        return True
    return True


def unwrap_reply(reply: Message, expected: type[ReplyT]) -> ReplyT:
    """Return ``reply`` if it is the expected type; raise for an Error or anything else.

    Args:
        reply: A reply matched to our request.
        expected: The reply type the request calls for.

    Returns:
        ``reply``.

    Raises:
        DaemonError: ``reply`` is an Error (its code and message), or of an unexpected type.
    """
    if isinstance(reply, expected):
        return reply
    if isinstance(reply, Error):
        raise DaemonError(reply.code, reply.message)
    raise DaemonError(INTERNAL, f"expected a {expected.TYPE!r} reply, got {reply.TYPE!r}")


def connect_trace(context: zmq.Context[SocketT], endpoint: str, auth_token: str | None) -> SocketT:
    """A SUB socket subscribed to the ticks of the trace endpoint ``endpoint`` (blocking or asyncio, as
    ``context`` is); with ``auth_token`` it logs in with it (ZeroMQ PLAIN, user ``endpoints.TRACE_USER``)."""
    socket = context.socket(zmq.SUB)
    if auth_token:
        socket.plain_username = TRACE_USER.encode()
        socket.plain_password = auth_token.encode()
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.IPV6, 1)
    socket.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
    socket.setsockopt(zmq.SUBSCRIBE, TICK_TOPIC)
    socket.connect(endpoint)
    return socket


def read_tick(parts: list[bytes]) -> Tick | None:
    """The Tick a trace message carries (None for anything else on the socket).

    Raises:
        DaemonError: A trace frame the protocol refuses (e.g. a daemon speaking another version).
    """
    if len(parts) != 2 or parts[0] != TICK_TOPIC:
        return None
    try:
        message = decode(parts[1])
    except ProtocolError as error:
        raise DaemonError(error.code, f"unreadable tick from the daemon: {error.message}") from None
    return message if isinstance(message, Tick) else None
