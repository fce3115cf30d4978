"""Constrained decoding: a JSON schema or grammar as one more stage of a row's sampler chain (llguidance).

Contract: ``compile_grammar(loaded, kind, text, limits)`` turns what a request asks for into a ``Grammar``:
bounded first in Python (``grammar_limits``: size, rules, nesting, repetition), then checked by
llguidance against the model's tokenizer under its own ``LLParserLimits`` (errors without parser state),
then followed for a few tokens (``_trial_run``); anything refused raises ``GrammarError`` with a message
for the user (the first line of the library's, or ours), never the library's internal state. Each
sequence gets its own ``GrammarStage`` (``Grammar.start()``), which its ``SamplerChain`` runs after the
logits processors: it masks every token the grammar forbids next (logits set to -inf), so the draw,
greedy or sampled, can only pick an allowed token.

The stage follows the row's own token list (``follow``): before each mask it brings its matcher to the
row's output so far, plus the ``pending`` tokens a verify position sees (``output + proposal[:i]``),
rolling back what the row no longer holds (a rejected draft). So it never needs to be told which tokens
were accepted, and a verify round's positions see exactly the state plain decode would. The caller must
not ask for a mask while a token of the row is still in flight (the scheduler steps constrained rows
synchronously).

``allowed_prefix(proposal)`` is how prompt lookup keeps speculating: a draft is cut at the first token
the grammar forbids (checked on the matcher without moving it), so the verify round only checks tokens
that could be emitted.

Why llguidance (not xgrammar): its masks cost little beside a decode step on one CPU core, it takes a
Hugging Face fast tokenizer directly and needs no torch, while xgrammar's wheel pulls in torch and CUDA
packages on Linux (docs/benchmark_results/code_notes.md#grammar-library).

Worked example: schema ``{"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}``;
after the row emitted ``{"ok":`` the mask allows only tokens that continue with whitespace, ``true`` or
``false`` (or a prefix of them); after ``}`` only end-of-sequence.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np

from .grammar_limits import GrammarLimits, grammar_problem, parse_schema

if TYPE_CHECKING:
    from llguidance import LLTokenizer
    from llguidance._lib import JsonCompileOptions

GRAMMAR_KINDS = ("json_object", "json_schema", "gbnf", "lark", "regex")
# JSON as json.dumps writes it. Free whitespace between tokens lets a weak model pad a value with newlines
# until max_tokens (seen on the tiny test models); a schema's "x-guidance" may still ask for it.
JSON_LAYOUT: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


log = logging.getLogger("mlxd")
TRIAL_TOKENS = 16  # tokens a new grammar is followed at compile time
TOO_COMPLEX = (
    "the grammar or schema is too complex to follow (it may allow no finite output, or need more "
    "work per token than the limits allow: simplify it)"
)


def _too_complex(tokens_followed: int) -> str:
    return TOO_COMPLEX if not tokens_followed else f"{TOO_COMPLEX} (after {tokens_followed} output tokens)"


class GrammarError(ValueError):
    """A schema or grammar the library rejects, a model whose tokenizer it cannot take, or output that
    left the grammar (a bug: the mask should have prevented it)."""


_TOKENIZERS: dict[int, tuple[object, object]] = {}  # id(tokenizer wrapper) -> (wrapper, LLTokenizer)


def _llg_tokenizer(loaded):
    """The model's tokenizer in llguidance's form (built once per model: about half a second)."""
    import llguidance.hf

    wrapper = loaded.tokenizer
    cached = _TOKENIZERS.get(id(wrapper))
    if cached is not None and cached[0] is wrapper:
        return cached[1]
    hf = getattr(wrapper, "_tokenizer", wrapper)
    try:
        tokenizer = llguidance.hf.from_tokenizer(
            hf, n_vocab=loaded.vocab_size, eos_token=sorted(loaded.eos_token_ids) or None
        )
    except Exception as error:  # noqa: BLE001 - a slow or odd tokenizer: say why, do not crash the daemon
        raise GrammarError(f"this model's tokenizer cannot be used for structured output ({error})") from error
    _TOKENIZERS[id(wrapper)] = (wrapper, tokenizer)
    return tokenizer


def parser_limits():
    """llguidance's own resource limits, at their defaults, with errors that carry no parser state."""
    import llguidance

    return llguidance.LLParserLimits(verbose_errors=False)


