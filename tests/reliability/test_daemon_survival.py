"""No single request stops mlxd: replies past the protocol's limits, hostile grammars and schemas, huge
integers and lone surrogates each get their own error, and the same daemon process serves on."""

from __future__ import annotations

import json

import psutil
import pytest
import zmq

from mlxd_protocol import (
    BAD_FRAME,
    INVALID,
    Client,
    Constraint,
    DaemonError,
    Detokenize,
    Generate,
    ProtocolError,
    Sampling,
    Tokenize,
    decode,
    encode,
)
from tests.daemon.conftest import private_endpoint, start_daemon, stop_daemon

LIST_LIMIT = 1_048_576  # items one reply's list may carry (the protocol's)


@pytest.fixture(scope="module")
def daemon():
    endpoint = private_endpoint("s")
    # a tokenize limit above the reply's list limit, so the reply itself can be too large
    process = start_daemon(endpoint, "-m", "embedded", "--max-tokenize-chars", "2000000")
    yield endpoint, process
    stop_daemon(process, endpoint)


def serving(endpoint: str, process) -> bool:
    """The same process answers and still generates."""
    with Client(endpoint, timeout_s=60) as client:
        done = list(client.generate(Generate(id="alive", prompt="Once upon a time", max_tokens=4, stream=False)))[-1]
    return process.poll() is None and done.finish_reason in ("length", "stop")


def refusal(endpoint: str, message: Generate) -> DaemonError:
    with Client(endpoint, timeout_s=120) as client, pytest.raises(DaemonError) as caught:
        list(client.generate(message))
    return caught.value


def user_facing(text: str) -> bool:
    """Written for the user: no Python exception name, traceback or llguidance parser state."""
    leaks = ("Traceback", "Error:", "Exception", "<state>", "PanicException", "ParserTooComplex", "/work/")
    return not any(leak in text for leak in leaks)


def test_a_tokenize_reply_past_the_protocol_limits_is_an_error_and_the_daemon_serves_on(daemon):
    endpoint, process = daemon
    with Client(endpoint, timeout_s=120) as client:
        with pytest.raises(DaemonError) as caught:
            client.tokenize("a" * (LIST_LIMIT + 1))
        assert caught.value.code == INVALID and str(LIST_LIMIT) in caught.value.message
        assert client.tokenize("a" * 1000)  # the connection is fine too
    assert serving(endpoint, process)


def test_a_tokenize_over_its_limit_names_the_option(daemon):
    endpoint, process = daemon
    with Client(endpoint, timeout_s=60) as client, pytest.raises(DaemonError) as caught:
        client.tokenize("a" * 2_000_001)
    assert caught.value.code == INVALID and "--max-tokenize-chars" in caught.value.message
    assert serving(endpoint, process)


