"""Limits on one request's host work, and which work is small enough to do on the loop thread.

Contract: ``HostLimits`` holds the bounds ``mlxd`` is started with (``--max-messages``,
``--max-tokenize-chars``, ``--max-grammar-bytes/-rules/-depth/-repeat``; docs/architecture.md, "Limits on
host work"). ``check_generate`` / ``check_tokenize`` / ``check_embed`` refuse a request over a limit with
``ProtocolError(INVALID)`` naming the limit and its option, before any work starts; they only count, so
they are cheap on the loop thread. ``runs_inline_*`` say whether a request's host work is small enough to
do at once on the loop thread (a short prompt, a few messages, no grammar): everything else goes to the
worker threads (``host_work.HostWork``), so a big request never holds the other rows' decoding.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlxd_protocol import INVALID, Detokenize, Embed, Generate, ProtocolError, Tokenize, serving_defaults

# host work at most this size runs on the loop thread (a thread hop would cost more than the work)
INLINE_CHARS = 16 * 1024
INLINE_MESSAGES = 64
INLINE_TOKENS = 16 * 1024


@dataclass(frozen=True)
class HostLimits:
    """See the module docstring."""

    max_messages: int = 4096  # --max-messages: chat messages in one Generate or Tokenize
    # --max-tokenize-chars: characters of one Tokenize's text (a reply carries at most 1,048,576 tokens)
    max_tokenize_chars: int = 1024 * 1024
    # the engine's GrammarLimits, field by field (both read serving_defaults); flat here so that mlxd's
    # options import no mlx
    max_grammar_bytes: int = serving_defaults.MAX_GRAMMAR_BYTES  # --max-grammar-bytes
    max_grammar_rules: int = serving_defaults.MAX_GRAMMAR_RULES  # --max-grammar-rules
    max_grammar_depth: int = serving_defaults.MAX_GRAMMAR_DEPTH  # --max-grammar-depth
    max_grammar_repeat: int = serving_defaults.MAX_GRAMMAR_REPEAT  # --max-grammar-repeat

    def grammar(self):
        """The engine's ``GrammarLimits`` holding these bounds."""
        from mlxd_engine import GrammarLimits

        return GrammarLimits(
            max_bytes=self.max_grammar_bytes,
            max_rules=self.max_grammar_rules,
            max_depth=self.max_grammar_depth,
            max_repeat=self.max_grammar_repeat,
        )


def _check_messages(messages: list[dict] | None, limits: HostLimits) -> None:
    if messages is not None and len(messages) > limits.max_messages:
        raise ProtocolError(
            INVALID, f"messages: {len(messages)} messages; the limit is {limits.max_messages} (mlxd --max-messages)"
        )


def check_generate(message: Generate, limits: HostLimits) -> None:
    """Refuse a Generate over a limit (the grammar limits are checked when it is compiled)."""
    _check_messages(message.messages, limits)


def check_tokenize(message: Tokenize, limits: HostLimits) -> None:
    """Refuse a Tokenize over a limit."""
    _check_messages(message.messages, limits)
    if message.text is not None and len(message.text) > limits.max_tokenize_chars:
        raise ProtocolError(
            INVALID,
            f"text: {len(message.text)} characters; the limit is "
            f"{limits.max_tokenize_chars} (mlxd --max-tokenize-chars)",
        )


def check_embed(message: Embed, limits: HostLimits) -> None:
    """Refuse an Embed whose texts are over the tokenize limit (all of them together)."""
    chars = sum(len(text) for text in message.texts or ())
    if chars > limits.max_tokenize_chars:
        raise ProtocolError(
            INVALID, f"texts: {chars} characters; the limit is {limits.max_tokenize_chars} (mlxd --max-tokenize-chars)"
        )


def _text_chars(text: str | None, messages: list[dict] | None) -> int:
    return len(text or "") + sum(len(str(m.get("content", ""))) for m in messages or ())


def runs_inline_generate(message: Generate) -> bool:
    """A Generate whose preparation is small: a short prompt or a few short messages, no grammar or tools."""
    if message.constraint is not None or message.tools:
        return False
    if message.messages is not None and len(message.messages) > INLINE_MESSAGES:
        return False
    chars = _text_chars(message.prompt, message.messages) + len(message.system or "") + len(message.prediction or "")
    return chars <= INLINE_CHARS


def runs_inline_tokenize(message: Tokenize) -> bool:
    if message.tools:
        return False  # tool schemas render through the template: never on the loop thread
    if message.messages is not None and len(message.messages) > INLINE_MESSAGES:
        return False
    return _text_chars(message.text, message.messages) <= INLINE_CHARS


def runs_inline_embed(message: Embed) -> bool:
    """An Embed whose tokenizing is small (token inputs need none)."""
    return sum(len(text) for text in message.texts or ()) <= INLINE_CHARS


def runs_inline_detokenize(message: Detokenize) -> bool:
    return len(message.tokens) <= INLINE_TOKENS