def _first_line(message: str) -> str:
    """The library's message without the grammar excerpt or parser state that may follow it."""
    return message.strip().splitlines()[0] if message.strip() else "the grammar is invalid"


def _grammar_text(kind: str, text: str | None) -> str:
    import llguidance

    if kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_LAYOUT)
    if text is None:
        raise GrammarError(f"{kind}: the grammar text is missing")
    if kind == "json_schema":
        try:
            schema = parse_schema(text)
        except ValueError as error:
            raise GrammarError(str(error)) from None
        if not isinstance(schema, dict):
            raise GrammarError("the JSON schema must be a JSON object")
        try:
            return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)
        except (ValueError, RecursionError) as error:
            raise GrammarError(f"the JSON schema cannot be used: {_first_line(str(error))}") from None
    try:
        return llguidance.grammar_from(kind, text)  # type: ignore[arg-type]  # gbnf, lark or regex (compile_grammar)
    except (ValueError, RecursionError) as error:
        raise GrammarError(_first_line(str(error))) from None


@dataclass(frozen=True)
class Grammar:
    """A checked grammar for one model: ``start()`` gives each sequence its own stage."""

    kind: str
    definition: str  # llguidance's grammar (JSON text)
    tokenizer: LLTokenizer  # the model's, in llguidance's form
    vocab_size: int  # the logits' width

    def start(self) -> GrammarStage:
        import llguidance

        matcher = llguidance.LLMatcher(self.tokenizer, self.definition, log_level=0, limits=parser_limits())
        return GrammarStage(matcher, self.vocab_size)


def compile_grammar(loaded, kind: str, text: str | None = None, limits: GrammarLimits | None = None) -> Grammar:
    """Check a request's schema or grammar against the model and return it ready to start.

    Args:
        loaded: the LoadedModel (its tokenizer, vocabulary and end-of-sequence ids).
        kind: one of ``GRAMMAR_KINDS``: "json_object" (any JSON object), "json_schema" (``text`` is the
            schema as JSON), "gbnf" (llama.cpp's GBNF), "lark" (llguidance's Lark dialect), "regex".
        text: the schema or grammar (None for json_object).
        limits: the bounds checked before the library sees the text (``grammar_limits``; default:
            ``GrammarLimits()``).
    Returns:
        The Grammar.
    Raises:
        GrammarError: over a limit (the message names it), the library rejects it (the first line of its
            message), its first mask already fails (too complex to follow), or the tokenizer cannot be used.
    """
    import llguidance

    if kind not in GRAMMAR_KINDS:
        raise GrammarError(f"unknown grammar kind {kind!r}: expected one of {', '.join(GRAMMAR_KINDS)}")
    if loaded.tokenizer is None:
        raise GrammarError("this model has no tokenizer: structured output needs one")
    try:
        problem = grammar_problem(kind, text, limits or GrammarLimits())
    except ValueError as error:
        raise GrammarError(str(error)) from None
    if problem is not None:
        raise GrammarError(problem)
    definition = _grammar_text(kind, text)
    tokenizer = _llg_tokenizer(loaded)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
        definition, tokenizer, limits=parser_limits()
    )
    if is_error:
        raise GrammarError(_first_line(messages[0]) if messages else "the grammar is invalid")
    grammar = Grammar(kind, definition, tokenizer, loaded.vocab_size)
    _trial_run(grammar)
    return grammar


