"""Wire types of the mlxd protocol: the only place message types live.

Contract:
    * One dataclass per message; ``TYPE`` is the "type" string of its frame and
      ``MESSAGE_TYPES`` maps every such string to its class. ``REQUEST_TYPES`` travel client ->
      daemon, ``REPLY_TYPES`` daemon -> client. Nested ``Sampling`` / ``Speculative`` are maps.
    * Every message has an ``id`` (required for ``Generate``, ``Cancel``, ``Chunk``, ``Done`` and
      ``Error``, optional elsewhere); the daemon echoes a request's id on every reply to it, which
      is how clients match replies to requests on one socket.
    * Field types are the annotations (checked by ``field_checks``); each message's ``validate()``
      adds the value rules (ranges, "exactly one of") and raises ``FieldError``.
    * The codec (``encode``, ``decode``, ``ProtocolError``, error codes) is in ``codec`` and
      re-exported here, so this module is the whole wire vocabulary.
"""

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .field_checks import MAX_LIST_ITEMS, FieldError

MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 1024
MAX_LOGPROBS = 20
MAX_DRAFT_LIMIT = 256

FINISH_STOP = "stop"  # end-of-sequence token or a stop string
FINISH_LENGTH = "length"  # max_tokens reached
FINISH_CANCELLED = "cancelled"  # a Cancel for this id arrived
FINISH_REASONS = frozenset({FINISH_STOP, FINISH_LENGTH, FINISH_CANCELLED})

SPECULATIVE_KINDS = frozenset({"prompt-lookup", "none"})

# Error code of a request from a connection that has not sent a Hello with the daemon's auth token
# (only when the daemon was started with one). Clients treat it like any code they do not know.
UNAUTHORIZED = "unauthorized"
# Raised by the clients, never sent: the connection to the daemon dropped with the request in flight.
DISCONNECTED = "disconnected"
AUTH_TOKEN_ENV = "MLXD_AUTH_TOKEN"


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise FieldError(message)


def _check_tokens(tokens: list[int] | None, where: str) -> None:
    if tokens:
        _require(min(tokens) >= 0, f"{where}: token ids must be >= 0")


def _check_chat_messages(messages: list[dict] | None, where: str) -> None:
    if messages is None:
        return
    _require(len(messages) > 0, f"{where}: must hold at least one message")
    for index, message in enumerate(messages):
        for key in ("role", "content"):
            _require(type(message.get(key)) is str, f"{where}[{index}].{key}: expected str")


def _exactly_one(message: Any, names: tuple[str, ...]) -> None:
    given = [name for name in names if getattr(message, name) is not None]
    _require(len(given) == 1, f"exactly one of {', '.join(names)} must be given; "
                              f"got {', '.join(given) if given else 'none'}")


class Message:
    """Base of every wire message; ``TYPE`` is the frame's "type" string."""

    __slots__ = ()
    TYPE: ClassVar[str] = ""

    def validate(self) -> None:
        """Check values once their types are right; raise FieldError naming the field. No-op here."""


# ---- nested values -------------------------------------------------------------------------


