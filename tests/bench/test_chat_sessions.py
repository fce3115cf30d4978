"""mlx-bench chat sessions: building a session, the history each turn sends, per-turn figures and reports.

Pure tests cover the prompt book (the opening, follow-ups, history growth) and the per-turn statistics;
the runner and the CLI run against the stub server of test_against_stub_server.py, whose prefix-cache
emulation makes a cached turn's first token come sooner, and against its fake mlxd.
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from mlxd_cli.bench.main import main as bench_main
from mlxd_cli.bench.prompts import (
    CHAT_SYSTEM,
    CHAT_WRAPPER,
    FOLLOW_UP_TOKENS,
    PromptBook,
    chat_history_tokens,
    continue_chat,
    estimate_tokens,
)
from mlxd_cli.bench.report import turn_rows
from mlxd_cli.bench.runner import BenchConfig, run_benchmark
from mlxd_cli.bench.stats import cached_prompt_tokens, combine_turns, summarize_turns, ttft_speedups
from mlxd_cli.bench.targets import DaemonTarget, HttpTarget, TargetUnavailable, _generate_has_cache_prompt

from .test_against_stub_server import FAIL_MARKER, StubServer, _with_fake_mlxd

pytestmark = pytest.mark.integration  # HTTP servers and the CLI end to end over sockets

REPLY = "w0 w1 w2 w3 "  # what the stub streams for max_tokens=4


def _words(messages: list[dict]) -> int:
    return sum(len(message["content"].split()) for message in messages)


# ---- the prompt book -------------------------------------------------------------------------------


@pytest.mark.parametrize("prompt_tokens", [120, 500, 1000])
def test_the_opening_is_the_system_message_then_the_notes_and_a_question_sized_to_prompt_tokens(prompt_tokens):
    book = PromptBook(seed=2, prompt_tokens=prompt_tokens)
    system, user = book.chat_opening("0", 4, 1)
    assert system == {"role": "system", "content": CHAT_SYSTEM}
    assert user["role"] == "user" and user["content"].startswith(CHAT_WRAPPER)
    assert user["content"].endswith(" " + book.follow_up("0", 4, 1, 1))
    total = estimate_tokens(CHAT_SYSTEM) + estimate_tokens(user["content"]) + 10  # + two messages' template
    assert abs(total - prompt_tokens) <= max(0.15 * prompt_tokens, 8), total


def test_sessions_are_deterministic_per_seed_and_differ_per_session_round_level_and_from_copy_prompts():
    book = PromptBook(5, 200)
    assert book.chat_opening("1", 4, 2) == PromptBook(5, 200).chat_opening("1", 4, 2)
    assert book.chat_opening("1", 4, 2) != PromptBook(6, 200).chat_opening("1", 4, 2)
    openings = {book.chat_opening(r, c, i)[1]["content"] for r in ("0", "1") for c in (1, 4) for i in range(4)}
    assert len(openings) == 16
    # The chat notes are not the copy paragraph of the same request: no prefix shared across styles.
    assert book.paragraph("0", 4, 2) not in book.chat_opening("0", 4, 2)[1]["content"]


def test_follow_ups_are_short_deterministic_per_turn_and_vary():
    book = PromptBook(0, 200)
    questions = [book.follow_up("0", 1, index, turn) for index in range(6) for turn in range(1, 5)]
    assert questions == [
        PromptBook(0, 200).follow_up("0", 1, index, turn) for index in range(6) for turn in range(1, 5)
    ]
    assert len(set(questions)) >= 12
    assert all(question.endswith(("?", ".")) for question in questions)
    assert max(estimate_tokens(question) for question in questions) <= FOLLOW_UP_TOKENS + 3


def test_continue_chat_appends_the_reply_and_the_question_and_leaves_the_history_alone():
    history = PromptBook(0, 100).chat_opening("0", 1, 0)
    before = [dict(message) for message in history]
    turn_2 = continue_chat(history, "The farmer went home.", "Why?")
    assert history == before
    assert turn_2 == [
        *before,
        {"role": "assistant", "content": "The farmer went home."},
        {"role": "user", "content": "Why?"},
    ]


def test_history_estimate_reaches_about_1500_tokens_at_turn_4_with_the_documented_settings():
    assert chat_history_tokens(1000, 150, 1) == 1000
    assert chat_history_tokens(1000, 150, 4) == 1000 + 3 * (150 + FOLLOW_UP_TOKENS + 10)
    assert 1400 <= chat_history_tokens(1000, 150, 4) <= 1600


# ---- per-turn statistics on hand-made samples ------------------------------------------------------


def _sample(turn, ttft, ok=True, prompt_tokens=None, cached=None):
    return SimpleNamespace(turn=turn, ttft_s=ttft, ok=ok, prompt_tokens=prompt_tokens, cached_tokens=cached)


def test_cached_tokens_come_from_openai_details_then_mlxd_usage_then_llama_timings():
    assert (
        cached_prompt_tokens({"prompt_tokens_details": {"cached_tokens": 12}, "cached_tokens": 3}, {"cache_n": 4}) == 12
    )
    assert cached_prompt_tokens({"cached_tokens": 3}, {"cache_n": 4}) == 3
    assert cached_prompt_tokens({"prompt_tokens": 9}, {"cache_n": 4}) == 4
    assert cached_prompt_tokens({"prompt_tokens_details": None}, {"cache_n": 0}) == 0
    assert cached_prompt_tokens(None, None) is None
    assert cached_prompt_tokens({"prompt_tokens_details": {"audio_tokens": 1}}, {"prompt_n": 5}) is None


def test_summarize_turns_groups_samples_by_turn_and_skips_failures():
    samples = [
        _sample(1, 0.10, prompt_tokens=100, cached=0),
        _sample(1, 0.30, prompt_tokens=110, cached=20),
        _sample(2, 0.05, prompt_tokens=300, cached=280),
        _sample(2, 9.0, ok=False),
        _sample(None, 1.0),
    ]
    first, second = summarize_turns(samples)
    assert first == {
        "turn": 1,
        "requests": 2,
        "errors": 0,
        "ttft_p50_s": pytest.approx(0.2),
        "ttft_p95_s": pytest.approx(0.29),
        "prompt_tokens_p50": 105,
        "cached_tokens_p50": 10,
    }
    assert second["requests"] == 2 and second["errors"] == 1 and second["ttft_p50_s"] == 0.05
    assert second["cached_tokens_p50"] == 280
    assert summarize_turns([_sample(None, 1.0)]) == []


def test_turns_combine_over_rounds_and_speedups_divide_the_baseline_ttft_by_the_target():
    cached = combine_turns(
        [
            [
                {
                    "turn": 1,
                    "requests": 2,
                    "errors": 0,
                    "ttft_p50_s": 1.0,
                    "ttft_p95_s": 1.2,
                    "prompt_tokens_p50": 100,
                    "cached_tokens_p50": 0,
                },
                {
                    "turn": 2,
                    "requests": 2,
                    "errors": 0,
                    "ttft_p50_s": 0.5,
                    "ttft_p95_s": 0.6,
                    "prompt_tokens_p50": 300,
                    "cached_tokens_p50": 250,
                },
            ],
            [
                {
                    "turn": 1,
                    "requests": 2,
                    "errors": 1,
                    "ttft_p50_s": 2.0,
                    "ttft_p95_s": 2.0,
                    "prompt_tokens_p50": 100,
                    "cached_tokens_p50": 0,
                }
            ],
        ]
    )
    assert [entry["turn"] for entry in cached] == [1, 2]
    assert cached[0]["requests"] == 4 and cached[0]["errors"] == 1
    assert cached[0]["ttft_p50_s"] == {"median": 1.5, "min": 1.0, "max": 2.0, "n": 2}
    assert cached[1]["ttft_p50_s_per_round"] == [0.5, None]  # round 2 never reached turn 2
    cold = combine_turns(
        [
            [
                {
                    "turn": 1,
                    "requests": 2,
                    "errors": 0,
                    "ttft_p50_s": 1.0,
                    "ttft_p95_s": 1.0,
                    "prompt_tokens_p50": 100,
                    "cached_tokens_p50": None,
                },
                {
                    "turn": 2,
                    "requests": 2,
                    "errors": 0,
                    "ttft_p50_s": 2.0,
                    "ttft_p95_s": 2.0,
                    "prompt_tokens_p50": 300,
                    "cached_tokens_p50": None,
                },
            ],
            [
                {
                    "turn": 1,
                    "requests": 2,
                    "errors": 0,
                    "ttft_p50_s": 1.0,
                    "ttft_p95_s": 1.0,
                    "prompt_tokens_p50": 100,
                    "cached_tokens_p50": None,
                },
                {
                    "turn": 2,
                    "requests": 2,
                    "errors": 0,
                    "ttft_p50_s": 3.0,
                    "ttft_p95_s": 3.0,
                    "prompt_tokens_p50": 300,
                    "cached_tokens_p50": None,
                },
            ],
        ]
    )
    assert cold[1]["cached_tokens_p50"] is None
    first, second = ttft_speedups(cached, cold)
    assert first["per_round"] == [1.0, 0.5]
    assert second["per_round"] == [4.0, None] and second["ratio"]["median"] == 4.0


# ---- the runner against the stub --------------------------------------------------------------------


def test_a_session_resends_the_history_with_each_reply_and_targets_stay_interleaved():
    log: list = []
    with StubServer("A", log, ttft_s=0.01, itl_s=0.002) as a, StubServer("B", log, ttft_s=0.01, itl_s=0.002) as b:
        config = BenchConfig(
            concurrencies=[1, 2], styles=["chat"], rounds=2, max_tokens=4, prompt_tokens=60, warmup=1, turns=3
        )
        book = PromptBook(0, 60)
        run = asyncio.run(run_benchmark([HttpTarget("A", a.url), HttpTarget("B", b.url)], config, book))

    assert run.order == [(r, c, "chat", t) for r in range(2) for c in (1, 2) for t in ("A", "B")]
    # Warm-up: one whole session per target; then every batch on A is done before B's starts.
    assert [len(run.warmup_samples), {s.turn for s in run.warmup_samples}] == [6, {1, 2, 3}]
    names = [name for name, _, _ in log]
    assert names[:3] == ["A"] * 3 and names[3:6] == ["B"] * 3
    collapsed = [name for k, name in enumerate(names[6:]) if k == 0 or names[6 + k - 1] != name]
    assert collapsed == ["A", "B"] * 4  # one batch per target per level and round, A B A B
    assert names[6:].count("A") == 2 * (6 + 12)  # c=1: 2 sessions x 3 turns, c=2: 4 x 3, two rounds
    sessions_in_log = {}
    for name, path, body in log:
        assert path == "/v1/chat/completions" and "cache_prompt" not in body
        sessions_in_log.setdefault(name, []).append(body["messages"])

    for batch in run.batches:
        sessions = 2 * batch.concurrency
        assert [(s.index, s.turn) for s in batch.samples] == [(i, t) for i in range(sessions) for t in (1, 2, 3)]
        assert all(s.ok and s.text == REPLY for s in batch.samples)
        assert batch.summary["requests"] == 3 * sessions and batch.summary["completion_tokens"] == 12 * sessions
        assert [turn["turn"] for turn in batch.summary["turns"]] == [1, 2, 3]
        for index in range(sessions):
            turns = [s for s in batch.samples if s.index == index]
            for earlier, later in zip(turns, turns[1:]):  # one worker, one turn after the other
                assert later.sent_at_s >= earlier.sent_at_s + earlier.latency_s - 0.005

    # Every measured body: turn t = turn t-1 + the streamed reply + the book's follow-up.
    for name in ("A", "B"):
        bodies = sessions_in_log[name][3:]
        turn_1 = [messages for messages in bodies if len(messages) == 2]
        assert len(turn_1) == 2 * (2 + 4)
        for messages in bodies:
            if len(messages) > 2:
                previous = messages[:-2]
                assert previous in bodies
                assert messages[-2] == {"role": "assistant", "content": REPLY}
                assert messages[-1]["role"] == "user"
        assert max(len(messages) for messages in bodies) == 2 + 2 * 2
    # Both targets got the same sessions, session 1 of round 1 at c=2 as the book says.
    expected = book.chat_opening("1", 2, 1)
    expected = continue_chat(expected, REPLY, book.follow_up("1", 2, 1, 2))
    expected = continue_chat(expected, REPLY, book.follow_up("1", 2, 1, 3))
    assert expected in sessions_in_log["A"] and expected in sessions_in_log["B"]


class FailSecondTurnOfSessionOne(PromptBook):
    def follow_up(self, round_key, concurrency, index, turn):
        question = super().follow_up(round_key, concurrency, index, turn)
        return f"{FAIL_MARKER} {question}" if (index, turn) == (1, 2) else question


def test_a_failed_turn_ends_its_session_and_the_others_run_on():
    log: list = []
    with StubServer("A", log, ttft_s=0.005, itl_s=0.001) as a:
        config = BenchConfig(concurrencies=[2], styles=["chat"], rounds=1, requests=3, max_tokens=4, warmup=0, turns=3)
        run = asyncio.run(run_benchmark([HttpTarget("A", a.url)], config, FailSecondTurnOfSessionOne(0, 40)))
    samples = run.batches[0].samples
    assert [(s.index, s.turn, s.ok) for s in samples] == [
        (0, 1, True),
        (0, 2, True),
        (0, 3, True),
        (1, 1, True),
        (1, 2, False),
        (2, 1, True),
        (2, 2, True),
        (2, 3, True),
    ]
    assert "HTTP 500" in samples[4].error
    turns = run.batches[0].summary["turns"]
    assert [(t["turn"], t["requests"], t["errors"]) for t in turns] == [(1, 3, 0), (2, 3, 1), (3, 2, 0)]


def test_cli_measures_one_server_with_and_without_its_prompt_cache_per_turn(tmp_path):
    log: list = []
    with StubServer("S", log, ttft_s=0.01, itl_s=0.002, prefill_s_per_word=0.002, prefix_cache=True) as stub:
        result = CliRunner().invoke(
            bench_main,
            [
                "--target",
                f"cache={stub.url}",
                "--target",
                f"nocache={stub.url}",
                "--target-no-cache-prompt",
                "nocache",
                "--baseline",
                "nocache",
                "--prompt-style",
                "chat",
                "--turns",
                "3",
                "--concurrency",
                "1",
                "--requests",
                "2",
                "--rounds",
                "2",
                "--max-tokens",
                "4",
                "--prompt-tokens",
                "80",
                "--warmup",
                "0",
                "--out",
                str(tmp_path),
            ],
        )
    assert result.exit_code == 0, result.output + repr(result.exception)
    flags = [body.get("cache_prompt", "not sent") for _, _, body in log]
    assert len(log) == 2 * 2 * 2 * 3 and flags.count(False) == flags.count("not sent") == len(log) // 2
    results = json.loads((tmp_path / "results.json").read_text())
    assert [(t["name"], t["cache_prompt"]) for t in results["targets"]] == [("cache", None), ("nocache", False)]
    assert [entry[3] for entry in results["order"]] == ["cache", "nocache"] * 2
    cells = {cell["target"]: cell for cell in results["summary"]}
    cached = [entry["cached_tokens_p50"]["median"] for entry in cells["cache"]["turns"]]
    assert cached[0] > 0 and cached[0] < cached[1] < cached[2]  # the system message, then the history
    assert [entry["cached_tokens_p50"]["median"] for entry in cells["nocache"]["turns"]] == [0, 0, 0]
    prompt_words = [entry["prompt_tokens_p50"]["median"] for entry in cells["nocache"]["turns"]]
    assert prompt_words[0] < prompt_words[1] < prompt_words[2]  # the history grows by a reply + a question
    # The same sessions went to both targets (the stub answers both alike).
    assert prompt_words == [entry["prompt_tokens_p50"]["median"] for entry in cells["cache"]["turns"]]
    samples = [s for batch in results["batches"] for s in batch["samples"]]
    assert all(s["text"] == REPLY and s["turn"] in (1, 2, 3) for s in samples)

    # ~80 uncached words cost ~160 ms of "prefill": the cached turns 2 and 3 answer several times sooner.
    speedups = {entry["turn"]: entry for entry in next(row for row in results["ratios"])["turns"]}
    print({turn: entry["per_round"] for turn, entry in speedups.items()})
    assert 0.5 <= speedups[1]["ratio"]["median"] <= 2.0
    assert speedups[2]["ratio"]["median"] >= 2.0 and speedups[3]["ratio"]["median"] >= 2.0
    assert all(len(entry["per_round"]) == 2 for entry in speedups.values())

    rows = turn_rows(results)
    assert [(row[2], row[3]) for row in rows] == [
        ("cache", "1"),
        ("cache", "2"),
        ("cache", "3"),
        ("nocache", "1"),
        ("nocache", "2"),
        ("nocache", "3"),
    ]
    assert rows[3][6] == "1 (baseline)" and rows[1][6].count("[") == 1
    text = (tmp_path / "results.md").read_text()
    assert "## Chat sessions: TTFT per turn" in text and "| chat | 1 | cache | 3 |" in text
    assert "Chat sessions: 3 turns each" in text and "ttft_per_turn.png" in text
    assert (tmp_path / "ttft_per_turn.png").read_bytes()[:4] == b"\x89PNG"
    assert "TTFT speedup vs baseline" in result.output and "cached tokens" in result.output
    print(result.output)


def test_cli_refuses_chat_sessions_on_the_completions_endpoint_and_unknown_no_cache_targets():
    runner = CliRunner()
    refused = runner.invoke(bench_main, ["--target", "a=http://x", "--prompt-style", "chat", "--no-chat"])
    assert refused.exit_code == 2 and "chat endpoint" in refused.output
    refused = runner.invoke(bench_main, ["--target", "a=http://x", "--target-no-cache-prompt", "b"])
    assert refused.exit_code == 2 and "names no target" in refused.output


def test_no_cache_prompt_goes_into_every_http_body():
    target = HttpTarget("t", "http://127.0.0.1:1", model="m")
    request = BenchConfig(concurrencies=[1], styles=["chat"]).make_request(
        0, "q", messages=[{"role": "system", "content": "s"}, {"role": "user", "content": "q"}], turn=1
    )
    assert "cache_prompt" not in target.request_body(request)[1]
    target.cache_prompt = False
    path, body = target.request_body(request)
    assert path == "/v1/chat/completions" and body["cache_prompt"] is False
    assert body["messages"] == request.messages


# ---- the daemon target ------------------------------------------------------------------------------


def test_daemon_sessions_send_messages_with_chat_true_and_the_streamed_replies():
    config = BenchConfig(concurrencies=[1], styles=["chat"], rounds=1, requests=1, max_tokens=4, warmup=0, turns=3)
    run, received = _with_fake_mlxd(
        lambda endpoint: asyncio.run(run_benchmark([DaemonTarget("d", endpoint)], config, PromptBook(0, 40)))
    )
    assert [len(message.messages) for message in received] == [2, 4, 6]
    assert all(message.chat is True and message.prompt is None for message in received)
    assert received[0].messages[0]["role"] == "system"
    assert received[2].messages[:4] == received[1].messages
    assert received[1].messages[2] == {"role": "assistant", "content": "abab"}  # two Chunks of "ab"
    samples = run.batches[0].samples
    assert [s.turn for s in samples] == [1, 2, 3] and all(s.text == "abab" for s in samples)
    assert [s.cached_tokens for s in samples] == [2, 6, 10]  # the fake's usage.cached_tokens
    assert [t["cached_tokens_p50"] for t in run.batches[0].summary["turns"]] == [2, 6, 10]


def test_daemon_no_cache_prompt_is_sent_as_generate_cache_prompt_or_refused_without_the_field():
    config = BenchConfig(concurrencies=[1], styles=["chat"], rounds=1, requests=1, max_tokens=2, warmup=0, turns=2)

    def work(endpoint):
        target = DaemonTarget("d", endpoint)
        target.cache_prompt = False
        try:
            return asyncio.run(run_benchmark([target], config, PromptBook(0, 40)))
        except TargetUnavailable as error:
            return error

    outcome, received = _with_fake_mlxd(work)
    if _generate_has_cache_prompt():
        assert [message.cache_prompt for message in received] == [False, False]
        assert all(sample.ok for sample in outcome.batches[0].samples)
    else:
        assert isinstance(outcome, TargetUnavailable) and "only for HTTP targets" in str(outcome)
        assert received == []
