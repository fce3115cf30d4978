"""The mlxd protocol's vocabulary, as plain data: the version, the limits, every code and every message type.

Contract:
    * One dataclass per message; ``TYPE`` is the "type" string of its frame and
      ``MESSAGE_TYPES`` maps every such string to its class. ``REQUEST_TYPES`` travel client ->
      daemon, ``REPLY_TYPES`` daemon -> client, ``TRACE_TYPES`` go out on the daemon's trace socket.
      Nested ``Sampling`` / ``Speculative`` / ``TickRow`` are maps.
    * Every message has an ``id`` (required for ``Generate``, ``Cancel``, ``Chunk``, ``Done`` and
      ``Error``, optional elsewhere); the daemon echoes a request's id on every reply to it, which
      is how clients match replies to requests on one socket.
    * Field types are the annotations (checked by ``field_checks``); each message's ``validate()``
      adds the value rules (ranges, "exactly one of") and raises ``FieldError``.
    * Every code lives here: the error codes a daemon sends (``ERROR_CODES``) and the ones the Python
      clients raise themselves and never send (``CLIENT_CODES``).
    * This module imports nothing of the protocol but ``field_checks`` and ``sampling_rules`` (the type
      and value rules). ``codec`` (``encode``, ``decode``, ``ProtocolError``) imports it; nothing here
      imports back.
"""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from .field_checks import MAX_LIST_ITEMS, FieldError

# MAX_LOGPROBS is re-exported: the tools import it from here with the other limits.
from .sampling_rules import GREEDY, MAX_LOGPROBS, sampling_problem  # noqa: F401

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


MAX_TEMPLATE_KWARGS = 32  # chat_template_kwargs: names per request


def _check_template_kwargs(kwargs: dict | None, messages: list[dict] | None) -> None:
    if kwargs is None:
        return
    _require(messages is not None, "chat_template_kwargs: with messages only")
    check_template_kwargs(kwargs)


def check_template_kwargs(kwargs: dict) -> None:
    """The names ``chat_template_kwargs`` may hold (the HTTP gateway checks bodies with it too).

    Raises:
        FieldError: more than ``MAX_TEMPLATE_KWARGS`` names, a name that is not an identifier, or one the
            request's own fields set (``RENDER_ARGUMENTS``).
    """
    _require(len(kwargs) <= MAX_TEMPLATE_KWARGS, f"chat_template_kwargs: at most {MAX_TEMPLATE_KWARGS} names")
    _require(all(name.isidentifier() for name in kwargs), "chat_template_kwargs: names must be identifiers")
    _require(
        not set(kwargs) & RENDER_ARGUMENTS,
        f"chat_template_kwargs: {sorted(set(kwargs) & RENDER_ARGUMENTS)} are set by the request itself",
    )


# what the renderer is given from the request's own fields, never from chat_template_kwargs
RENDER_ARGUMENTS = frozenset(
    {
        "messages",
        "conversation",
        "tools",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "return_dict",
        "chat_template",
        "documents",
        "padding",
        "truncation",
    }
)


def _tool_name(tool: Any) -> str | None:
    """The function name of an OpenAI-style tool definition, None when it has none."""
    function = tool.get("function") if isinstance(tool, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) and name else None


def _exactly_one(message: Any, names: tuple[str, ...]) -> None:
    given = [name for name in names if getattr(message, name) is not None]
    _require(
        len(given) == 1, f"exactly one of {', '.join(names)} must be given; got {', '.join(given) if given else 'none'}"
    )


class Message:
    """Base of every wire message; ``TYPE`` is the frame's "type" string."""

    __slots__ = ()
    TYPE: ClassVar[str] = ""
    if TYPE_CHECKING:  # every request, reply and tick has an id field; nested values (Sampling, ...) do not
        id: str | None

    def validate(self) -> None:
        """Check values once their types are right; raise FieldError naming the field. No-op here."""


# ---- nested values -------------------------------------------------------------------------


@dataclass(slots=True)
class Sampling(Message):
    """Sampler settings; the defaults (``sampling_rules.GREEDY``) mean greedy decoding with every filter off.

    Also the type of the daemon's own default settings (``mlxd --temp/--top-p/--top-k/--min-p``).
    """

    temperature: float = GREEDY["temperature"]
    top_k: int = GREEDY["top_k"]
    top_p: float = GREEDY["top_p"]
    min_p: float = GREEDY["min_p"]
    repetition_penalty: float = GREEDY["repetition_penalty"]
    presence_penalty: float = GREEDY["presence_penalty"]
    frequency_penalty: float = GREEDY["frequency_penalty"]
    logit_bias: dict[int, float] = field(default_factory=dict)
    seed: int | None = None
    logprobs: int | None = None
    # the logprobs describe the distribution the sampler draws from (after top_k, top_p, min_p and the
    # temperature; tokens they filter out are left out) instead of the model's (llama-server's post_sampling_probs)
    post_sampling: bool = False

    def validate(self) -> None:
        problem = sampling_problem(self)  # the vocabulary-bound rules are checked where the model is known
        _require(problem is None, problem or "")