@dataclass(slots=True)
class Sampling(Message):
    """Sampler settings; the defaults mean greedy decoding with every filter off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    seed: int | None = None
    logprobs: int | None = None

    def validate(self) -> None:
        for name in ("temperature", "top_p", "min_p", "repetition_penalty",
                     "presence_penalty", "frequency_penalty"):
            _require(math.isfinite(getattr(self, name)), f"sampling.{name}: must be finite")
        _require(self.temperature >= 0, "sampling.temperature: must be >= 0")
        _require(self.top_k >= 0, "sampling.top_k: must be >= 0 (0 = off)")
        _require(0 < self.top_p <= 1, "sampling.top_p: must be in (0, 1]")
        _require(0 <= self.min_p <= 1, "sampling.min_p: must be in [0, 1]")
        _require(self.repetition_penalty >= 0, "sampling.repetition_penalty: must be >= 0 (0 = off)")
        _require(all(token >= 0 for token in self.logit_bias), "sampling.logit_bias: keys must be >= 0")
        _require(not any(math.isnan(bias) for bias in self.logit_bias.values()),
                 "sampling.logit_bias: values must not be NaN")
        _require(self.seed is None or self.seed >= 0, "sampling.seed: must be >= 0")
        _require(self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS,
                 f"sampling.logprobs: must be in [0, {MAX_LOGPROBS}]")


@dataclass(slots=True)
class Speculative(Message):
    """Speculative decoding choice; None fields mean "the daemon's default"."""

    kind: str | None = None
    max_draft: int | None = None

    def validate(self) -> None:
        _require(self.kind is None or self.kind in SPECULATIVE_KINDS,
                 f"speculative.kind: must be one of {sorted(SPECULATIVE_KINDS)} or nil")
        _require(self.max_draft is None or 0 <= self.max_draft <= MAX_DRAFT_LIMIT,
                 f"speculative.max_draft: must be in [0, {MAX_DRAFT_LIMIT}]")


# ---- requests (client -> daemon) -----------------------------------------------------------


@dataclass(slots=True)
class Hello(Message):
    """Introduce the client (its name shows in the daemon's log); answered by Status."""

    TYPE: ClassVar[str] = "hello"
    client: str = ""
    id: str | None = None
    token: str | None = None  # the daemon's auth token, when it was started with one


@dataclass(slots=True)
class StatusRequest(Message):
    """Ask for the daemon's Status."""

    TYPE: ClassVar[str] = "status"
    id: str | None = None


@dataclass(slots=True)
class Generate(Message):
    """Generate text from exactly one of prompt / prompt_tokens / messages."""

    TYPE: ClassVar[str] = "generate"
    id: str
    prompt: str | None = None
    prompt_tokens: list[int] | None = None
    messages: list[dict] | None = None
    chat: bool | None = None
    system: str | None = None
    max_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    stream: bool = True
    sampling: Sampling | None = None  # None: the daemon's sampling defaults
    speculative: Speculative | None = None
    add_special_tokens: bool = True
    ignore_eos: bool = False  # keep generating past end-of-sequence tokens (benchmarks)

    def validate(self) -> None:
        _exactly_one(self, ("prompt", "prompt_tokens", "messages"))
        _require(self.prompt_tokens is None or len(self.prompt_tokens) > 0,
                 "prompt_tokens: must hold at least one token")
        _check_tokens(self.prompt_tokens, "prompt_tokens")
        _check_chat_messages(self.messages, "messages")
        _require(1 <= self.max_tokens <= MAX_LIST_ITEMS, f"max_tokens: must be in [1, {MAX_LIST_ITEMS}]")
        _require(len(self.stop) <= MAX_STOP_STRINGS, f"stop: at most {MAX_STOP_STRINGS} strings")
        _require(all(self.stop), "stop: strings must not be empty")
        _require(all(len(stop) <= MAX_STOP_CHARS for stop in self.stop),
                 f"stop: each string at most {MAX_STOP_CHARS} characters")


@dataclass(slots=True)
class Cancel(Message):
    """Stop the generation with this id; no reply of its own (the stream ends with Done)."""

    TYPE: ClassVar[str] = "cancel"
    id: str


@dataclass(slots=True)
class Tokenize(Message):
    """Turn text, or chat messages through the chat template, into token ids."""

    TYPE: ClassVar[str] = "tokenize"
    text: str | None = None
    messages: list[dict] | None = None
    add_special_tokens: bool = True
    id: str | None = None

    def validate(self) -> None:
        _exactly_one(self, ("text", "messages"))
        _check_chat_messages(self.messages, "messages")


@dataclass(slots=True)
class Detokenize(Message):
    """Turn token ids into text."""

    TYPE: ClassVar[str] = "detokenize"
    tokens: list[int]
    id: str | None = None

    def validate(self) -> None:
        _check_tokens(self.tokens, "tokens")


@dataclass(slots=True)
class Shutdown(Message):
    """Ask the daemon to stop; answered by Ok before it exits."""

    TYPE: ClassVar[str] = "shutdown"
    id: str | None = None


# ---- replies (daemon -> client) ------------------------------------------------------------


@dataclass(slots=True)
class Status(Message):
    """What the daemon runs and how busy it is."""

    TYPE: ClassVar[str] = "status_result"
    model: str
    protocol_version: int
    daemon_version: str
    uptime_s: float
    active: int
    queued: int
    max_batch: int
    memory: dict
    options: dict
    totals: dict
    pid: int
    id: str | None = None


@dataclass(slots=True)
class Chunk(Message):
    """Newly generated tokens of a streaming Generate and the text they completed."""

    TYPE: ClassVar[str] = "chunk"
    id: str
    tokens: list[int]
    text: str
    logprobs: list | None = None


@dataclass(slots=True)
class Done(Message):
    """The end of a Generate: why it stopped, the whole output (text and tokens), usage and timings."""

    TYPE: ClassVar[str] = "done"
    id: str
    finish_reason: str
    text: str = ""
    tokens: list[int] = field(default_factory=list)
    usage: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)

    def validate(self) -> None:
        _require(self.finish_reason in FINISH_REASONS,
                 f"finish_reason: must be one of {sorted(FINISH_REASONS)}")


@dataclass(slots=True)
class Error(Message):
    """A request failed; ``id`` is None only when the request's id could not be read."""

    TYPE: ClassVar[str] = "error"
    id: str | None
    code: str
    message: str

    def validate(self) -> None:
        _require(len(self.code) > 0, "code: must not be empty")


@dataclass(slots=True)
class TokenizeResult(Message):
    """Answer to Tokenize."""

    TYPE: ClassVar[str] = "tokenize_result"
    tokens: list[int]
    id: str | None = None


@dataclass(slots=True)
class DetokenizeResult(Message):
    """Answer to Detokenize."""

    TYPE: ClassVar[str] = "detokenize_result"
    text: str
    id: str | None = None


@dataclass(slots=True)
class Ok(Message):
    """Plain acknowledgement (answer to Shutdown)."""

    TYPE: ClassVar[str] = "ok"
    id: str | None = None


REQUEST_TYPES: tuple[type[Message], ...] = (
    Hello, StatusRequest, Generate, Cancel, Tokenize, Detokenize, Shutdown)
REPLY_TYPES: tuple[type[Message], ...] = (
    Status, Chunk, Done, Error, TokenizeResult, DetokenizeResult, Ok)
# The registry decode dispatches on: wire "type" string -> message class.
MESSAGE_TYPES: dict[str, type[Message]] = {cls.TYPE: cls for cls in REQUEST_TYPES + REPLY_TYPES}

# Re-export the codec last: codec.py imports the classes above, so it can only load after them.
from .codec import (  # noqa: E402, F401
    BAD_FRAME, BAD_VERSION, CANCELLED, ERROR_CODES, INTERNAL, INVALID, MAX_FRAME_BYTES, NOT_FOUND,
    OVERLOADED, PROTOCOL_VERSION, SUPPORTED_VERSIONS, UNKNOWN_TYPE, ProtocolError, decode, encode,
    error_reply)
