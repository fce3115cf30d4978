"""mlx-bench against stub servers with known latencies: figures, errors, interleaving, outputs, --serve.

The stub is an OpenAI-compatible server on the standard library's ThreadingHTTPServer: /v1/models and
streaming /v1/chat/completions + /v1/completions; the first content chunk comes TTFT after the request,
then one token per ITL, max_tokens tokens, then a usage chunk (and a ``timings`` object when asked).
A prompt containing FAIL_MARKER is answered HTTP 500, one containing SLOW_MARKER waits 2 s first.
With ``prefill_s_per_word`` the first chunk waits that long for every prompt word it has not cached; with
``prefix_cache`` a chat request has every message but the last "cached" (unless ``cache_prompt`` is false),
reported as ``usage.prompt_tokens_details.cached_tokens``, and ``prompt_tokens`` counts the words.
Run as a script (``python test_against_stub_server.py --port N``) it serves until killed (--serve test).
A fake mlxd (a ZeroMQ ROUTER speaking the real codec) covers daemon targets.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

FAIL_MARKER = "FAIL-THIS-REQUEST"
SLOW_MARKER = "SLOW-THIS-REQUEST"


class StubServer:
    """A stub OpenAI-compatible server in a thread; ``log`` collects (name, path, body) per POST."""

    def __init__(
        self,
        name: str,
        log: list,
        ttft_s: float = 0.05,
        itl_s: float = 0.01,
        timings: dict | None = None,
        send_usage: bool = True,
        port: int = 0,
        prefill_s_per_word: float = 0.0,
        prefix_cache: bool = False,
    ) -> None:
        self.name, self.log, self.ttft_s, self.itl_s = name, log, ttft_s, itl_s
        self.timings, self.send_usage = timings, send_usage
        self.prefill_s_per_word, self.prefix_cache = prefill_s_per_word, prefix_cache
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", port), _make_handler(self))
        self.server.handle_error = lambda request, address: None  # clients closing keep-alive sockets
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> StubServer:
        self.thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.server.shutdown()
        self.server.server_close()


def _make_handler(stub: StubServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def log_message(self, *args) -> None:
            pass

        def _json(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": f"stub-{stub.name}", "object": "model"}]})
            else:
                self._json(404, {"error": {"message": "not found"}})

        def _event(self, body: dict | str) -> None:
            data = ("data: " + (body if isinstance(body, str) else json.dumps(body)) + "\n\n").encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def do_POST(self) -> None:
            received = time.perf_counter()
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            chat = self.path == "/v1/chat/completions"
            prompt = body["messages"][-1]["content"] if chat else body.get("prompt", "")
            with stub.lock:
                stub.log.append((stub.name, self.path, body))
            if self.path not in ("/v1/chat/completions", "/v1/completions") or not body.get("stream"):
                self._json(400, {"error": {"message": "the stub only streams"}})
                return
            if FAIL_MARKER in prompt:
                self._json(500, {"error": {"message": "stub failure"}})
                return
            delay = 2.0 if SLOW_MARKER in prompt else 0.0
            words = [len(message["content"].split()) for message in body["messages"]] if chat else [len(prompt.split())]
            cached = sum(words[:-1]) if stub.prefix_cache and body.get("cache_prompt", True) else 0
            delay += stub.prefill_s_per_word * (sum(words) - cached)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                self._stream(received + delay, chat, body, sum(words), cached)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (timeout test)

        def _stream(self, start: float, chat: bool, body: dict, prompt_words: int, cached: int) -> None:
            base = {
                "id": "cmpl-stub",
                "created": 0,
                "model": body["model"],
                "object": "chat.completion.chunk" if chat else "text_completion",
            }
            if chat:
                self._event({**base, "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]})
            tokens = body["max_tokens"]
            for k in range(tokens):
                time.sleep(max(0.0, start + stub.ttft_s + k * stub.itl_s - time.perf_counter()))
                piece = f"w{k} "
                choice = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
                self._event({**base, "choices": [{**choice, "finish_reason": None}]})
            last = {"index": 0, "delta": {}} if chat else {"index": 0, "text": ""}
            self._event({**base, "choices": [{**last, "finish_reason": "length"}]})
            final = {**base, "choices": []}
            if stub.send_usage:
                final["usage"] = {"prompt_tokens": 7, "completion_tokens": tokens, "total_tokens": 7 + tokens}
                if stub.prefix_cache:
                    final["usage"].update(
                        prompt_tokens=prompt_words,
                        total_tokens=prompt_words + tokens,
                        prompt_tokens_details={"cached_tokens": cached},
                    )
            if stub.timings is not None:
                final["timings"] = stub.timings
            self._event(final)
            self._event("[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    return Handler


if __name__ == "__main__":  # the --serve test runs this file as a server
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    arguments = parser.parse_args()
    print(f"stub serving on {arguments.port}", flush=True)
    threading.Timer(60.0, os._exit, args=(3,)).start()  # never outlive a failed test for long
    stub = StubServer("served", [], ttft_s=0.01, itl_s=0.002, port=arguments.port)
    stub.server.serve_forever(poll_interval=0.05)
    sys.exit(0)

# ---- tests (not needed by the script above) --------------------------------------------------------

import httpx  # noqa: E402
import pytest  # noqa: E402
import zmq  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from mlxd_cli.bench.main import main as bench_main  # noqa: E402
from mlxd_cli.bench.prompts import PromptBook  # noqa: E402
from mlxd_cli.bench.report import markdown  # noqa: E402
from mlxd_cli.bench.runner import BenchConfig, run_benchmark  # noqa: E402
from mlxd_cli.bench.stats import summarize_cells  # noqa: E402
from mlxd_cli.bench.targets import DaemonTarget, HttpTarget  # noqa: E402
from mlxd_protocol import Chunk, Done, Generate, Status, StatusRequest, decode, encode  # noqa: E402

pytestmark = pytest.mark.integration  # HTTP servers and the CLI end to end over sockets

MAX_TOKENS = 10  # stub: first token at 50 ms, then one every 10 ms -> last at 140 ms


def _collapse(names: list[str]) -> list[str]:
    collapsed: list[str] = []
    for name in names:
        if not collapsed or collapsed[-1] != name:
            collapsed.append(name)
    return collapsed


def test_figures_match_the_stub_and_targets_run_interleaved():
    log: list = []
    timings = {"predicted_n": MAX_TOKENS, "draft_n": 6, "draft_n_accepted": 4, "draft_verify_n": 2}
    with StubServer("A", log, timings=timings) as a, StubServer("B", log) as b:
        config = BenchConfig(
            concurrencies=[1, 2], styles=["copy"], rounds=2, max_tokens=MAX_TOKENS, prompt_tokens=60, warmup=1
        )
        run = asyncio.run(
            run_benchmark([HttpTarget("A", a.url), HttpTarget("B", b.url + "/v1")], config, PromptBook(0, 60))
        )

    # The order the runner recorded, and the order the servers actually saw.
    assert run.order == [(r, c, "copy", t) for r in range(2) for c in (1, 2) for t in ("A", "B")]
    assert _collapse([name for name, _, _ in log]) == ["A", "B"] * 5  # warm-ups, then A B per batch
    assert len(log) == 2 + 2 * (2 * (2 + 4))
    # Both targets got the same prompts in the same batch.
    measured = [body for _, _, body in log[2:]]
    assert measured[0]["messages"] == measured[2]["messages"] and measured[0]["model"] == "stub-A"
    assert measured[0]["stream"] is True and measured[0]["stream_options"] == {"include_usage": True}

    for batch in run.batches:
        assert [s.index for s in batch.samples] == list(range(2 * batch.concurrency))
        assert all(s.ok and s.completion_tokens == MAX_TOKENS and s.tokens_from == "usage" for s in batch.samples)
        assert all(len(s.token_times_s) == MAX_TOKENS for s in batch.samples)

    # The figures are computed and consistent; how fast the stub was is a benchmark's business, not a
    # test's: timing windows here failed on a busy machine.
    cells = {(c["target"], c["concurrency"]): c for c in summarize_cells(run.batches, ["A", "B"])}
    for cell in cells.values():
        figures = {key: cell[key] for key in ("ttft_p50_s", "itl_p50_s", "decode_tok_s", "latency_p50_s")}
        print(cell["target"], cell["concurrency"], figures)  # shown when an assertion fails
        assert cell["errors"] == 0
        assert cell["completion_tokens"] == 2 * 2 * cell["concurrency"] * MAX_TOKENS
        assert 0 < cell["ttft_p50_s"]["median"] <= cell["latency_p50_s"]["median"]
        assert cell["itl_p50_s"]["median"] >= 0
        # None when a descheduled client read every chunk at once (no span to divide by)
        assert cell["decode_tok_s"] is None or cell["decode_tok_s"]["median"] > 0
        assert cell["aggregate_tok_s"]["median"] > 0
    for batch in run.batches:
        for sample in batch.samples:  # each request's own times are ordered
            assert sample.token_times_s == sorted(sample.token_times_s)
    # Draft counts only where the server reports timings.
    assert cells[("A", 1)]["drafted"] == 6 * 2 * 2 and cells[("A", 1)]["accepted"] == 4 * 2 * 2
    assert cells[("A", 1)]["accepted_per_verify"]["median"] == pytest.approx(2.0)
    assert cells[("B", 1)]["drafted"] is None and cells[("B", 1)]["accepted_per_verify"] is None


class MarkedPrompts(PromptBook):
    """Request 1 of every batch fails with HTTP 500, request 2 is too slow for the request timeout."""

    def prompt(self, style, round_key, concurrency, index):
        text = super().prompt(style, round_key, concurrency, index)
        return {1: f"{FAIL_MARKER} {text}", 2: f"{SLOW_MARKER} {text}"}.get(index, text)


def test_errors_and_timeouts_are_counted_and_the_run_goes_on():
    log: list = []
    with StubServer("A", log, ttft_s=0.01, itl_s=0.002) as a:
        config = BenchConfig(
            concurrencies=[2], styles=["plain"], rounds=2, requests=4, max_tokens=5, warmup=0, request_timeout_s=0.5
        )
        dead = HttpTarget("dead", "http://127.0.0.1:9", model="m")  # nothing listens on the discard port
        run = asyncio.run(run_benchmark([HttpTarget("A", a.url), dead], config, MarkedPrompts(0, 40)))
    for batch in run.batches:
        by_index = {s.index: s for s in batch.samples}
        if batch.target == "A":
            assert batch.summary["errors"] == 2 and batch.summary["requests"] == 4
            assert by_index[1].error.startswith("HTTP 500") and "stub failure" in by_index[1].error
            assert by_index[2].error.startswith("timeout") and 0.45 <= by_index[2].latency_s <= 1.5
            assert batch.summary["completion_tokens"] == 2 * 5
        else:
            assert batch.summary["errors"] == 4 and batch.summary["aggregate_tok_s"] is None
            assert all("Connect" in s.error for s in batch.samples)
    cells = summarize_cells(run.batches, ["A", "dead"])
    assert [c["errors"] for c in cells] == [4, 8]


def test_completions_endpoint_without_usage_counts_content_chunks():
    log: list = []
    with StubServer("A", log, ttft_s=0.01, itl_s=0.002, send_usage=False) as a:
        config = BenchConfig(
            concurrencies=[1],
            styles=["plain"],
            rounds=1,
            requests=1,
            max_tokens=6,
            warmup=0,
            chat=False,
            ignore_eos=True,
            seed=5,
        )
        run = asyncio.run(run_benchmark([HttpTarget("A", a.url, model="given")], config, PromptBook(0, 40)))
    ((_, path, body),) = log
    assert path == "/v1/completions" and body["prompt"].startswith("Write about the following topic: ")
    assert body["model"] == "given" and body["ignore_eos"] is True and body["seed"] == 5
    sample = run.batches[0].samples[0]
    assert sample.ok and sample.completion_tokens == 6 and sample.tokens_from == "chunks"
    assert sample.finish_reason == "length" and sample.timings is None


def _fake_mlxd(endpoint_holder: list, stop: threading.Event, received: list | None = None) -> None:
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    endpoint_holder.append(f"tcp://127.0.0.1:{port}")
    try:
        while not stop.is_set():
            if not router.poll(50):
                continue
            identity, frame = router.recv_multipart()
            message = decode(frame)
            if isinstance(message, StatusRequest):
                reply = Status(
                    model="fake-model",
                    protocol_version=1,
                    daemon_version="0",
                    uptime_s=1.0,
                    active=0,
                    queued=0,
                    max_batch=8,
                    memory={},
                    options={},
                    totals={},
                    pid=1,
                    id=message.id,
                )
                router.send_multipart([identity, encode(reply)])
            elif isinstance(message, Generate):
                if received is not None:
                    received.append(message)
                started = time.perf_counter()
                for k in range(0, message.max_tokens, 2):  # two tokens per chunk, as verify rounds send
                    time.sleep(max(0.0, started + 0.03 + k * 0.01 - time.perf_counter()))
                    router.send_multipart([identity, encode(Chunk(id=message.id, tokens=[k, k + 1], text="ab"))])
                done = Done(
                    id=message.id,
                    finish_reason="length",
                    usage={
                        "prompt_tokens": 9,
                        "completion_tokens": message.max_tokens,
                        "cached_tokens": 2 * (len(message.messages or ()) - 1),
                    },
                    timings={"draft_n": 5, "draft_n_accepted": 3},
                )
                router.send_multipart([identity, encode(done)])
    finally:
        router.close(linger=0)
        context.term()


def _with_fake_mlxd(work):
    """``work(endpoint)`` against a fake mlxd on its own thread; returns its result and the Generates received."""
    endpoint: list = []
    received: list = []
    stop = threading.Event()
    thread = threading.Thread(target=_fake_mlxd, args=(endpoint, stop, received), daemon=True)
    thread.start()
    while not endpoint:
        time.sleep(0.01)
    try:
        return work(endpoint[0]), received
    finally:
        stop.set()
        thread.join(5)


def test_daemon_target_reads_chunks_done_usage_and_timings():
    endpoint: list = []
    received: list = []
    stop = threading.Event()
    thread = threading.Thread(target=_fake_mlxd, args=(endpoint, stop, received), daemon=True)
    thread.start()
    while not endpoint:
        time.sleep(0.01)
    try:
        config = BenchConfig(concurrencies=[1], styles=["copy"], rounds=1, requests=2, max_tokens=8, warmup=0)
        target = DaemonTarget("d", endpoint[0])
        run = asyncio.run(run_benchmark([target], config, PromptBook(0, 40)))
    finally:
        stop.set()
        thread.join(5)
    assert run.targets[0]["model"] == "fake-model" and run.targets[0]["kind"] == "daemon"
    assert [m.messages[0]["role"] for m in received] == ["user", "user"] and received[0].chat is True
    assert received[0].sampling.temperature == 0.0
    assert run.batches[0].samples[0].text == "ab" * 4  # the chunks' text
    summary = run.batches[0].summary
    assert summary["errors"] == 0 and summary["completion_tokens"] == 16
    assert summary["drafted"] == 10 and summary["accepted"] == 6
    # Figures present, not timed (a busy machine moves them; timings belong in benchmarks).
    assert 0 < summary["ttft_p50_s"] <= summary["latency_p50_s"] and summary["itl_p50_s"] >= 0


def test_cli_out_writes_json_markdown_and_plots(tmp_path):
    log: list = []
    with StubServer("A", log, ttft_s=0.01, itl_s=0.002) as a, StubServer("B", log, ttft_s=0.01, itl_s=0.012) as b:
        result = CliRunner().invoke(
            bench_main,
            [
                "--target",
                f"A={a.url}",
                "--target",
                f"B={b.url}",
                "--baseline",
                "B",
                "--concurrency",
                "1,2",
                "--requests",
                "2",
                "--rounds",
                "2",
                "--max-tokens",
                "4",
                "--prompt-tokens",
                "30",
                "--prompt-style",
                "plain",
                "--prompt-style",
                "copy",
                "--target-model",
                "B=default_model",
                "--out",
                str(tmp_path / "out"),
            ],
        )
    assert result.exit_code == 0, result.output + repr(result.exception)
    out = tmp_path / "out"
    results = json.loads((out / "results.json").read_text())
    assert results["baseline"] == "B" and [t["name"] for t in results["targets"]] == ["A", "B"]
    assert [t["model"] for t in results["targets"]] == ["stub-A", "default_model"]
    assert {body["model"] for name, _, body in log if name == "B"} == {"default_model"}
    assert {"cpu", "cores", "memory", "mlx", "blas", "scheduling"} <= set(results["machine"])
    assert results["command"]
    assert len(results["batches"]) == 2 * 2 * 2 * 2
    assert all(len(batch["samples"]) == 2 and batch["samples"][0]["token_times_s"] for batch in results["batches"])
    assert {(c["style"], c["concurrency"]) for c in results["summary"]} == {
        ("plain", 1),
        ("plain", 2),
        ("copy", 1),
        ("copy", 2),
    }
    assert all(row["target"] == "A" and row["ratio"]["median"] > 0 for row in results["ratios"])  # not timed
    text = (out / "results.md").read_text()
    assert "| style | c | target | aggregate tok/s |" in text and "relative to B" in text
    assert "throughput.png" in text
    assert results["format"] == "mlx-bench results 2" and "1 warm-up request(s) per target and prompt style" in text
    assert len(results["warmup_samples"]) == 2 * 2  # one of each style for each target
    earlier = markdown({**results, "format": "mlx-bench results 1"})  # a saved run from before warm-up per style
    assert "1 warm-up request(s) per target (first prompt style only)" in earlier
    for name in ("throughput.png", "speedup.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "aggregate tok/s" in result.output  # the rich table


def test_cli_serve_starts_the_server_on_a_free_port_and_stops_it(tmp_path):
    script = Path(__file__).resolve()
    command = f"{sys.executable} {script} --port {{port}}"
    result = CliRunner().invoke(
        bench_main,
        [
            "--serve",
            f"S={command}",
            "--concurrency",
            "1",
            "--requests",
            "1",
            "--rounds",
            "1",
            "--warmup",
            "0",
            "--max-tokens",
            "3",
            "--serve-timeout",
            "30",
            "--out",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 0, result.output + repr(result.exception)
    results = json.loads((tmp_path / "results.json").read_text())
    target = results["targets"][0]
    assert target["kind"] == "served" and target["model"] == "stub-served"
    assert "{port}" not in target["command"] and target["url"].split(":")[-1] in target["command"]
    assert results["summary"][0]["errors"] == 0 and results["summary"][0]["completion_tokens"] == 3
    assert "stub serving on" in Path(target["log"]).read_text()
    with pytest.raises(httpx.ConnectError):  # stopped: nothing listens any more
        httpx.get(target["url"] + "/v1/models", timeout=2.0)


@pytest.mark.skipif(not Path("/proc/self/environ").exists() or shutil.which("setsid") is None, reason="Linux /proc")
def test_cli_serve_also_stops_what_the_command_started_in_a_session_of_its_own(tmp_path):
    # as mlx-serve-http's autostarted daemon: a child in its own session, outside the command's process group
    script = Path(__file__).resolve()
    pid_file = tmp_path / "detached.pid"
    command = f"setsid sleep 120 & echo $! > {pid_file}; exec {sys.executable} {script} --port {{port}}"
    args = ["--serve", f"S={command}", "--concurrency", "1", "--requests", "1", "--rounds", "1", "--warmup", "0"]
    args += ["--max-tokens", "2", "--serve-timeout", "30", "--out", str(tmp_path)]
    result = CliRunner().invoke(bench_main, args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    detached = int(pid_file.read_text())
    deadline = time.monotonic() + 5.0
    while Path(f"/proc/{detached}").exists() and time.monotonic() < deadline:
        stat = Path(f"/proc/{detached}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if stat == "Z":
            break
        time.sleep(0.05)
    stat_path = Path(f"/proc/{detached}/stat")
    assert not stat_path.exists() or stat_path.read_text().rsplit(")", 1)[1].split()[0] == "Z"


def test_cli_refuses_bad_usage():
    runner = CliRunner()
    assert runner.invoke(bench_main, []).exit_code == 2
    assert "unique" in runner.invoke(bench_main, ["--target", "a=http://x", "--target", "a=http://y"]).output
    assert "{port}" in runner.invoke(bench_main, ["--serve", "a=python -m server"]).output
    assert "names no target" in runner.invoke(bench_main, ["--target", "a=http://x", "--target-model", "b=m"]).output
    assert "not a target" in runner.invoke(bench_main, ["--target", "a=http://x", "--baseline", "b"]).output
    assert "unknown style" in runner.invoke(bench_main, ["--target", "a=http://x", "--prompt-style", "poem"]).output
    failed = runner.invoke(bench_main, ["--target", "a=http://127.0.0.1:9", "--rounds", "1"])
    assert failed.exit_code == 1 and "v1/models" in failed.output


def test_duration_keeps_concurrency_requests_in_flight_until_time_is_up():
    log: list = []
    with StubServer("A", log, ttft_s=0.01, itl_s=0.002) as a:
        config = BenchConfig(concurrencies=[2], styles=["copy"], rounds=1, duration_s=0.2, max_tokens=3, warmup=0)
        run = asyncio.run(run_benchmark([HttpTarget("A", a.url)], config, PromptBook(0, 40)))
    batch = run.batches[0]
    assert batch.summary["requests"] >= 6 and batch.summary["errors"] == 0  # ~15 ms per request, 2 at once
    assert [s.index for s in batch.samples] == list(range(len(batch.samples)))
    assert batch.wall_s >= 0.2 and max(s.sent_at_s for s in batch.samples) < 0.2


def test_extract_and_agent_styles_run_like_the_others():
    config = BenchConfig(concurrencies=[1], styles=["extract", "agent"], rounds=1, requests=2, max_tokens=8, warmup=0)
    run, received = _with_fake_mlxd(
        lambda endpoint: asyncio.run(run_benchmark([DaemonTarget("d", endpoint)], config, PromptBook(0, 40)))
    )
    sent = [m.messages[0]["content"] for m in received]
    assert sent[0].startswith("Extract the") and sent[2].startswith("You are a coding agent")
    assert [batch.style for batch in run.batches] == ["extract", "agent"]
    assert all(batch.summary["errors"] == 0 for batch in run.batches)


def test_warm_up_sends_every_style_before_the_first_measured_batch():
    """A style's first measured batch must not be the first time the server sees that style (shared drafts,
    caches): the warm-up sends ``warmup`` requests of each style, none of them a measured prompt."""
    config = BenchConfig(
        concurrencies=[1], styles=["plain", "extract", "agent"], rounds=1, requests=1, max_tokens=4, warmup=2
    )
    book = PromptBook(0, 40)
    run, received = _with_fake_mlxd(
        lambda endpoint: asyncio.run(run_benchmark([DaemonTarget("d", endpoint)], config, book))
    )
    sent = [m.messages[0]["content"] for m in received]
    warm = [book.prompt(style, "warmup", 1, index) for style in config.styles for index in range(2)]
    assert sent[:6] == warm and len(run.warmup_samples) == 6
    assert sent[6:] == [book.prompt(style, "0", 1, 0) for style in config.styles]
    assert not set(warm) & set(sent[6:])