@dataclass(slots=True)
class Speculative(Message):
    """Speculative decoding choice; None fields mean "the daemon's default"."""

    kind: str | None = None
    max_draft: int | None = None

    def validate(self) -> None:
        _require(
            self.kind is None or self.kind in SPECULATIVE_KINDS,
            f"speculative.kind: must be one of {sorted(SPECULATIVE_KINDS)} or nil",
        )
        _require(
            self.max_draft is None or 0 <= self.max_draft <= MAX_DRAFT_LIMIT,
            f"speculative.max_draft: must be in [0, {MAX_DRAFT_LIMIT}]",
        )


@dataclass(slots=True)
class Constraint(Message):
    """Structured output: the output must follow a JSON schema or a grammar (the daemon masks every other token).

    ``kind``: "json_object" (any JSON object; ``text`` nil), "json_schema" (``text`` is the schema as JSON
    text), "gbnf" (llama.cpp's GBNF), "lark" (llguidance's Lark dialect), "regex". A schema or grammar the
    daemon's grammar library rejects is answered with an invalid_request Error carrying its message.
    """

    kind: str
    text: str | None = None

    def validate(self) -> None:
        _require(self.kind in CONSTRAINT_KINDS, f"constraint.kind: must be one of {sorted(CONSTRAINT_KINDS)}")
        _require(self.kind == "json_object" or bool(self.text), f"constraint.text: required for kind {self.kind!r}")


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
    # reuse the longest cached prefix of the prompt, and leave prompt + output in the daemon's prefix cache
    # when done (llama-server's name); False: neither, the prompt is prefilled whole
    cache_prompt: bool = True
    # a predicted output (OpenAI's "prediction"): text the reply is expected to repeat largely (a file to
    # edit, say); prompt-lookup drafts come from it first. It never changes the output, only its speed.
    prediction: str | None = None
    # prompt lookup may draft from the daemon's shared store of earlier requests' outputs, and this reply
    # goes into it when done; False: neither (it never changes the output, only its speed)
    shared_drafts: bool = True
    # whose shared store: a client's key id (an API key's, say), so nothing one key's requests produced is
    # drafted into another key's; nil: the one store of a server without keys
    draft_key: str | None = None
    constraint: Constraint | None = None  # structured output: a JSON schema or grammar the output follows
    # Tool calls (chat only): OpenAI-style tool definitions for the chat template; "auto" (the default with
    # tools), "none" (tools are not offered), "required" (exactly one call, enforced by a grammar);
    # tool_name: that function must be called (implies "required"). Calls come back in Done.tool_calls.
    tools: list[dict] | None = None
    tool_choice: str | None = None
    tool_name: str | None = None
    # messages only: the last message (an assistant's) is continued, not followed by a new turn: the chat
    # template is applied without a generation prompt and cut after that message's content (assistant prefill)
    continue_final_message: bool = False
    # messages only: extra variables for the chat template (vLLM's and llama-server's name), e.g.
    # {"enable_thinking": false}; they override the daemon's --reasoning default
    chat_template_kwargs: dict | None = None
    # streaming only: Progress replies while the prompt is prefilled (llama-server's return_progress)
    return_progress: bool = False
    # streaming only: every Chunk carries the request's timings so far (llama-server's timings_per_token)
    timings_per_token: bool = False

    def validate(self) -> None:
        _exactly_one(self, ("prompt", "prompt_tokens", "messages"))
        _require(
            self.draft_key is None or 0 < len(self.draft_key) <= MAX_DRAFT_KEY_CHARS,
            f"draft_key: 1 to {MAX_DRAFT_KEY_CHARS} characters, or nil",
        )
        _require(not self.return_progress or self.stream, "return_progress: needs stream")
        _require(not self.timings_per_token or self.stream, "timings_per_token: needs stream")
        _check_template_kwargs(self.chat_template_kwargs, self.messages)
        _require(not self.continue_final_message or bool(self.messages), "continue_final_message: needs messages")
        _require(
            self.tool_choice is None or self.tool_choice in TOOL_CHOICES,
            f"tool_choice: must be one of {sorted(TOOL_CHOICES)} or nil",
        )
        _require(
            self.tools is None or (0 < len(self.tools) <= 128 and all(_tool_name(tool) for tool in self.tools)),
            'tools: 1 to 128 maps, each {"type": "function", "function": {"name": str, ...}}',
        )
        _require(
            self.tools is not None or (self.tool_choice is None and self.tool_name is None),
            "tool_choice / tool_name: need tools",
        )
        _require(
            self.tool_name is None or self.tool_name in {_tool_name(tool) for tool in self.tools or ()},
            "tool_name: must name one of the tools",
        )
        _require(
            not (self.ignore_eos and self.constraint is not None),
            "ignore_eos: cannot be combined with a constraint (a finished grammar allows only end-of-sequence)",
        )
        _require(
            self.prompt_tokens is None or len(self.prompt_tokens) > 0, "prompt_tokens: must hold at least one token"
        )
        _check_tokens(self.prompt_tokens, "prompt_tokens")
        _check_chat_messages(self.messages, "messages")
        _require(1 <= self.max_tokens <= MAX_LIST_ITEMS, f"max_tokens: must be in [1, {MAX_LIST_ITEMS}]")
        _require(len(self.stop) <= MAX_STOP_STRINGS, f"stop: at most {MAX_STOP_STRINGS} strings")
        _require(all(self.stop), "stop: strings must not be empty")
        _require(
            all(len(stop) <= MAX_STOP_CHARS for stop in self.stop),
            f"stop: each string at most {MAX_STOP_CHARS} characters",
        )


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
    # messages only: OpenAI-style tool definitions the chat template renders, as a Generate's ``tools`` do
    # (so the count equals that Generate's prompt tokens)
    tools: list[dict] | None = None
    # messages only: end the rendering with the assistant's header (a Generate always does)
    add_generation_prompt: bool = True
    chat_template_kwargs: dict | None = None  # messages only: as Generate's
    return_text: bool = False  # messages only: the reply carries the rendered prompt text as well
    # messages only: the last message (an assistant's) is continued, as a Generate's (so a prefill counts exactly)
    continue_final_message: bool = False

    def validate(self) -> None:
        _exactly_one(self, ("text", "messages"))
        _check_chat_messages(self.messages, "messages")
        _check_template_kwargs(self.chat_template_kwargs, self.messages)
        _require(
            self.messages is not None
            or (self.add_generation_prompt and not self.return_text and not self.continue_final_message),
            "add_generation_prompt / return_text / continue_final_message: with messages only",
        )
        _require(
            not self.continue_final_message or self.messages[-1].get("role") == "assistant",  # type: ignore[index]
            "continue_final_message: the last message must be the assistant's",
        )
        _require(
            self.tools is None
            or (
                self.messages is not None
                and 0 < len(self.tools) <= 128
                and all(_tool_name(tool) for tool in self.tools)
            ),
            'tools: with messages only; 1 to 128 maps, each {"type": "function", "function": {"name": str, ...}}',
        )


