"""Bounds on a grammar or JSON schema, checked in Python before the text reaches llguidance.

Contract: ``grammar_problem(kind, text, limits)`` returns a message for the user naming the first limit
the text breaks (and the ``mlxd`` option that sets it), or None. It reads the text the way the grammar
languages write structure, without building the grammar:
- size: the text's UTF-8 bytes (``max_bytes``);
- rules: rule definitions of a GBNF / Lark grammar (a line ``name ::=`` or ``name:``), maps (subschemas)
  of a JSON schema (``max_rules``);
- nesting: open groups ``( [ {`` of a grammar or regex, nested maps and lists of a schema (``max_depth``);
- repetition: the count of ``{m,n}`` (or Lark's ``~ m..n``) multiplied through nested groups, so
  ``"a"{1000000}`` counts a million and ``(a{1000}){1000}`` a million too (``max_repeat``), in grammars,
  regexes and a schema's ``pattern`` / ``patternProperties``.

Why: llguidance compiles a grammar recursively in native code, so a chain of a few thousand rules
overflows its stack and kills the process; a huge repetition count or nested repetitions make it
spin or fail in the middle of a generation. What the checks let through is still bounded by
llguidance's own ``LLParserLimits`` (``grammar.py``) and by a trial mask at compile time.

Worked example: with the defaults, ``root ::= ("ab"{10}){20}`` passes (repetition 200), while
``root ::= ("ab"{100}){20}`` is refused: "the grammar repeats an item 2000 times (nested counts
multiplied); the limit is 1000 (mlxd --max-grammar-repeat)".
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from mlxd_protocol import serving_defaults

# a rule definition at the start of a line: GBNF ``name ::=``, Lark ``name:``, ``?name:``, ``name.2:``
_RULE = re.compile(r"^[ \t]*[?!]?[A-Za-z_][\w-]*(?:\.-?\d+)?[ \t]*(?:::=|:)", re.MULTILINE)
_REPEAT = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")
_LARK_REPEAT = re.compile(r"~\s*(\d+)(?:\s*\.\.\s*(\d+))?")


@dataclass(frozen=True)
class GrammarLimits:
    """What one request's grammar or schema may hold (the ``mlxd --max-grammar-*`` options)."""

    max_bytes: int = (
        serving_defaults.MAX_GRAMMAR_BYTES
    )  # --max-grammar-bytes: UTF-8 bytes of the grammar or schema text
    max_rules: int = (
        serving_defaults.MAX_GRAMMAR_RULES
    )  # --max-grammar-rules: grammar rules, or maps (subschemas) of a JSON schema
    max_depth: int = (
        serving_defaults.MAX_GRAMMAR_DEPTH
    )  # --max-grammar-depth: nested groups, or nested maps and lists of a schema
    max_repeat: int = (
        serving_defaults.MAX_GRAMMAR_REPEAT
    )  # --max-grammar-repeat: a repetition count, multiplied through nested groups


class _Structure:
    """Deepest nesting and largest repetition product seen by a scan."""

    def __init__(self) -> None:
        self.depth = 0
        self.repeat = 1


def _repeat_count(match: re.Match) -> int:
    low, high = match.group(1), match.group(2)
    return int(high) if high else int(low)  # {m} and {m,}: m; {m,n}: n


def _skip_quoted(text: str, start: int, quote: str) -> int:
    """Index just past the string that opens at ``start`` (an unterminated one runs to the end)."""
    index = start + 1
    while index < len(text):
        char = text[index]
        if char == "\\":
            index += 2
            continue
        if char == quote:
            return index + 1
        index += 1
    return len(text)


def _skip_class(text: str, start: int) -> int:
    """Index just past the character class ``[...]`` that opens at ``start``."""
    index = start + 1
    if index < len(text) and text[index] == "^":
        index += 1
    if index < len(text) and text[index] == "]":
        index += 1  # a leading ] is a member
    while index < len(text):
        char = text[index]
        if char == "\\":
            index += 2
            continue
        if char == "]":
            return index + 1
        index += 1
    return len(text)


