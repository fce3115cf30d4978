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
    * Every code is named here: the error codes a daemon sends (``ERROR_CODES``) and the ones the Python
      clients raise themselves and never send (``CLIENT_CODES``), with the version, limits and kinds
      (defined in ``codes``, re-exported).
    * This module imports nothing of the protocol but ``codes`` and the type and value rules
      (``field_checks``, ``sampling_rules``, ``request_checks``). ``codec`` (``encode``, ``decode``,
      ``ProtocolError``) imports it; nothing here imports back.
"""

from dataclasses import dataclass, field
from typing import ClassVar

from .codes import (  # noqa: F401  (re-exported: the daemon and the tools import the codes from here)
    AUTH_TOKEN_ENV,
    BAD_FRAME,
    BAD_VERSION,
    CANCELLED,
    CLIENT_CLOSED,
    CLIENT_CODES,
    CONSTRAINT_KINDS,
    DISCONNECTED,
    ERROR_CODES,
    FINISH_CANCELLED,
    FINISH_LENGTH,
    FINISH_REASONS,
    FINISH_STOP,
    INTERNAL,
    INVALID,
    MAX_DRAFT_KEY_CHARS,
    MAX_DRAFT_LIMIT,
    MAX_EMBED_INPUTS,
    MAX_FRAME_BYTES,
    MAX_ID_CHARS,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    NOT_FOUND,
    OVERLOADED,
    POOLING_KINDS,
    PROTOCOL_VERSION,
    SPECULATIVE_KINDS,
    SUPPORTED_VERSIONS,
    TICK_ACTIONS,
    TOOL_CHOICES,
    UNAUTHORIZED,
    UNKNOWN_TYPE,
)
from .field_checks import MAX_LIST_ITEMS
from .request_checks import (  # noqa: F401  (re-exported: the gateway checks bodies with check_prompt, check_template_kwargs)
    MAX_TEMPLATE_KWARGS,
    RENDER_ARGUMENTS,
    check_prompt,
    check_template_kwargs,
)
from .request_checks import check_chat_messages as _check_chat_messages
from .request_checks import check_optional_template_kwargs as _check_template_kwargs
from .request_checks import check_tokens as _check_tokens
from .request_checks import exactly_one as _exactly_one
from .request_checks import require as _require
from .request_checks import tool_name as _tool_name

# MAX_LOGPROBS is re-exported: the tools import it from here with the other limits.
from .sampling_rules import MAX_LOGPROBS  # noqa: F401
from .values import Constraint, Message, Sampling, Speculative

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
    # llama-server's context shift (a daemon with --context-shift): when the row's context fills, the first
    # n_keep prompt tokens stay (-1: the whole prompt; a BOS the tokenizer adds counts on top) and n_discard
    # of the tokens after them are dropped (0: half of them); without --context-shift the row ends there
    n_keep: int = 0
    n_discard: int = 0

    def validate(self) -> None:
        _exactly_one(self, ("prompt", "prompt_tokens", "messages"))
        _require(self.n_keep >= -1 and self.n_discard >= 0, "n_keep: must be >= -1; n_discard: must be >= 0")
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
        if self.prompt is not None:
            check_prompt(self.prompt, "prompt")
        if self.prompt_tokens is not None:
            check_prompt(self.prompt_tokens, "prompt_tokens")
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
    truncated: bool = False  # the row's context was shifted: tokens were dropped from it (llama-server's name)

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
