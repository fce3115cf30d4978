"""What the gateway does with request fields it has no model field for: refuse, accept, or ignore and say so.

Contract:
    * A field that OpenAI or llama-server define and mlxd does not implement (``audio``, ``modalities``
      with audio, llama-server's ``mirostat`` > 0, ``typical_p`` < 1, ...) is refused with a
      400 naming the field, unless the client sent it at its neutral value (the one that changes nothing:
      ``"mirostat": 0``, ``"typical_p": 1.0``); many llama-server clients send every sampler field at
      its default, and those must keep working.
    * A field defined there that cannot change the output (``service_tier``, ``metadata``,
      ``mirostat_tau`` beside ``mirostat`` 0, ...) is accepted silently.
    * The OpenAI endpoints take llama-server's fields as llama-server does on them (``OPENAI_LLAMA_*``):
      ``mirostat`` > 0 is refused on /v1/chat/completions as on /completion.
    * Any other field (a vendor extension nobody defines) is ignored, as llama-server and vLLM do, but
      logged once per name and listed in the ``X-Mlxd-Ignored-Fields`` response header (percent-encoded
      beyond printable ASCII, so any name fits in a header).

The request models keep the extra fields (``extra="allow"``) so ``check_extra_fields`` sees them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from pydantic import BaseModel

from .errors import ApiError

log = logging.getLogger("mlxd.gateway")

IGNORED_FIELDS_HEADER = "X-Mlxd-Ignored-Fields"
MAX_NAMED_IGNORED = 32  # the header stays short whatever a client sends
MAX_IGNORED_NAME_CHARS = 64
_HEADER_SAFE = "".join(chr(code) for code in range(0x21, 0x7F) if chr(code) not in ",%")
Neutral = Callable[[Any], bool]


def _is_none(value: Any) -> bool:
    return value is None


def _equals(*neutral: Any) -> Neutral:
    return lambda value: value is None or value in neutral


def _empty(value: Any) -> bool:
    return value is None or value == [] or value == {} or value == ""


def _text_only(value: Any) -> bool:
    return value is None or value == ["text"]


# field -> (its neutral value test, what the client is told). OpenAI's chat and legacy completions.
OPENAI_UNIMPLEMENTED: dict[str, tuple[Neutral, str]] = {
    "audio": (_is_none, "audio output is not supported"),
    "modalities": (_text_only, 'only ["text"] output is supported'),
    "web_search_options": (_is_none, "web search is not supported"),
    "reasoning_effort": (_is_none, "reasoning effort is not supported"),
    "verbosity": (_is_none, "verbosity is not supported"),
    "store": (_equals(False), "stored completions are not supported"),
    "functions": (_empty, "the deprecated 'functions' are not supported: use 'tools'"),
    "function_call": (_equals("none"), "the deprecated 'function_call' is not supported: use 'tool_choice'"),
}
OPENAI_NO_EFFECT = frozenset({"service_tier", "metadata", "safety_identifier", "prompt_cache_key", "user"})

# llama-server's /completion fields mlxd does not implement, with the value llama-server treats as "off".
LLAMA_UNIMPLEMENTED: dict[str, tuple[Neutral, str]] = {
    "mirostat": (_equals(0), "mirostat sampling is not supported"),
    "typical_p": (_equals(1, 1.0), "typical sampling is not supported"),
    "tfs_z": (_equals(1, 1.0), "tail-free sampling is not supported"),
    "dynatemp_range": (_equals(0, 0.0), "dynamic temperature is not supported"),
    "dry_multiplier": (_equals(0, 0.0), "DRY sampling is not supported"),
    "xtc_probability": (_equals(0, 0.0), "XTC sampling is not supported"),
    "top_n_sigma": (_equals(-1, -1.0), "top-n-sigma sampling is not supported"),
    "repeat_last_n": (_equals(64), "only repeat_last_n 64 is supported"),
    "penalize_nl": (_equals(False), "penalize_nl is not supported"),
    "image_data": (_empty, "images are not supported"),
    "multimodal_data": (_empty, "multimodal input is not supported"),
    "lora": (_empty, "LoRA adapters are not supported"),
    "samplers": (_is_none, "a custom sampler order is not supported"),
    "n_cmpl": (_equals(1), "only one completion per request is supported"),
    "n": (_equals(1), "only one completion per request is supported"),
    "input_prefix": (_empty, "infill is not supported"),
    "input_suffix": (_empty, "infill is not supported"),
    "t_max_predict_ms": (_equals(0), "t_max_predict_ms is not supported"),
    "n_indent": (_equals(0), "n_indent is not supported"),
    "min_keep": (_equals(0, 1), "min_keep is not supported"),  # 0 and 1 alike: a sampler keeps one token anyway
    "adaptive_target": (_equals(-1, -1.0), "adaptive-p sampling is not supported"),
    "echo": (_equals(False), "echo is not supported"),
    "input_extra": (_empty, "infill is not supported"),
    "grammar_lazy": (_equals(False), "lazy grammars are not supported"),
    "grammar_triggers": (_empty, "lazy grammars are not supported"),
    "preserved_tokens": (_empty, "lazy grammars are not supported"),
    # llama-server's parsing of the output into reasoning and tool calls: the text comes back as generated
    "reasoning_format": (_equals("none"), "only reasoning_format none is supported: the reasoning stays in the text"),
    "chat_format": (_equals(0), "output parsing by chat format is not supported"),
    "chat_parser": (_empty, "output parsing by chat format is not supported"),
    "generation_prompt": (_empty, "output parsing by chat format is not supported"),
    "parse_tool_calls": (_equals(False), "tool calls are parsed on /v1/chat/completions only (send tools there)"),
    "reasoning_budget_tokens": (_equals(-1), "a reasoning budget is not supported"),
    "reasoning_control": (_equals(False), "a reasoning budget is not supported"),
}
LLAMA_NO_EFFECT = frozenset(
    {
        "mirostat_tau",
        "mirostat_eta",
        "dynatemp_exponent",
        "dry_base",
        "dry_allowed_length",
        "dry_penalty_last_n",
        "dry_sequence_breakers",
        "xtc_threshold",
        "adaptive_decay",
        "id_slot",
        "t_max_prompt_ms",
        "n_cache_reuse",  # how much cached KV llama-server may reuse by shifting it: the text is the same
        "sse_ping_interval",  # SSE comment pings while a stream is silent: nothing a client reads
        "reasoning_budget_message",  # these four shape a reasoning budget, refused above
        "reasoning_budget_start_tag",
        "reasoning_budget_end_tags",
        "reasoning_budget_end_tag",
        "backend_sampling",  # where llama-server samples (CPU or its backend): mlxd always samples in MLX
        "verbose",  # llama-server's __verbose is its native answer on the OpenAI endpoints: /completion's already
    }
)

# The OpenAI endpoints: OpenAI's fields and llama-server's, which llama-server takes on those endpoints too.
# There n_probs and post_sampling_probs are /completion's forms of logprobs / top_logprobs; return_tokens and
# response_fields shape /completion's answer only, and llama-server's OpenAI replies carry neither.
OPENAI_LLAMA_UNIMPLEMENTED: dict[str, tuple[Neutral, str]] = {
    **LLAMA_UNIMPLEMENTED,
    **OPENAI_UNIMPLEMENTED,
    "n_probs": (_equals(0), "n_probs is /completion's: use logprobs and top_logprobs here"),
    "post_sampling_probs": (_equals(False), "post_sampling_probs is /completion's: use logprobs and top_logprobs here"),
}
OPENAI_LLAMA_NO_EFFECT = OPENAI_NO_EFFECT | LLAMA_NO_EFFECT | {"return_tokens", "response_fields"}

_logged: set[str] = set()
MAX_LOGGED_NAMES = 1024  # random names from clients must not grow the set without bound


def check_extra_fields(
    body: BaseModel, unimplemented: dict[str, tuple[Neutral, str]], no_effect: frozenset[str]
) -> list[str]:
    """Refuse an unimplemented field; return the vendor extensions that will be ignored.

    Args:
        body: A validated request whose model keeps extra fields (``model_extra``).
        unimplemented: The endpoint's table of known fields mlxd does not implement.
        no_effect: Known fields that cannot change the output (accepted silently).

    Returns:
        The names of the fields nobody defines, sorted (each logged the first time it is seen).

    Raises:
        ApiError: 400 naming the first unimplemented field sent at a value that is not its neutral one.
    """
    extra = body.model_extra or {}
    for name, value in extra.items():
        if name in unimplemented:
            neutral, why = unimplemented[name]
            if not neutral(value):
                raise ApiError(400, f"{name}: {why}", param=name, code="unsupported_field")
    ignored = sorted(name for name in extra if name not in unimplemented and name not in no_effect)
    for name in ignored:
        if name not in _logged and len(_logged) < MAX_LOGGED_NAMES:
            _logged.add(name)
            log.warning(
                "request field %a is not defined by OpenAI or llama-server and is ignored "
                "(named in the %s response header)",
                name,
                IGNORED_FIELDS_HEADER,
            )
    return ignored


def ignored_fields_header(ignored: list[str]) -> dict[str, str]:
    """The response header naming the ignored fields (empty when none were).

    A header carries Latin-1 only and no control characters: each name is percent-encoded (UTF-8)
    beyond printable ASCII, and commas in a name too; at most ``MAX_NAMED_IGNORED`` names are listed.
    """
    if not ignored:
        return {}
    names = [
        quote(name[:MAX_IGNORED_NAME_CHARS], safe=_HEADER_SAFE, errors="surrogatepass")
        for name in ignored[:MAX_NAMED_IGNORED]
    ]
    more = len(ignored) - MAX_NAMED_IGNORED
    return {IGNORED_FIELDS_HEADER: ", ".join(names) + (f", (and {more} more)" if more > 0 else "")}


def name_daemon_field(error: ApiError, fields: dict[str, str]) -> ApiError:
    """A daemon refusal names the protocol field it is about ("constraint: <the library's message>",
    "tools: ..."); over HTTP the message and ``param`` name the request's field instead.

    Args:
        error: The ApiError from the daemon's answer.
        fields: Protocol field -> the HTTP request's field (``{"constraint": "response_format"}``).
    """
    for protocol_field, http_field in fields.items():
        prefix = f"{protocol_field}: "
        if error.status == 400 and error.message.startswith(prefix):
            return ApiError(
                400, f"{http_field}: {error.message.removeprefix(prefix)}", param=http_field, code=error.code
            )
    return error