@dataclass(slots=True)
class Detokenize(Message):
    """Turn token ids into text."""

    TYPE: ClassVar[str] = "detokenize"
    tokens: list[int]
    id: str | None = None

    def validate(self) -> None:
        _check_tokens(self.tokens, "tokens")


@dataclass(slots=True)
class Embed(Message):
    """Embeddings of exactly one of texts / token_inputs: the model's last hidden state (after its final
    norm, before the output head), pooled per input (``pooling``: nil = the daemon's ``--pooling``) and,
    with ``normalize``, scaled to unit L2 norm (pooling "none": per-token vectors as they are). Answered by
    EmbedResult."""

    TYPE: ClassVar[str] = "embed"
    texts: list[str] | None = None
    token_inputs: list[list[int]] | None = None
    pooling: str | None = None
    normalize: bool = True
    add_special_tokens: bool = True  # let the tokenizer add BOS and the like to each text
    id: str | None = None

    def validate(self) -> None:
        _exactly_one(self, ("texts", "token_inputs"))
        inputs = self.texts if self.texts is not None else self.token_inputs
        assert inputs is not None  # _exactly_one above
        _require(0 < len(inputs) <= MAX_EMBED_INPUTS, f"texts / token_inputs: 1 to {MAX_EMBED_INPUTS} inputs")
        _require(all(len(one) > 0 for one in inputs), "texts / token_inputs: an input must not be empty")
        for index, tokens in enumerate(self.token_inputs or ()):
            _check_tokens(tokens, f"token_inputs[{index}]")
        _require(
            self.pooling is None or self.pooling in POOLING_KINDS,
            f"pooling: must be one of {sorted(POOLING_KINDS)} or nil",
        )


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
    timings: dict | None = None  # a Generate with timings_per_token: its timings so far (as Done.timings)