def _trial_run(grammar: Grammar) -> None:
    """Follow the grammar for up to ``TRIAL_TOKENS`` tokens (each time the lowest allowed token that does
    not end it): one that cannot start or soon fails (a $ref cycle, a schema whose values are all infinite,
    a lexer past its limits) is refused now, not in the middle of a generation."""
    stage = grammar.start()
    tokens: list[int] = []
    stage.follow(tokens, 0)
    ends = set(grammar.tokenizer.eos_tokens)
    for _ in range(TRIAL_TOKENS):
        allowed = np.flatnonzero(stage._mask_bits())  # raises when the matcher failed
        if not allowed.size:
            raise GrammarError(TOO_COMPLEX)
        going_on = [int(token) for token in allowed[:64] if int(token) not in ends]
        if not going_on:
            return  # only the end is allowed: a finished output, fine
        tokens.append(going_on[0])
        stage._sync(tokens)


class GrammarStage:
    """One row's grammar state: a matcher kept in step with the row's output (see the module docstring)."""

    def __init__(self, matcher, vocab_size: int):
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.consumed: list[int] = []  # output tokens the matcher has taken, in order
        self._tokens: list[int] | None = None  # the row's tokens (prompt + output), shared with its Sequence
        self._start = 0  # where the output begins in them
        self._bitmask = np.zeros((vocab_size + 31) // 32, dtype=np.int32)

    def follow(self, tokens: list[int], prompt_length: int) -> None:
        """Bind to a sequence's token list; the output is ``tokens[prompt_length:]``."""
        self._tokens, self._start = tokens, prompt_length

    @property
    def output(self) -> list[int]:
        if self._tokens is None:
            raise GrammarError("the grammar stage follows no sequence (Engine.add_sequence binds it)")
        return self._tokens[self._start :]

    def _sync(self, target: list[int]) -> None:
        """Bring the matcher to exactly ``target`` (rolling back tokens the row no longer holds)."""
        consumed = self.consumed
        same = 0
        limit = min(len(consumed), len(target))
        while same < limit and consumed[same] == target[same]:
            same += 1
        if same < len(consumed):
            self.matcher.rollback(len(consumed) - same)
            del consumed[same:]
        for token in target[same:]:
            if not self.matcher.consume_token(token):  # the mask allowed it: the parser hit its limits
                log.debug("token %d left the grammar: %s", token, self.matcher.get_error())
                raise GrammarError(_too_complex(len(consumed)))
            consumed.append(token)

    def allowed_mask(self, pending: Sequence[int] = ()) -> mx.array:
        """[V] bool: the tokens the grammar allows after the output and ``pending``."""
        self._sync(self.output + list(pending))
        return mx.array(self._mask_bits().astype(np.bool_))

    def apply(self, logits: mx.array, pending: Sequence[int] = ()) -> mx.array:
        """logits [1, V] with every forbidden token at -inf."""
        return mx.where(self.allowed_mask(pending), logits, mx.array(-mx.inf, dtype=logits.dtype))

    def __call__(self, history: mx.array, logits: mx.array) -> mx.array:
        # the LogitsProcessor signature; the stage reads the row's own tokens, not the windowed history
        return self.apply(logits)

    def allowed_prefix(self, proposal: list[int]) -> list[int]:
        """The longest prefix of ``proposal`` the grammar allows after the output (matcher left as it was)."""
        self._sync(self.output)
        return list(proposal[: self.matcher.validate_tokens(list(proposal))])

    def _mask_bits(self) -> np.ndarray:
        self.matcher.unsafe_compute_mask_ptr(self._bitmask.ctypes.data, self._bitmask.nbytes)
        if self.matcher.is_error():
            log.debug("grammar failed after %d tokens: %s", len(self.consumed), self.matcher.get_error())
            raise GrammarError(_too_complex(len(self.consumed)))
        return np.unpackbits(self._bitmask.view(np.uint8), bitorder="little")[: self.vocab_size]
