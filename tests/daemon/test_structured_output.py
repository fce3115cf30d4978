"""Structured output over the daemon socket (stories260K): a Generate's constraint is followed, one the
grammar library rejects is an invalid_request Error with its message, and the daemon stays healthy."""

from __future__ import annotations

import json
import subprocess
import sys

import jsonschema
import pytest

from mlxd_protocol import INVALID, Client, Constraint, DaemonError, Done, Generate, ProtocolError, new_request_id

SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["color", "count"],
    "properties": {"color": {"enum": ["red", "green"]}, "count": {"type": "integer", "minimum": 0, "maximum": 9}},
}


def generate(client: Client, constraint: Constraint, **kwargs) -> Done:
    replies = list(
        client.generate(
            Generate(id=new_request_id(), prompt="Once upon a time", max_tokens=40, constraint=constraint, **kwargs)
        )
    )
    return replies[-1]


def test_constrained_generation_follows_the_schema(stories_daemon):
    with Client(stories_daemon, timeout_s=30) as client:
        done = generate(client, Constraint(kind="json_schema", text=json.dumps(SCHEMA)))
        assert done.finish_reason == "stop"
        jsonschema.validate(json.loads(done.text), SCHEMA)
        answer = generate(client, Constraint(kind="gbnf", text='root ::= "yes" | "no"'))
        assert answer.text in ("yes", "no") and answer.finish_reason == "stop"


@pytest.mark.parametrize(
    "constraint, words",
    [
        (Constraint(kind="gbnf", text="root ::= missing_rule"), "missing_rule"),
        (Constraint(kind="json_schema", text='{"type": "strin"}'), "strin"),
        (Constraint(kind="json_schema", text="{oops"), "not valid JSON"),
    ],
)
def test_rejected_constraint_is_an_invalid_request_naming_the_problem(stories_daemon, constraint, words):
    with Client(stories_daemon, timeout_s=30) as client:
        with pytest.raises(DaemonError) as caught:
            generate(client, constraint)
        assert caught.value.code == INVALID
        assert str(caught.value).count("constraint: ") == 1 and words in str(caught.value)
        assert client.status().active == 0  # nothing was admitted; the daemon answers


def test_bad_constraint_values_are_refused_before_sending():
    for constraint, extra in [
        (Constraint(kind="xml", text="x"), {}),
        (Constraint(kind="gbnf"), {}),
        (Constraint(kind="json_object"), {"ignore_eos": True}),
    ]:
        from mlxd_protocol import encode

        with pytest.raises(ProtocolError):
            encode(Generate(id="a", prompt="x", constraint=constraint, **extra))


def test_mlx_generate_json_schema_and_grammar_files(stories_daemon, tmp_path):
    schema_file, grammar_file, bad_file = tmp_path / "s.json", tmp_path / "g.gbnf", tmp_path / "bad.gbnf"
    schema_file.write_text(json.dumps(SCHEMA))
    grammar_file.write_text('root ::= "yes" | "no"')
    bad_file.write_text("root ::= nowhere")
    base = [
        sys.executable,
        "-m",
        "mlxd_cli.generate",
        "--endpoint",
        stories_daemon,
        "--no-autostart",
        "--json",
        "--max-tokens",
        "40",
    ]
    result = subprocess.run(
        [*base, "--json-schema", str(schema_file), "Once upon a time"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    jsonschema.validate(json.loads(json.loads(result.stdout)["text"]), SCHEMA)
    result = subprocess.run(
        [*base, "--grammar", str(grammar_file), "Once upon a time"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and json.loads(result.stdout)["text"] in ("yes", "no"), result.stderr
    result = subprocess.run(
        [*base, "--grammar", str(bad_file), "Once upon a time"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0 and "nowhere" in result.stderr and "Traceback" not in result.stderr
