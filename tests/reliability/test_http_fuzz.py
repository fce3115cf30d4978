"""Property-based fuzzing of the HTTP gateway on stories260K: random bodies never give a 5xx or a hang."""

from __future__ import annotations

import httpx
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.daemon.conftest import STORIES, private_endpoint, start_daemon, stop_daemon  # noqa: E402
from tests.serve_http.conftest import Gateway  # noqa: E402


pytestmark = pytest.mark.skipif(not STORIES.is_dir(), reason=f"{STORIES} is not present")

SMALL_MAX = 4  # valid max_tokens / n_predict stay tiny so valid requests are fast

junk = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40), st.floats(allow_nan=True, allow_infinity=True),
                 st.text(max_size=40), st.lists(st.integers(-5, 600), max_size=6),
                 st.dictionaries(st.text(max_size=5), st.integers(), max_size=3))
texts = st.one_of(st.text(max_size=60), st.sampled_from(["Once upon a time", "", "\x00\ud7ff", "a" * 3000]))
counts = st.one_of(st.integers(-2, SMALL_MAX), st.sampled_from([0, -1, 10**9, 2**63]), junk)
floats = st.one_of(st.floats(-3, 3, allow_nan=False), st.sampled_from([-1e308, 1e308, 0.0]), junk)
stops = st.one_of(st.text(max_size=8), st.lists(st.text(max_size=8), max_size=70), junk)
messages = st.one_of(st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "x"]),
                                                     "content": texts}), max_size=3), junk)
common = {"stream": st.one_of(st.booleans(), junk), "temperature": floats, "top_p": floats, "seed": counts,
          "stop": stops, "logprobs": st.one_of(st.booleans(), counts), "top_logprobs": counts,
          "speculative": st.one_of(st.fixed_dictionaries({"kind": st.sampled_from(["prompt-lookup", "none", "x"])}),
                                   junk),
          "unknown_field": junk}

bodies = st.one_of(
    st.tuples(st.just("/v1/completions"),
              st.fixed_dictionaries({"prompt": st.one_of(texts, st.lists(st.integers(-3, 600), max_size=5), junk),
                                     "max_tokens": counts}, optional=common)),
    st.tuples(st.just("/v1/chat/completions"),
              st.fixed_dictionaries({"messages": messages, "max_tokens": counts}, optional=common)),
    st.tuples(st.just("/completion"),
              st.fixed_dictionaries({"prompt": st.one_of(texts, junk), "n_predict": counts},
                                    optional={**common, "ignore_eos": st.one_of(st.booleans(), junk),
                                              "top_k": counts, "n_probs": counts})),
    st.tuples(st.just("/tokenize"),
              st.fixed_dictionaries({"content": st.one_of(texts, junk)}, optional={"add_special": junk})),
    st.tuples(st.just("/detokenize"),
              st.fixed_dictionaries({"tokens": st.one_of(st.lists(st.integers(-3, 2**40), max_size=8), junk)})),
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
    yield gateway
    gateway.stop()
    stop_daemon(daemon, endpoint)


def _clamp(body):
    """Valid-looking counts stay at most SMALL_MAX so valid requests are quick; invalid ones are kept."""
    if isinstance(body, dict):
        for name in ("max_tokens", "n_predict"):
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

        response = fuzz_gateway.client.post(path, content=json.dumps(body), timeout=30,
                                            headers={"content-type": "application/json"})
    assert response.status_code < 500, (path, body, response.status_code, response.text[:300])


def test_health_after_fuzz(fuzz_gateway):
    assert fuzz_gateway.client.get("/health", timeout=10).status_code == 200
    print(f"fuzz cases tried: {TRIED['cases']}")