def _scan(text: str, syntax: str, seen: _Structure) -> None:
    """Walk ``text`` as ``syntax`` ("regex", "gbnf" or "lark"), recording depth and repetition products.

    A stack holds, per open group, the largest product among its items so far and the product of its
    last item (which a following repetition multiplies)."""
    stack = [[1, 1]]  # [best, last] per open group; the bottom one is the whole text
    index = 0
    grammar = syntax != "regex"
    openers, closers = ("([{", ")]}") if syntax == "lark" else ("(", ")")  # Lark: [optional], %json {...}
    while index < len(text):
        char = text[index]
        top = stack[-1]
        item = None  # the product of an item that ends here (None: no item)
        if char == "\\" and not grammar:
            index += 2
            item = 1
        elif char == "[" and syntax != "lark":
            index = _skip_class(text, index)
            item = 1
        elif grammar and char in "\"'":
            index = _skip_quoted(text, index, char)
            item = 1
        elif grammar and text.startswith("//", index) or (syntax == "gbnf" and char == "#"):
            newline = text.find("\n", index)
            index = len(text) if newline < 0 else newline
        elif syntax == "lark" and char == "/":
            end = index + 1
            while end < len(text) and text[end] != "/":
                end = _skip_class(text, end) if text[end] == "[" else end + (2 if text[end] == "\\" else 1)
            inner = _Structure()
            _scan(text[index + 1 : end], "regex", inner)
            seen.depth = max(seen.depth, len(stack) - 1 + inner.depth)
            index = end + 1
            item = inner.repeat
        elif (repeat := _REPEAT.match(text, index)) and index > 0:
            top[1] *= _repeat_count(repeat)
            top[0] = max(top[0], top[1])
            index = repeat.end()
        elif syntax == "lark" and (repeat := _LARK_REPEAT.match(text, index)):
            top[1] *= _repeat_count(repeat)
            top[0] = max(top[0], top[1])
            index = repeat.end()
        elif char in openers:
            stack.append([1, 1])
            seen.depth = max(seen.depth, len(stack) - 1)
            index += 1
        elif char in closers:
            if len(stack) > 1:
                item = stack.pop()[0]
                top = stack[-1]
            index += 1
        else:
            if not char.isspace() and char not in "|*+?":
                item = 1
            index += 1
        if item is not None:
            top[1] = item
            top[0] = max(top[0], item)
    while len(stack) > 1:  # unclosed groups: the library reports the syntax error
        best = stack.pop()[0]
        stack[-1][0] = max(stack[-1][0], best)
    seen.repeat = max(seen.repeat, stack[0][0])


def _schema_structure(schema, seen: _Structure) -> int:
    """Walk a decoded schema without recursion; returns its number of maps (depth and patterns into ``seen``)."""
    maps = 0
    pending = [(schema, 1)]
    while pending:
        value, depth = pending.pop()
        seen.depth = max(seen.depth, depth)
        if isinstance(value, dict):
            maps += 1
            patterns = [value["pattern"]] if isinstance(value.get("pattern"), str) else []
            if isinstance(value.get("patternProperties"), dict):
                patterns += list(value["patternProperties"])
            for pattern in patterns:
                inner = _Structure()
                _scan(pattern, "regex", inner)
                seen.depth = max(seen.depth, depth + inner.depth)
                seen.repeat = max(seen.repeat, inner.repeat)
            pending.extend((item, depth + 1) for item in value.values() if isinstance(item, (dict, list)))
        elif isinstance(value, list):
            pending.extend((item, depth + 1) for item in value if isinstance(item, (dict, list)))
    return maps


def parse_schema(text: str):
    """The schema decoded from JSON text. Raises ValueError with a message for the user."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("the JSON schema is nested too deeply") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"the JSON schema is not valid JSON: {error}") from None


def grammar_problem(kind: str, text: str | None, limits: GrammarLimits) -> str | None:
    """The first limit ``text`` (of grammar ``kind``) breaks, as a message for the user; None when none.

    Args:
        kind: "json_schema", "gbnf", "lark" or "regex" ("json_object" has no text).
        text: The grammar or schema text.
        limits: The bounds.
    Returns:
        A message naming the limit and its ``mlxd`` option, or None.
    Raises:
        ValueError: a JSON schema that is not JSON (the message is for the user).
    """
    if text is None:
        return None
    what = "JSON schema" if kind == "json_schema" else "regular expression" if kind == "regex" else "grammar"
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limits.max_bytes:
        return f"the {what} is {size} bytes; the limit is {limits.max_bytes} (mlxd --max-grammar-bytes)"
    seen = _Structure()
    if kind == "json_schema":
        rules = _schema_structure(parse_schema(text), seen)
        rule_words = "maps (subschemas)"
    elif kind == "regex":
        _scan(text, "regex", seen)
        rules, rule_words = 0, "rules"
    else:
        rules, rule_words = len(_RULE.findall(text)), "rules"
        _scan(text, "gbnf" if "::=" in text else "lark", seen)
    if rules > limits.max_rules:
        return f"the {what} has {rules} {rule_words}; the limit is {limits.max_rules} (mlxd --max-grammar-rules)"
    if seen.depth > limits.max_depth:
        return f"the {what} nests {seen.depth} levels deep; the limit is {limits.max_depth} (mlxd --max-grammar-depth)"
    if seen.repeat > limits.max_repeat:
        return (
            f"the {what} repeats an item {seen.repeat} times (nested counts multiplied); the limit is "
            f"{limits.max_repeat} (mlxd --max-grammar-repeat)"
        )
    return None