@dataclass(slots=True)
class Progress(Message):
    """How far the prefill of a streaming Generate with ``return_progress`` is: one before its first prompt
    chunk (``processed`` = ``cache``), one after each chunk, the last with ``processed`` = ``total``; all before
    the first Chunk."""

    TYPE: ClassVar[str] = "progress"
    id: str
    total: int  # prompt tokens
    cache: int  # of them, taken from the prefix cache
    processed: int  # of them, in the KV storage now (the cached ones included)
    time_ms: float  # since the prefill started

    def validate(self) -> None:
        _require(0 <= self.cache <= self.processed <= self.total, "progress: needs 0 <= cache <= processed <= total")


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
    # the tool calls the model made (a Generate with tools), each {"name": str, "arguments": JSON text};
    # then ``text`` is the content without them
    tool_calls: list[dict] | None = None

    def validate(self) -> None:
        _require(self.finish_reason in FINISH_REASONS, f"finish_reason: must be one of {sorted(FINISH_REASONS)}")


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
    # the rendered chat, when the Tokenize asked for it (return_text); without the template's leading BOS
    # text where the tokenizer adds BOS itself (llama-server's /apply-template text)
    text: str | None = None


@dataclass(slots=True)
class DetokenizeResult(Message):
    """Answer to Detokenize."""

    TYPE: ClassVar[str] = "detokenize_result"
    text: str
    id: str | None = None


@dataclass(slots=True)
class EmbedResult(Message):
    """Answer to Embed: one vector per input, in order (``pooling`` "none": one per token, the inputs'
    vectors one after the other); ``token_counts`` are each input's tokens, ``pooling`` the one applied."""

    TYPE: ClassVar[str] = "embed_result"
    embeddings: list[list[float]]
    token_counts: list[int]
    pooling: str
    id: str | None = None


@dataclass(slots=True)
class Ok(Message):
    """Plain acknowledgement (answer to Shutdown)."""

    TYPE: ClassVar[str] = "ok"
    id: str | None = None


# ---- the tick trace (daemon -> subscribers of its trace socket) ------------------------------


@dataclass(slots=True)
class TickRow(Message):
    """What one request did in a tick.

    ``action``: "prefill" (a prompt chunk), "first-token" (prefill finished), "prime" (a lookahead step
    was submitted, nothing read yet), "decode" (took the batched step; ``tokens`` counts them when the
    tick gave the row more than one; ``detail`` names why a prompt-lookup row was held back, e.g.
    "declined-gate"), "verify" (a verify round; ``drafted`` / ``accepted``; ``detail`` the draft's source:
    "prompt", "output", "prediction" or "shared"), "finished" (the finish
    reason in ``detail``).
    """

    request_id: str
    action: str
    drafted: int | None = None
    accepted: int | None = None
    detail: str | None = None
    tokens: int | None = None

    def validate(self) -> None:
        _require(self.action in TICK_ACTIONS, f"action: must be one of {sorted(TICK_ACTIONS)}")


@dataclass(slots=True)
class Tick(Message):
    """One scheduler tick that did work: published on the trace socket, topic ``TICK_TOPIC``."""

    TYPE: ClassVar[str] = "tick"
    tick: int  # the scheduler's tick counter
    batch: int  # decoding rows as the tick started
    pipelined: bool  # a lookahead step was in flight while this tick's step was read
    rows: list[TickRow] = field(default_factory=list)
    duration_ms: float = 0.0
    prefill_tokens: int = 0  # prompt tokens forwarded this tick
    steps: int = 1  # chained decode steps submitted (their tokens are read by the next tick)
    id: str | None = None  # always nil: a tick answers no request


TICK_TOPIC = b"tick"  # the ZeroMQ topic (first message part) of every Tick on the trace socket

REQUEST_TYPES: tuple[type[Message], ...] = (
    Hello,
    StatusRequest,
    Generate,
    Cancel,
    Tokenize,
    Detokenize,
    Embed,
    Shutdown,
)
REPLY_TYPES: tuple[type[Message], ...] = (
    Status,
    Chunk,
    Progress,
    Done,
    Error,
    TokenizeResult,
    DetokenizeResult,
    EmbedResult,
    Ok,
)
TRACE_TYPES: tuple[type[Message], ...] = (Tick,)
# The registry decode dispatches on: wire "type" string -> message class.
MESSAGE_TYPES: dict[str, type[Message]] = {cls.TYPE: cls for cls in REQUEST_TYPES + REPLY_TYPES + TRACE_TYPES}
