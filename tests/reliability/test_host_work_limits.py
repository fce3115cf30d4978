"""Host work (chat templates, tokenizing, grammars) runs off the daemon's loop, within named limits, and
mlxd starts with any --max-kv-size it accepts."""

from __future__ import annotations

import threading
import time

import pytest

from mlxd_protocol import INVALID, Client, Constraint, DaemonError, Generate
from tests.daemon.conftest import private_endpoint, start_daemon, stop_daemon

BIG_MESSAGES = 60_000  # a messages array whose chat template takes the daemon a good while


@pytest.fixture(scope="module")
def daemon():
    endpoint = private_endpoint("h")
    process = start_daemon(endpoint, "-m", "embedded", "--max-messages", str(BIG_MESSAGES), "--max-grammar-rules", "50")
    yield endpoint
    stop_daemon(process, endpoint)


def small_request(client: Client, index: int) -> tuple[float, float]:
    """(start, end) of one short generation's whole round trip."""
    started = time.monotonic()
    request = Generate(id=f"small-{index}", prompt="Once upon a time", max_tokens=1, stream=False)
    assert list(client.generate(request))[-1].finish_reason in ("length", "stop")
    return started, time.monotonic()


def test_other_requests_are_served_while_a_large_messages_array_is_templated(daemon):
    """The frozen-loop probe: while one request's chat template runs, short generations keep completing.

    A loop that did the templating itself would hold every request sent meanwhile until the template was
    done: one of them would wait most of the big request's time. Off the loop each waits about as long
    as it does alone (the bound below is half the big request's time, far above that)."""
    big_done = threading.Event()
    outcome = {}

    def big() -> None:
        with Client(daemon, timeout_s=300) as client:
            outcome["sent"] = time.monotonic()
            try:
                messages = [{"role": "user", "content": "hi there"}] * BIG_MESSAGES
                outcome["tokens"] = len(client.tokenize(messages=messages))
            finally:
                outcome["done"] = time.monotonic()
                big_done.set()

    spans = []
    with Client(daemon, timeout_s=60) as client:
        small_request(client, -1)  # warm
        worker = threading.Thread(target=big)
        worker.start()
        while "sent" not in outcome:
            time.sleep(0.001)
        while not big_done.is_set():
            spans.append(small_request(client, len(spans)))
        worker.join()
    assert outcome.get("tokens", 0) > BIG_MESSAGES
    during = [end - start for start, end in spans if start >= outcome["sent"] and end <= outcome["done"]]
    big_s = outcome["done"] - outcome["sent"]
    assert len(during) >= 10 and max(during) < big_s / 2, (
        f"{len(during)} short requests completed during the {big_s:.2f} s the big one took; the longest took "
        f"{max(during, default=0) * 1000:.0f} ms"
    )


def test_over_the_messages_limit_is_refused_at_once_naming_the_option(daemon):
    with Client(daemon, timeout_s=60) as client, pytest.raises(DaemonError) as caught:
        list(client.generate(Generate(id="many", messages=[{"role": "user", "content": "x"}] * (BIG_MESSAGES + 1))))
    assert caught.value.code == INVALID and "--max-messages" in caught.value.message


def test_a_grammar_over_the_rules_limit_names_the_option(daemon):
    grammar = "\n".join(["root ::= r0"] + [f'r{i} ::= "x" r{i + 1}' for i in range(60)] + ['r60 ::= "y"'])
    with Client(daemon, timeout_s=60) as client, pytest.raises(DaemonError) as caught:
        list(client.generate(Generate(id="rules", prompt="x", constraint=Constraint("gbnf", grammar))))
    assert caught.value.code == INVALID and "--max-grammar-rules" in caught.value.message


def test_a_grammar_within_the_limits_is_compiled_off_the_loop_and_followed(daemon):
    grammar = "\n".join(["root ::= r0"] + [f'r{i} ::= "x" r{i + 1}' for i in range(40)] + ['r40 ::= "y"'])
    request = Generate(id="chain", prompt="x", max_tokens=60, stream=False, constraint=Constraint("gbnf", grammar))
    with Client(daemon, timeout_s=60) as client:
        done = list(client.generate(request))[-1]
    assert done.text == "x" * 40 + "y"


def test_a_cancel_while_the_host_work_runs_ends_the_request_cancelled(daemon):
    with Client(daemon, timeout_s=120) as client:
        request = Generate(id="cancel-me", messages=[{"role": "user", "content": "hi"}] * 2000, max_tokens=8)
        stream = client.generate(request)
        client.cancel("cancel-me")
        replies = list(stream)
    assert replies[-1].finish_reason == "cancelled"


@pytest.mark.parametrize("bound", [16, 64, 128])
def test_mlxd_starts_with_a_small_max_kv_size(bound):
    endpoint = private_endpoint(f"k{bound}")
    process = start_daemon(endpoint, "-m", "embedded", "--max-kv-size", str(bound))
    try:
        with Client(endpoint, timeout_s=60) as client:
            assert client.status().options["max_kv_size"] == bound
            done = list(client.generate(Generate(id="kv", prompt="Once", max_tokens=200, stream=False)))[-1]
        assert done.finish_reason in ("length", "stop") and 0 < len(done.tokens) < bound
    finally:
        assert stop_daemon(process, endpoint) == 0