def chain_grammar(rules: int, name: str = "r") -> str:
    """A GBNF chain: each rule one character then the next rule (llguidance compiled it recursively and
    overflowed its stack); written tight, 4000 rules fit the size limit with the name "r"."""

    def rule(index: int) -> str:
        return name + "".join("0123456789abcdefghijklmnopqrstuvwxyz"[index // 36**k % 36] for k in range(3))

    lines = [f"root::={rule(0)}"] + [f'{rule(i)}::="x"{rule(i + 1)}' for i in range(rules)] + [f'{rule(rules)}::="y"']
    return "\n".join(lines)


@pytest.mark.parametrize(
    "name, limit", [("r", "--max-grammar-rules"), ("a_rule_with_a_long_name_", "--max-grammar-bytes")]
)
def test_a_4000_rule_chain_grammar_is_refused_cleanly(daemon, name, limit):
    endpoint, process = daemon
    grammar = chain_grammar(4000, name)
    error = refusal(endpoint, Generate(id="chain", prompt="x", max_tokens=4, constraint=Constraint("gbnf", grammar)))
    assert error.code == INVALID and limit in error.message and user_facing(error.message), error.message
    assert serving(endpoint, process)


def exponential_grammar(levels: int) -> str:
    return "\n".join(["root ::= e0"] + [f"e{i} ::= e{i + 1} e{i + 1}" for i in range(levels)] + [f'e{levels} ::= "y"'])


HOSTILE = {
    "repeat a million": ("gbnf", 'root ::= "a"{1000000}'),
    "nested repeats": ("gbnf", 'root ::= ("a"{1000}){1000}'),
    "40 levels exponential": ("gbnf", exponential_grammar(40)),
    "nested groups": ("gbnf", "root ::= " + "(" * 500 + '"a"' + ")" * 500),
    "schema pattern (a{1000}){1000}": ("json_schema", json.dumps({"type": "string", "pattern": "(a{1000}){1000}"})),
    "schema recursive required $ref": (
        "json_schema",
        json.dumps(
            {
                "$ref": "#/$defs/node",
                "$defs": {
                    "node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}, "required": ["next"]}
                },
            }
        ),
    ),
    "schema $ref cycle": (
        "json_schema",
        json.dumps({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}),
    ),
    "schema nested 5000 deep": ("json_schema", "[" * 5000 + "]" * 5000),
    "regex nested repeats": ("regex", "((a{100}){100}){100}"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_grammars_and_schemas_are_refused_with_a_message_for_the_user(daemon, case):
    endpoint, process = daemon
    kind, text = HOSTILE[case]
    error = refusal(endpoint, Generate(id="hostile", prompt="x", max_tokens=8, constraint=Constraint(kind, text)))
    assert error.code == INVALID and user_facing(error.message), error.message
    assert process.poll() is None


def test_the_daemon_serves_after_the_hostile_grammars(daemon):
    assert serving(*daemon)


def test_a_temperature_below_the_floor_is_greedy(daemon):
    endpoint, _ = daemon

    def tokens(temperature: float, seed: int | None) -> list[int]:
        request = Generate(
            id=f"t{temperature}-{seed}",
            prompt="Once upon a time",
            max_tokens=24,
            stream=False,
            sampling=Sampling(temperature=temperature, seed=seed),
        )
        with Client(endpoint, timeout_s=60) as client:
            return list(client.generate(request))[-1].tokens

    greedy = tokens(0.0, None)
    assert all(tokens(1e-40, seed) == greedy for seed in (1, 2, 3))
    assert tokens(1e-45, 4) == greedy


BIG = 2**64


@pytest.mark.parametrize(
    "message",
    [
        Generate(id="g", prompt="x", sampling=Sampling(seed=BIG)),
        Generate(id="g", prompt="x", sampling=Sampling(top_k=BIG)),
        Generate(id="g", prompt="x", sampling=Sampling(logit_bias={BIG: 1.0})),
        Generate(id="g", prompt_tokens=[1, BIG]),
        Detokenize(tokens=[BIG], id="d"),
        Generate(id="g", prompt="\ud800"),
        Generate(id="g", messages=[{"role": "user", "content": "x\udc00"}]),
        Tokenize(text="\udfff", id="t"),
        Generate(id="g", messages=[{"role": "user", "content": "x", "extra": {"n": BIG}}]),
    ],
    ids=[
        "seed",
        "top_k",
        "logit_bias key",
        "prompt token",
        "detokenize",
        "prompt surrogate",
        "message surrogate",
        "tokenize surrogate",
        "free-form int",
    ],
)
def test_big_integers_and_lone_surrogates_are_protocol_errors(message):
    with pytest.raises(ProtocolError) as caught:
        encode(message)
    assert caught.value.code == INVALID


def test_the_largest_64_bit_seed_is_served(daemon):
    endpoint, _ = daemon
    request = Generate(
        id="s", prompt="Once", max_tokens=4, stream=False, sampling=Sampling(temperature=0.8, seed=BIG - 1)
    )
    with Client(endpoint, timeout_s=60) as client:
        assert list(client.generate(request))[-1].finish_reason in ("length", "stop")


def test_a_frame_with_a_surrogate_encoded_in_utf8_is_a_bad_frame(daemon):
    endpoint, process = daemon
    good = encode(Tokenize(text="AB", id="raw"))
    frame = good.replace(b"\xa2AB", b"\xa3\xed\xa0\x80")  # the str "AB" -> 3 bytes of an encoded surrogate
    assert frame != good
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(endpoint)
    try:
        socket.send(frame)
        assert socket.poll(10_000), "no reply"
        reply = decode(socket.recv())
    finally:
        socket.close()
    assert reply.code == BAD_FRAME  # (no id: the frame could not be read at all)
    assert serving(endpoint, process)


def test_mlxd_leaves_no_zombie_children(daemon):
    endpoint, process = daemon
    assert serving(endpoint, process)
    children = psutil.Process(process.pid).children(recursive=True)
    assert not [child for child in children if child.status() == psutil.STATUS_ZOMBIE]
