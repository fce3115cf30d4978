"""The bounds checked on a grammar or schema before llguidance sees it (no model needed)."""

from __future__ import annotations

import json

import pytest

from mlxd_engine.sampling.grammar_limits import GrammarLimits, grammar_problem

LIMITS = GrammarLimits()

PASSING = [
    ("gbnf", 'root ::= ("a"{10}){20}'),
    ("gbnf", 'root ::= [0-9]{1,10} "." [{]{2} # a comment {99999}\nx ::= "a"'),
    ("gbnf", 'root ::= "{" ws "}"\nws ::= [ \\t\\n]*'),
    ("lark", 'start: "<call>" %json {"type": "object", "properties": {"a": {"type": "string"}}} "</call>"'),
    ("lark", "start: item ~ 3 | [item]\nitem: /[a-z]{2,5}/"),
    ("regex", r"\{\d{3}\}[{]{5}(ab|cd){1,9}"),
    ("json_schema", json.dumps({"type": "string", "pattern": "^[a-z]{3}(x|y){1,5}$"})),
    ("json_schema", json.dumps({"type": "array", "items": {"type": "integer"}, "maxItems": 100000})),
]

REFUSED = [
    ("gbnf", 'root ::= "a"{1000000}', "--max-grammar-repeat"),
    ("gbnf", 'root ::= ("ab"{100}){20}', "--max-grammar-repeat"),
    ("lark", 'start: "a" ~ 5000', "--max-grammar-repeat"),
    ("lark", "start: /(a{100}){100}/", "--max-grammar-repeat"),
    ("regex", "(a{1000}){1000}", "--max-grammar-repeat"),
    ("json_schema", json.dumps({"type": "string", "pattern": "(a{1000}){1000}"}), "--max-grammar-repeat"),
    ("json_schema", json.dumps({"patternProperties": {"(x{50}){50}": {}}}), "--max-grammar-repeat"),
    ("gbnf", "root ::= " + "(" * 100 + '"a"' + ")" * 100, "--max-grammar-depth"),
    (
        "json_schema",
        json.dumps({"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(2000)}}),
        "--max-grammar-rules",
    ),
    ("gbnf", "\n".join(f'r{i} ::= "x" r{i + 1}' for i in range(1001)), "--max-grammar-rules"),
    ("gbnf", 'root ::= "' + "a" * 70000 + '"', "--max-grammar-bytes"),
]


@pytest.mark.parametrize("kind, text", PASSING)
def test_ordinary_grammars_pass(kind, text):
    assert grammar_problem(kind, text, LIMITS) is None


@pytest.mark.parametrize("kind, text, option", REFUSED)
def test_each_limit_is_named_with_its_option(kind, text, option):
    problem = grammar_problem(kind, text, LIMITS)
    assert problem is not None and option in problem


def test_a_schema_nested_past_pythons_recursion_is_refused_not_raised_as_recursion_error():
    with pytest.raises(ValueError, match="nested too deeply"):
        grammar_problem("json_schema", "[" * 100_000 + "]" * 100_000, GrammarLimits(max_bytes=10**6))


def test_the_limits_are_configurable():
    text = 'root ::= ("ab"{100}){20}'
    assert grammar_problem("gbnf", text, GrammarLimits(max_repeat=2000)) is None
