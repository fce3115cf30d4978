"""Property-based fuzzing of the HTTP gateway on stories260K: random bodies never give a 5xx or a hang.

Two fuzzers: hand-written strategies for the generation and token routes, and one driven by the
gateway's own /openapi.json that reaches every operation it lists, with bodies that follow each
operation's schema (often at its bounds) or break it in one field with hostile values (lone surrogates,
integers past 2^64, deep nesting, odd digits). Afterwards the same daemon process still answers.
"""

from __future__ import annotations

import functools
import json
import time

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mlxd_protocol import Client  # noqa: E402
from tests.daemon.conftest import STORIES, private_endpoint, start_daemon, stop_daemon  # noqa: E402
from tests.serve_http.conftest import Gateway  # noqa: E402

pytestmark = pytest.mark.skipif(not STORIES.is_dir(), reason=f"{STORIES} is not present")

SMALL_MAX = 4  # valid max_tokens / n_predict stay tiny so valid requests are fast

junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.lists(st.integers(-5, 600), max_size=6),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)
texts = st.one_of(st.text(max_size=60), st.sampled_from(["Once upon a time", "", "\x00\ud7ff", "a" * 3000]))
counts = st.one_of(st.integers(-2, SMALL_MAX), st.sampled_from([0, -1, 10**9, 2**63]), junk)
floats = st.one_of(st.floats(-3, 3, allow_nan=False), st.sampled_from([-1e308, 1e308, 0.0]), junk)
stops = st.one_of(st.text(max_size=8), st.lists(st.text(max_size=8), max_size=70), junk)
messages = st.one_of(
    st.lists(
        st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "x"]), "content": texts}),
        max_size=3,
    ),
    junk,
)
common = {
    "stream": st.one_of(st.booleans(), junk),
    "temperature": floats,
    "top_p": floats,
    "seed": counts,
    "stop": stops,
    "logprobs": st.one_of(st.booleans(), counts),
    "top_logprobs": counts,
    "speculative": st.one_of(st.fixed_dictionaries({"kind": st.sampled_from(["prompt-lookup", "none", "x"])}), junk),
    "unknown_field": junk,
}

bodies = st.one_of(
    st.tuples(
        st.just("/v1/completions"),
        st.fixed_dictionaries(
            {"prompt": st.one_of(texts, st.lists(st.integers(-3, 600), max_size=5), junk), "max_tokens": counts},
            optional=common,
        ),
    ),
    st.tuples(
        st.just("/v1/chat/completions"),
        st.fixed_dictionaries({"messages": messages, "max_tokens": counts}, optional=common),
    ),
    st.tuples(
        st.just("/completion"),
        st.fixed_dictionaries(
            {"prompt": st.one_of(texts, junk), "n_predict": counts},
            optional={**common, "ignore_eos": st.one_of(st.booleans(), junk), "top_k": counts, "n_probs": counts},
        ),
    ),
    st.tuples(
        st.just("/tokenize"), st.fixed_dictionaries({"content": st.one_of(texts, junk)}, optional={"add_special": junk})
    ),
    st.tuples(
        st.just("/detokenize"),
        st.fixed_dictionaries({"tokens": st.one_of(st.lists(st.integers(-3, 2**40), max_size=8), junk)}),
    ),
    st.tuples(st.sampled_from(["/v1/completions", "/completion", "/tokenize"]), junk),  # not even an object
)

TRIED = {"cases": 0}


@pytest.fixture(scope="module")
def fuzz_gateway():
    if not STORIES.is_dir():
        pytest.skip("stories260K is not present")
    endpoint = private_endpoint("z")
    daemon = start_daemon(endpoint, "-m", str(STORIES), "--max-batch", "8")
    gateway = Gateway([endpoint])
    gateway.daemon, gateway.daemon_endpoint = daemon, endpoint
    yield gateway
    gateway.stop()
    stop_daemon(daemon, endpoint)


def _clamp(body):
    """Valid-looking counts stay at most SMALL_MAX so valid requests are quick; invalid ones are kept."""
    if isinstance(body, dict):
        for name in ("max_tokens", "n_predict", "max_completion_tokens"):
            value = body.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and SMALL_MAX < value <= 4096:
                body[name] = SMALL_MAX
    return body


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(case=bodies)
def test_random_bodies_never_5xx(fuzz_gateway, case):
    path, body = case
    body = _clamp(body)
    TRIED["cases"] += 1
    try:
        response = fuzz_gateway.client.post(path, json=body, timeout=30)
    except ValueError:  # NaN / inf are not JSON: send the raw text instead
        import json

        response = fuzz_gateway.client.post(
            path, content=json.dumps(body), timeout=30, headers={"content-type": "application/json"}
        )
    assert response.status_code < 500, (path, body, response.status_code, response.text[:300])


# ---- every operation of /openapi.json -----------------------------------------------------------

SCHEMA_FUZZ_BUDGET_S = 50.0  # with the fuzzer above, about a minute of requests
SCHEMA_FUZZ_EXAMPLES = 800
FIRST_PID: dict[str, int] = {}

hostile = st.one_of(
    st.sampled_from(
        [
            "\ud800",
            "a\udfffb",
            2**64,
            -(2**64),
            2**63,
            10**30,
            1e308,
            "\u00b2",
            "",
            "\x00",
            {"\u00b2": 1, str(2**64): 1},
            {"\ud800": 1},
        ]
    ),
    st.integers(min_value=5, max_value=300).map(lambda depth: json.loads("[" * depth + "]" * depth)),
    st.integers(min_value=5, max_value=300).map(lambda depth: "[" * depth + "]" * depth),  # JSON text, deep
    junk,
)


