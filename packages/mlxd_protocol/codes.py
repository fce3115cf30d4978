"""The protocol's numbers and names: the version, the limits, every code and every kind a field may take.

Contract: plain constants, no imports. ``messages`` re-exports every name, so callers import them from there
with the message types (``from mlxd_protocol.messages import INVALID, Generate``).
"""

PROTOCOL_VERSION = 1
SUPPORTED_VERSIONS = frozenset({PROTOCOL_VERSION})

MAX_FRAME_BYTES = 64 * 1024 * 1024  # the daemon also sets ZMQ_MAXMSGSIZE to this
MAX_ID_CHARS = 256
MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 1024
MAX_DRAFT_LIMIT = 256
MAX_DRAFT_KEY_CHARS = 256  # a Generate's draft_key (whose shared draft store)

# Error codes (Error.code), sent by the daemon. A daemon may add codes within a version; clients treat a
# code they do not know like INTERNAL.
BAD_FRAME = "bad_frame"  # not msgpack, not a map, more than one message part, or larger than MAX_FRAME_BYTES
BAD_VERSION = "bad_version"  # "v" missing or not a supported version
UNKNOWN_TYPE = "unknown_type"  # "type" missing, not a known message type, or not a request
INVALID = "invalid_request"  # unknown or missing field, wrong type, value out of range
NOT_FOUND = "not_found"  # names something the daemon lacks (a token id, a chat template)
OVERLOADED = "overloaded"  # the queue is full, or the daemon is draining for shutdown; retry later
CANCELLED = "cancelled"  # the daemon dropped the request itself (e.g. on Shutdown)
INTERNAL = "internal"  # a daemon bug or a failure inside the model
# A request from a connection that has not sent a Hello with the daemon's auth token (only when the
# daemon was started with one).
UNAUTHORIZED = "unauthorized"
ERROR_CODES = frozenset(
    {BAD_FRAME, BAD_VERSION, UNKNOWN_TYPE, INVALID, NOT_FOUND, OVERLOADED, CANCELLED, INTERNAL, UNAUTHORIZED}
)

# Codes the Python clients raise in DaemonError themselves; never on the wire.
CLIENT_CLOSED = "client_closed"  # the asyncio client was closed with the request still waiting
DISCONNECTED = "disconnected"  # the connection to the daemon dropped with the request in flight
CLIENT_CODES = frozenset({CLIENT_CLOSED, DISCONNECTED})

FINISH_STOP = "stop"  # end-of-sequence token or a stop string
FINISH_LENGTH = "length"  # max_tokens reached
FINISH_CANCELLED = "cancelled"  # a Cancel for this id arrived
FINISH_REASONS = frozenset({FINISH_STOP, FINISH_LENGTH, FINISH_CANCELLED})

SPECULATIVE_KINDS = frozenset({"prompt-lookup", "none"})
TOOL_CHOICES = frozenset({"auto", "none", "required"})  # Generate.tool_choice
# Constraint.kind: what the output must follow (structured output).
CONSTRAINT_KINDS = frozenset({"json_object", "json_schema", "gbnf", "lark", "regex"})
# Embed.pooling: how an input's per-token hidden states become its embedding ("none": one vector per token).
POOLING_KINDS = frozenset({"mean", "last", "cls", "none"})
MAX_EMBED_INPUTS = 2048  # inputs of one Embed (OpenAI's bound)

# What a row did in a tick (TickRow.action); see docs/protocol.md, "tick".
TICK_ACTIONS = frozenset({"prefill", "first-token", "prime", "decode", "verify", "finished"})

AUTH_TOKEN_ENV = "MLXD_AUTH_TOKEN"
