"""Soak test: mixed requests at a fixed concurrency against a gateway and daemon this script starts.

    python scripts/soak.py [--duration 300] [--concurrency 16] [-m PATH] [--no-chat] [--out soak.json]

Starts its own ``mlxd`` (prompt-lookup drafting, on a private ipc endpoint) and ``mlx-serve-http`` in
front of it, then runs workers that each send one request after another until the time is up: plain,
copy (the answer repeats the prompt, where prompt lookup drafts) and per-request prompt-lookup
requests, streaming and not, on /v1/completions and /completion (and /v1/chat/completions when the
model has a chat template). About one streaming request in eight is cancelled on purpose: the client
closes the stream after the first event. Every request has a timeout.

Checks at the end (exit 1 if one fails): every request completed or was cancelled on purpose, no
error, no hung request, the daemon idle with no KV slot or block still held, and its file descriptors
back to where they started (small slack). Prints a summary; writes it as JSON with ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
EMBEDDED = ROOT / "models" / "mlxd-qwen3-tiny"
FD_SLACK = 8

WORDS = (
    "the cat sat on the mat and the dog ran to the park where a little girl played with a red ball "
    "under a tall tree while the sun was shining"
).split()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_daemon(model: str, endpoint: str) -> subprocess.Popen:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlxd_daemon",
            "-m",
            model,
            "--endpoint",
            endpoint,
            "--draft-kind",
            "prompt-lookup",
            "--max-batch",
            "8",
            "--log-level",
            "warning",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    line = process.stdout.readline()
    if not line.startswith("mlxd ready"):
        process.kill()
        raise SystemExit(f"soak: mlxd did not start: {line!r}")
    return process


def daemon_status(endpoint: str) -> dict:
    """``mlxd status --json`` on the daemon's endpoint."""
    result = subprocess.run(
        [sys.executable, "-m", "mlxd_daemon", "status", "--endpoint", endpoint, "--json"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if result.returncode != 0:
        raise RuntimeError(f"mlxd status failed: {result.stderr}")
    return json.loads(result.stdout)


def start_gateway(endpoint: str, port: int) -> subprocess.Popen:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlxd_cli.serve_http.main",
            "--daemon",
            endpoint,
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    process.kill()
    raise SystemExit("soak: mlx-serve-http did not become healthy")


def make_request(rng: random.Random, chat: bool, max_tokens: int) -> tuple[str, str, dict]:
    """(kind, path, body) of one random request."""
    kind = rng.choice(("plain", "copy", "prompt-lookup"))
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 24)))
    if kind == "copy":
        prompt = f"{text}. Repeat: {text}. Again: {text}."
    else:
        prompt = text
    stream = rng.random() < 0.5
    extra = {"speculative": {"kind": "prompt-lookup"}} if kind == "prompt-lookup" else {}
    routes = ["completions", "completion"] + (["chat"] if chat else [])
    route = rng.choice(routes)
    if route == "completion":
        return kind, "/completion", {"prompt": prompt, "n_predict": max_tokens, "stream": stream, **extra}
    if route == "chat":
        return (
            kind,
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "stream": stream, **extra},
        )
    return kind, "/v1/completions", {"prompt": prompt, "max_tokens": max_tokens, "stream": stream, **extra}


async def one_request(
    client: httpx.AsyncClient,
    rng: random.Random,
    chat: bool,
    max_tokens: int,
    cancel_rate: float,
    timeout_s: float,
    counts: Counter,
    errors: list,
) -> None:
    kind, path, body = make_request(rng, chat, max_tokens)
    cancel = body["stream"] and rng.random() < cancel_rate
    counts[f"kind:{kind}"] += 1
    try:
        async with asyncio.timeout(timeout_s):
            if not body["stream"]:
                response = await client.post(path, json=body)
                if response.status_code != 200:
                    raise RuntimeError(f"{path} {response.status_code}: {response.text[:200]}")
                counts["completed"] += 1
                return
            async with client.stream("POST", path, json=body) as response:
                if response.status_code != 200:
                    raise RuntimeError(f"{path} {response.status_code}: {(await response.aread())[:200]!r}")
                async for line in response.aiter_lines():
                    if '"error"' in line and line.startswith("data: "):
                        raise RuntimeError(f"{path} error event: {line[:200]}")
                    if cancel and line.startswith("data: "):
                        counts["cancelled_on_purpose"] += 1
                        return  # leaving the block closes the stream: the gateway cancels
                counts["completed"] += 1
    except TimeoutError:
        counts["hung"] += 1
        errors.append(f"{path}: no answer within {timeout_s} s")
    except Exception as error:  # noqa: BLE001 - counted and reported
        counts["errors"] += 1
        errors.append(f"{type(error).__name__}: {error}")


async def run_load(
    url: str, duration_s: float, concurrency: int, chat: bool, max_tokens: int, seed: int, timeout_s: float
) -> tuple[Counter, list]:
    counts: Counter = Counter()
    errors: list = []
    deadline = time.monotonic() + duration_s
    limits = httpx.Limits(max_connections=concurrency * 2)
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s, limits=limits) as client:

        async def worker(index: int) -> None:
            rng = random.Random(seed * 1000 + index)
            while time.monotonic() < deadline:
                counts["sent"] += 1
                await one_request(client, rng, chat, max_tokens, 0.125, timeout_s, counts, errors)

        await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return counts, errors