def from_openapi(schema: dict, components: dict) -> st.SearchStrategy:
    """Values following one OpenAPI (JSON Schema) node, for the subset FastAPI emits."""
    if "$ref" in schema:
        return st.deferred(lambda: from_openapi(components[schema["$ref"].rsplit("/", 1)[-1]], components))
    if "anyOf" in schema:
        return st.one_of([from_openapi(option, components) for option in schema["anyOf"]])
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "object":
        properties = schema.get("properties")
        if not properties:  # a free-form object (a JSON schema, tool parameters)
            return st.dictionaries(
                st.text(max_size=8), st.one_of(st.none(), st.integers(), st.text(max_size=8)), max_size=3
            )
        required = set(schema.get("required", ()))
        return st.fixed_dictionaries(
            {name: from_openapi(part, components) for name, part in properties.items() if name in required},
            optional={
                name: from_openapi(part, components) for name, part in properties.items() if name not in required
            },
        )
    if kind == "array":
        low = schema.get("minItems", 0)
        return st.lists(
            from_openapi(schema.get("items", {}), components),
            min_size=low,
            max_size=max(low, min(schema.get("maxItems", 4), 4)),
        )
    if kind == "string":
        low = schema.get("minLength", 0)
        return st.text(min_size=low, max_size=max(low, min(schema.get("maxLength", 40), 40)))
    if kind == "integer":
        low = schema.get("minimum", schema["exclusiveMinimum"] + 1 if "exclusiveMinimum" in schema else None)
        high = schema.get("maximum")
        edges = [value for value in (low, high) if value is not None]
        return st.one_of(st.integers(min_value=low, max_value=high), *(st.just(edge) for edge in edges))
    if kind == "number":
        return st.floats(
            min_value=schema.get("minimum", schema.get("exclusiveMinimum")),
            max_value=schema.get("maximum"),
            allow_nan=False,
            allow_infinity=False,
            exclude_min="exclusiveMinimum" in schema,
        )
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    return junk


@functools.cache
def _openapi() -> dict:
    """The gateway's OpenAPI document, as /openapi.json serves it (the app is built, never started)."""
    from mlxd_cli.serve_http.app import Settings, create_app

    return create_app(Settings(daemons=["ipc:///nonexistent/openapi-only.sock"])).openapi()


def _operations() -> list[tuple[str, str, dict | None]]:
    """(method, path, body schema or None) of every operation the gateway's OpenAPI document lists."""
    found = []
    for path, operations in _openapi()["paths"].items():
        for method, operation in operations.items():
            body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            found.append((method.upper(), path, body))
    return found


def _case_strategy() -> st.SearchStrategy:
    components = _openapi()["components"]["schemas"]

    def bodies_for(operation):
        method, path, schema = operation
        if schema is None:
            return st.just((method, path, None))
        valid = from_openapi(schema, components)
        fields = sorted(components.get(schema.get("$ref", "").rsplit("/", 1)[-1], {}).get("properties", {})) or ["x"]
        # One field (known, or a new name) replaced by a hostile value.
        broken = st.tuples(valid, st.sampled_from(fields) | st.text(min_size=1, max_size=12), hostile).map(
            lambda parts: {**parts[0], parts[1]: parts[2]} if isinstance(parts[0], dict) else parts[0]
        )
        return st.tuples(st.just(method), st.just(path), st.one_of(valid, broken))

    return st.sampled_from(_operations()).flatmap(bodies_for)


def test_every_operation_of_the_openapi_schema_is_fuzzed(fuzz_gateway):
    assert {path for _, path, _ in _operations()} >= {
        "/v1/chat/completions",
        "/v1/completions",
        "/completion",
        "/tokenize",
        "/detokenize",
        "/v1/models",
        "/health",
    }
    with Client(fuzz_gateway.daemon_endpoint, timeout_s=5) as daemon:
        FIRST_PID.setdefault("pid", daemon.status().pid)
    started = time.monotonic()
    reached: set[str] = set()

    @settings(
        max_examples=SCHEMA_FUZZ_EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
    @given(case=_case_strategy())
    def run(case):
        method, path, body = case
        if time.monotonic() - started > SCHEMA_FUZZ_BUDGET_S:
            return  # bounded in time, not only in examples
        reached.add(path)
        TRIED["cases"] += 1
        if body is None:
            response = fuzz_gateway.client.request(method, path, timeout=30)
        else:
            text = json.dumps(_clamp(body))  # lone surrogates as \ud800 escapes, NaN as NaN
            response = fuzz_gateway.client.request(
                method, path, content=text, timeout=30, headers={"content-type": "application/json"}
            )
        # 501 is llama-server's answer to a feature turned off (POST /props, /slots, /metrics): a refusal, not a fault
        refused_feature = response.status_code == 501 and response.json()["error"]["type"] == "not_supported_error"
        assert response.status_code < 500 or refused_feature, (
            method,
            path,
            text[:300] if body is not None else "",
            response.text[:300],
        )
        if response.status_code >= 400:
            # OpenAI's error body everywhere, Anthropic's ({"type": "error", "error": {type, message}}) on its API
            anthropic = path.startswith("/v1/messages")
            assert set(response.json()["error"]) >= ({"message", "type"} if anthropic else {"message", "type", "code"})

    run()
    assert reached == {path for _, path, _ in _operations()}, reached


def test_health_after_fuzz(fuzz_gateway):
    assert fuzz_gateway.client.get("/health", timeout=10).status_code == 200
    assert fuzz_gateway.daemon.poll() is None  # the daemon never died (and was never restarted)
    with Client(fuzz_gateway.daemon_endpoint, timeout_s=5) as daemon:
        assert daemon.status().pid == FIRST_PID.get("pid", daemon.status().pid)
    print(f"fuzz cases tried: {TRIED['cases']}")
