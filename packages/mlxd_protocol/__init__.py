"""mlxd protocol: the wire types, the msgpack codec, endpoint resolution and the two clients.

A leaf package: it imports only the standard library, msgpack and pyzmq (never mlx), so the thin
CLI tools can talk to the daemon without loading a model runtime. The wire format is described in
``docs/protocol.md``; ``messages`` is the only place message types are defined.
"""

# messages must load before codec (codec imports the message classes; messages re-exports codec).
from .messages import (
    BAD_FRAME, BAD_VERSION, CANCELLED, DISCONNECTED, ERROR_CODES, FINISH_CANCELLED, FINISH_LENGTH, FINISH_REASONS,
    FINISH_STOP, INTERNAL, INVALID, MAX_FRAME_BYTES, MESSAGE_TYPES, NOT_FOUND, OVERLOADED,
    PROTOCOL_VERSION, REPLY_TYPES, REQUEST_TYPES, SPECULATIVE_KINDS, SUPPORTED_VERSIONS, UNKNOWN_TYPE,
    Cancel, Chunk, Detokenize, DetokenizeResult, Done, Error, Generate, Hello, Message, Ok,
    ProtocolError, Sampling, Shutdown, Speculative, Status, StatusRequest, Tokenize, TokenizeResult,
    decode, encode, error_reply)
from .endpoints import (
    check_bind_address, default_endpoint, ensure_private_dir, parse_endpoint, pid_file, socket_path,
    trace_endpoint)
from .client import Client, DaemonError, DaemonTimeout, new_request_id
from .async_client import CLIENT_CLOSED, AsyncClient

__all__ = [
    "BAD_FRAME", "BAD_VERSION", "CANCELLED", "DISCONNECTED", "ERROR_CODES", "FINISH_CANCELLED", "FINISH_LENGTH",
    "FINISH_REASONS", "FINISH_STOP", "INTERNAL", "INVALID", "MAX_FRAME_BYTES", "MESSAGE_TYPES",
    "NOT_FOUND", "OVERLOADED", "PROTOCOL_VERSION", "REPLY_TYPES", "REQUEST_TYPES", "SPECULATIVE_KINDS",
    "SUPPORTED_VERSIONS", "UNKNOWN_TYPE",
    "Cancel", "Chunk", "Detokenize", "DetokenizeResult", "Done", "Error", "Generate", "Hello", "Message",
    "Ok", "ProtocolError", "Sampling", "Shutdown", "Speculative", "Status", "StatusRequest", "Tokenize",
    "TokenizeResult", "decode", "encode", "error_reply",
    "check_bind_address", "default_endpoint", "ensure_private_dir", "parse_endpoint", "pid_file",
    "socket_path", "trace_endpoint",
    "AsyncClient", "CLIENT_CLOSED", "Client", "DaemonError", "DaemonTimeout", "new_request_id",
]