def wait_idle(endpoint: str, within_s: float = 10.0) -> dict:
    """The daemon's status once nothing is active or queued (cancellations settle within a tick or two)."""
    deadline = time.monotonic() + within_s
    while True:
        status = daemon_status(endpoint)
        if (status["active"] == 0 and status["queued"] == 0) or time.monotonic() > deadline:
            return status
        time.sleep(0.2)


def kv_leaks(kv: dict) -> str | None:
    if "slots_free" in kv and kv["slots_free"] != kv["slots"]:
        return f"{kv['slots'] - kv['slots_free']} KV slots still held"
    held = kv.get("blocks_used", 0) - kv.get("blocks_cache_only", 0)  # the prefix cache's own blocks are not a leak
    if held:
        return f"{held} KV blocks still held"
    return None


def soak(
    model: str, duration_s: float, concurrency: int, chat: bool | None, max_tokens: int, seed: int, timeout_s: float
) -> dict:
    directory = Path(tempfile.mkdtemp(prefix="mlxd-soak-", dir="/tmp"))
    directory.chmod(0o700)
    endpoint = f"ipc://{directory}/d.sock"
    daemon = start_daemon(model, endpoint)
    gateway = None
    try:
        status = daemon_status(endpoint)
        process = psutil.Process(status["pid"])
        if chat is None:
            chat = (
                Path(model, "tokenizer_config.json").is_file()
                and "chat_template" in Path(model, "tokenizer_config.json").read_text()
            )
        port = free_port()
        gateway = start_gateway(endpoint, port)
        # one warm-up request, so start figures include the model's first allocations
        httpx.post(f"http://127.0.0.1:{port}/completion", json={"prompt": "warm up", "n_predict": 4}, timeout=60)
        rss_start, fds_start = process.memory_info().rss, process.num_fds()
        started = time.monotonic()
        counts, errors = asyncio.run(
            run_load(f"http://127.0.0.1:{port}", duration_s, concurrency, chat, max_tokens, seed, timeout_s)
        )
        elapsed = time.monotonic() - started
        end = wait_idle(endpoint)
        rss_end, fds_end = process.memory_info().rss, process.num_fds()
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code
    finally:
        if gateway is not None:
            gateway.terminate()
            gateway.wait(timeout=15)
        subprocess.run(
            [sys.executable, "-m", "mlxd_daemon", "stop", "--endpoint", endpoint], capture_output=True, timeout=30
        )
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
        shutil.rmtree(directory, ignore_errors=True)
    accounted = counts["completed"] + counts["cancelled_on_purpose"]
    failures = []
    if counts["errors"]:
        failures.append(f"{counts['errors']} requests failed")
    if counts["hung"]:
        failures.append(f"{counts['hung']} requests hung")
    if accounted != counts["sent"]:
        failures.append(f"{counts['sent'] - accounted} requests neither completed nor cancelled on purpose")
    if end["active"] or end["queued"]:
        failures.append(f"daemon not idle at the end: active {end['active']}, queued {end['queued']}")
    leak = kv_leaks(end["memory"]["kv"])
    if leak:
        failures.append(leak)
    if fds_end > fds_start + FD_SLACK:
        failures.append(f"daemon file descriptors grew from {fds_start} to {fds_end}")
    if health != 200:
        failures.append(f"/health answered {health} at the end")
    return {
        "model": model,
        "duration_s": round(elapsed, 1),
        "concurrency": concurrency,
        "chat": chat,
        "requests_sent": counts["sent"],
        "completed": counts["completed"],
        "cancelled_on_purpose": counts["cancelled_on_purpose"],
        "errors": counts["errors"],
        "hung": counts["hung"],
        "by_kind": {k.split(":", 1)[1]: v for k, v in counts.items() if k.startswith("kind:")},
        "requests_per_s": round(counts["sent"] / elapsed, 2) if elapsed else None,
        "rss_start_mib": round(rss_start / 2**20, 1),
        "rss_end_mib": round(rss_end / 2**20, 1),
        "fds_start": fds_start,
        "fds_end": fds_end,
        "kv_end": end["memory"]["kv"],
        "daemon_totals": end.get("totals"),
        "first_errors": errors[:10],
        "failures": failures,
        "ok": not failures,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--model", default=str(EMBEDDED), help="model directory (default: the embedded model)")
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of load")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per request")
    parser.add_argument("--timeout", type=float, default=60.0, help="per-request timeout in seconds")
    parser.add_argument("--chat", dest="chat", action="store_true", default=None, help="also send chat requests")
    parser.add_argument("--no-chat", dest="chat", action="store_false", help="only completion routes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write the summary as JSON here")
    args = parser.parse_args(argv)
    summary = soak(args.model, args.duration, args.concurrency, args.chat, args.max_tokens, args.seed, args.timeout)
    print(json.dumps(summary, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
