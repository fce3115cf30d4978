"""Constrained decoding: a JSON schema or grammar as one more stage of a row's sampler chain (llguidance).

Contract: ``compile_grammar(loaded, kind, text)`` turns what a request asks for into a ``Grammar`` (checked
by llguidance against the model's tokenizer; a schema or grammar the library rejects raises
``GrammarError`` with its message). Each sequence gets its own ``GrammarStage`` (``Grammar.start()``),
which its ``SamplerChain`` runs after the logits processors: it masks every token the grammar forbids
next (logits set to -inf), so the draw, greedy or sampled, can only pick an allowed token.

The stage follows the row's own token list (``follow``): before each mask it brings its matcher to the
row's output so far, plus the ``pending`` tokens a verify position sees (``output + proposal[:i]``),
rolling back what the row no longer holds (a rejected draft). So it never needs to be told which tokens
were accepted, and a verify round's positions see exactly the state plain decode would. The caller must
not ask for a mask while a token of the row is still in flight (the scheduler steps constrained rows
synchronously).

``allowed_prefix(proposal)`` is how prompt lookup keeps speculating: a draft is cut at the first token
the grammar forbids (checked on the matcher without moving it), so the verify round only checks tokens
that could be emitted.

Why llguidance (not xgrammar): measured on SmolLM2-135M's tokenizer (49,152 tokens), a mask for a nested
schema takes 0.08 ms per token on average (median 0.02 ms, first token 1.6 ms) on one CPU core, wrapping
the tokenizer 0.55 s once per model; it takes a Hugging Face fast tokenizer directly and needs no torch,
while xgrammar's wheel pulls in torch and CUDA packages (several GB) on Linux.

Worked example: schema ``{"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}``;
after the row emitted ``{"ok":`` the mask allows only tokens that continue with whitespace, ``true`` or
``false`` (or a prefix of them); after ``}`` only end-of-sequence.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

GRAMMAR_KINDS = ("json_object", "json_schema", "gbnf", "lark", "regex")
# JSON as json.dumps writes it. Free whitespace between tokens lets a weak model pad a value with newlines
# until max_tokens (seen on the tiny test models); a schema's "x-guidance" may still ask for it.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


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
        tokenizer = llguidance.hf.from_tokenizer(hf, n_vocab=loaded.vocab_size,
                                                 eos_token=sorted(loaded.eos_token_ids) or None)
    except Exception as error:  # noqa: BLE001 - a slow or odd tokenizer: say why, do not crash the daemon
        raise GrammarError(f"this model's tokenizer cannot be used for structured output ({error})") from error
    _TOKENIZERS[id(wrapper)] = (wrapper, tokenizer)
    return tokenizer


def _grammar_text(kind: str, text: str | None) -> str:
    import llguidance

    if kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_LAYOUT)
    if text is None:
        raise GrammarError(f"{kind}: the grammar text is missing")
    if kind == "json_schema":
        try:
            schema = json.loads(text)
        except json.JSONDecodeError as error:
            raise GrammarError(f"the JSON schema is not valid JSON: {error}") from error
        if not isinstance(schema, dict):
            raise GrammarError("the JSON schema must be a JSON object")
        try:
            return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)
        except ValueError as error:
            raise GrammarError(str(error)) from error
    try:
        return llguidance.grammar_from(kind, text)
    except ValueError as error:
        raise GrammarError(str(error)) from error


@dataclass(frozen=True)
class Grammar:
    """A checked grammar for one model: ``start()`` gives each sequence its own stage."""

    kind: str
    definition: str  # llguidance's grammar (JSON text)
    tokenizer: object  # llguidance.LLTokenizer of the model
    vocab_size: int  # the logits' width

    def start(self) -> GrammarStage:
        import llguidance

        matcher = llguidance.LLMatcher(self.tokenizer, self.definition, log_level=0)
        return GrammarStage(matcher, self.vocab_size)


def compile_grammar(loaded, kind: str, text: str | None = None) -> Grammar:
    """Check a request's schema or grammar against the model and return it ready to start.

    Args:
        loaded: the LoadedModel (its tokenizer, vocabulary and end-of-sequence ids).
        kind: one of ``GRAMMAR_KINDS``: "json_object" (any JSON object), "json_schema" (``text`` is the
            schema as JSON), "gbnf" (llama.cpp's GBNF), "lark" (llguidance's Lark dialect), "regex".
        text: the schema or grammar (None for json_object).
    Returns:
        The Grammar.
    Raises:
        GrammarError: the library rejects it (its message), or the tokenizer cannot be used.
    """
    import llguidance

    if kind not in GRAMMAR_KINDS:
        raise GrammarError(f"unknown grammar kind {kind!r}: expected one of {', '.join(GRAMMAR_KINDS)}")
    if loaded.tokenizer is None:
        raise GrammarError("this model has no tokenizer: structured output needs one")
    definition = _grammar_text(kind, text)
    tokenizer = _llg_tokenizer(loaded)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(definition, tokenizer)
    if is_error:
        raise GrammarError(messages[0] if messages else "the grammar is invalid")
    return Grammar(kind, definition, tokenizer, loaded.vocab_size)


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
        return self._tokens[self._start:]

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
            if not self.matcher.consume_token(token):
                raise GrammarError(f"token {token} left the grammar: {self.matcher.get_error()}")
            consumed.append(token)

    def allowed_mask(self, pending: list[int] = ()) -> mx.array:
        """[V] bool: the tokens the grammar allows after the output and ``pending``."""
        self._sync(self.output + list(pending))
        return mx.array(self._mask_bits().astype(np.bool_))

    def apply(self, logits: mx.array, pending: list[int] = ()) -> mx.array:
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
            raise GrammarError(f"the grammar failed: {self.matcher.get_error()}")
        return np.unpackbits(self._bitmask.view(np.uint8), bitorder="little")[: self.vocab_size]
