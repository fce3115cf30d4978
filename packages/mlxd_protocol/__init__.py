"""mlxd protocol: the wire types, the msgpack codec, endpoint resolution and the clients.

A leaf package: it imports only the standard library, msgpack and pyzmq (never mlx), so the thin
CLI tools can talk to the daemon without loading a model runtime. The wire format is described in
``docs/protocol.md``. ``messages`` is the vocabulary as plain data (the version, every code, every
message type); ``codec`` frames it and imports it, never the other way round. ``Client`` (a socket),
``AsyncClient`` (a socket, many requests in flight) and ``LocalClient`` (the daemon's core in this
process) speak the same messages.
"""

from .messages import (
    AUTH_TOKEN_ENV, BAD_FRAME, BAD_VERSION, CANCELLED, CLIENT_CLOSED, CLIENT_CODES, CONSTRAINT_KINDS, DISCONNECTED, ERROR_CODES,
    FINISH_CANCELLED, FINISH_LENGTH, FINISH_REASONS, FINISH_STOP, INTERNAL, INVALID, MAX_FRAME_BYTES, MESSAGE_TYPES,
    MAX_EMBED_INPUTS, NOT_FOUND, OVERLOADED, POOLING_KINDS, PROTOCOL_VERSION, REPLY_TYPES, REQUEST_TYPES,
    SPECULATIVE_KINDS, SUPPORTED_VERSIONS, TICK_TOPIC, TRACE_TYPES, UNAUTHORIZED, UNKNOWN_TYPE,
    Cancel, Chunk, Constraint, Detokenize, DetokenizeResult, Done, Embed, EmbedResult, Error, Generate, Hello,
    Message, Ok, Sampling,
    Shutdown, Speculative, Status, StatusRequest, Tick, TickRow, Tokenize, TokenizeResult)
from .codec import ProtocolError, decode, encode, error_reply
from .endpoints import (
    check_bind_address, default_endpoint, ensure_private_dir, parse_endpoint, pid_file, socket_path,
    trace_endpoint)
from .client import Client, DaemonError, DaemonTimeout, TickSubscription, new_request_id
from .async_client import AsyncClient
from .interface import DaemonClient
from .local_client import LocalClient

__all__ = [
    "AUTH_TOKEN_ENV", "BAD_FRAME", "BAD_VERSION", "CANCELLED", "CLIENT_CLOSED", "CLIENT_CODES", "CONSTRAINT_KINDS",
    "DISCONNECTED",
    "ERROR_CODES", "FINISH_CANCELLED", "FINISH_LENGTH", "FINISH_REASONS", "FINISH_STOP", "INTERNAL", "INVALID",
    "MAX_EMBED_INPUTS", "MAX_FRAME_BYTES", "MESSAGE_TYPES", "NOT_FOUND", "OVERLOADED", "POOLING_KINDS",
    "PROTOCOL_VERSION", "REPLY_TYPES",
    "REQUEST_TYPES", "SPECULATIVE_KINDS", "SUPPORTED_VERSIONS", "TICK_TOPIC", "TRACE_TYPES", "UNAUTHORIZED",
    "UNKNOWN_TYPE",
    "Cancel", "Chunk", "Constraint", "Detokenize", "DetokenizeResult", "Done", "Embed", "EmbedResult", "Error",
    "Generate", "Hello", "Message",
    "Ok", "ProtocolError", "Sampling", "Shutdown", "Speculative", "Status", "StatusRequest", "Tick", "TickRow",
    "Tokenize", "TokenizeResult", "decode", "encode", "error_reply",
    "check_bind_address", "default_endpoint", "ensure_private_dir", "parse_endpoint", "pid_file",
    "socket_path", "trace_endpoint",
    "AsyncClient", "Client", "DaemonClient", "DaemonError", "DaemonTimeout", "LocalClient", "TickSubscription",
    "new_request_id",
]
