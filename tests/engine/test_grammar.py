"""Constrained decoding (grammar.py) on real tokenizers: schemas hold, rejections carry the library's
message, prompt lookup keeps the output and its drafts are cut where the grammar forbids."""

from __future__ import annotations

import json

import jsonschema
import pytest

from mlxd_engine import Engine, SamplingParams, prefill_and_record, prompt_lookup_eligibility, verify_round
from mlxd_engine.sampling.grammar import GrammarError, compile_grammar
from mlxd_scheduler.single_sequence import generate_plain, generate_with_prompt_lookup

SCHEMAS = {
    "nested": {
        "type": "object",
        "additionalProperties": False,
        "required": ["user"],
        "properties": {
            "user": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name", "id"],
                "properties": {"name": {"type": "string", "maxLength": 10}, "id": {"type": "integer"}},
            }
        },
    },
    "array": {
        "type": "object",
        "additionalProperties": False,
        "required": ["tags"],
        "properties": {
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 1, "maxItems": 3}
        },
    },
    "enum": {
        "type": "object",
        "additionalProperties": False,
        "required": ["color"],
        "properties": {"color": {"enum": ["red", "green", "blue"]}},
    },
    "bounded integer": {
        "type": "object",
        "additionalProperties": False,
        "required": ["age"],
        "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120}},
    },
}


def prompt_for(loaded, schema: dict) -> list[int]:
    return loaded.tokenizer.encode("Return JSON: " + json.dumps(schema))


@pytest.fixture(scope="module")
def engine(embedded_model):
    return Engine(embedded_model)


@pytest.mark.parametrize("name", SCHEMAS)
def test_greedy_output_validates_and_prompt_lookup_gives_the_same_tokens(embedded_model, engine, name):
    schema = SCHEMAS[name]
    params = SamplingParams(grammar=compile_grammar(embedded_model, "json_schema", json.dumps(schema)))
    prompt = prompt_for(embedded_model, schema)
    plain = generate_plain(engine, prompt, 80, params)
    assert plain.finish_reason == "stop"
    jsonschema.validate(json.loads(embedded_model.tokenizer.decode(plain.tokens)), schema)
    speculative = generate_with_prompt_lookup(engine, prompt, 80, params)
    assert speculative.tokens == plain.tokens


def test_unconstrained_output_is_not_json_so_the_mask_is_what_makes_it(embedded_model, engine):
    prompt = prompt_for(embedded_model, SCHEMAS["nested"])
    free = embedded_model.tokenizer.decode(generate_plain(engine, prompt, 40).tokens)
    with pytest.raises(ValueError):
        json.loads(free)


def test_max_tokens_inside_a_value_finishes_with_length(embedded_model, engine):
    schema = {"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}}
    params = SamplingParams(grammar=compile_grammar(embedded_model, "json_schema", json.dumps(schema)))
    result = generate_plain(engine, prompt_for(embedded_model, schema), 5, params)
    assert result.finish_reason == "length"
    with pytest.raises(ValueError):
        json.loads(embedded_model.tokenizer.decode(result.tokens))


def test_json_object_gbnf_lark_and_regex(embedded_model, engine):
    prompt = embedded_model.tokenizer.encode("Answer: ")
    cases = [
        ("json_object", None, lambda text: isinstance(json.loads(text), dict)),
        ("gbnf", 'root ::= "yes" | "no"', lambda text: text in ("yes", "no")),
        ("lark", 'start: "a" "b"+', lambda text: text.startswith("a") and set(text[1:]) == {"b"}),
        ("regex", r"[0-9]{3}", lambda text: len(text) == 3 and text.isdigit()),
    ]
    for kind, text, holds in cases:
        grammar = compile_grammar(embedded_model, kind, text)
        result = generate_plain(engine, prompt, 24 if kind != "lark" else 6, SamplingParams(grammar=grammar))
        output = embedded_model.tokenizer.decode(result.tokens)
        assert holds(output), (kind, output)


@pytest.mark.parametrize(
    "kind, text, words",
    [
        ("gbnf", "root ::= foo", "Rule 'foo' not found"),
        ("json_schema", '{"type": "strin"}', "strin"),
        ("json_schema", "{not json", "not valid JSON"),
        ("json_schema", "[1, 2]", "must be a JSON object"),
        ("lark", "start: (", ""),
        ("regex", "(", ""),
        ("xml", "x", "unknown grammar kind"),
    ],
)
def test_rejected_grammars_raise_with_the_library_message(embedded_model, kind, text, words):
    with pytest.raises(GrammarError) as caught:
        compile_grammar(embedded_model, kind, text)
    assert words in str(caught.value) and str(caught.value)


def test_verify_round_cuts_the_draft_at_the_first_forbidden_token(embedded_model, engine):
    grammar = compile_grammar(embedded_model, "gbnf", 'root ::= "yes" | "no"')
    tokenizer = embedded_model.tokenizer
    allowed = tokenizer.encode("yes", add_special_tokens=False)
    seq = engine.add_sequence(tokenizer.encode("Answer: "), SamplingParams(grammar=grammar))
    try:
        prefill_and_record(engine, seq)
        forbidden = tokenizer.encode("x", add_special_tokens=False)
        proposal = [t for t in allowed + forbidden + allowed][:8]
        cut = seq.chain.grammar.allowed_prefix(proposal)
        assert len(cut) < len(proposal)
        outcome = verify_round(engine, seq, proposal, 16)
        seq.record(outcome.emitted)  # the caller's update step
        assert outcome.drafted == len(cut)  # only tokens the grammar allows were verified
        assert set(tokenizer.decode(seq.output)) <= set("yesno")
    finally:
        engine.release(seq)


def test_structured_output_is_eligible_for_prompt_lookup(embedded_model):
    grammar = compile_grammar(embedded_model, "json_object")
    assert prompt_lookup_eligibility(SamplingParams(grammar=grammar), storage_can_unwind=True)
