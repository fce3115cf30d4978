"""One request's decode rate at each serving layer, side by side: the scheduler in this process, the daemon over
its socket, and the gateway over HTTP (a streamed chat reply).

Starts a daemon (``--model``) and an ``mlx-serve-http`` in front of it, and runs the daemon's core in this
process too (``mlxd_daemon.local``: the same scheduler and start-up tuning). Each round sends one greedy chat
request of ``--max-tokens`` tokens (speculation off, end of sequence ignored, prefix cache off) to each layer in
turn, the order reversed every other round. The rate is the tokens after the first over the time from the
first chunk to the last, so the prompt is left out. Prints each round and each layer's median tok/s and ms a
token: the differences are what the socket and the HTTP gateway add to a token (code_notes.md#stream-chunks).

Run: .venv/bin/python scripts/bench_serving_layers.py --model ../shared/models/smollm2-135m-instruct-q4
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mlxd_fast_blas import ensure_fast_blas  # noqa: E402

ensure_fast_blas()

import httpx  # noqa: E402

from bench_common import start_daemon, start_gateway, stop_daemon  # noqa: E402
from mlxd_daemon.local import local_client  # noqa: E402
from mlxd_protocol import Chunk, Client, Generate, Sampling, Speculative, new_request_id  # noqa: E402

MESSAGES = [{"role": "user", "content": "Write a long story about a dragon."}]


def protocol_rate(client, max_tokens: int) -> float:
    """Decode tok/s of one request through a protocol client (in process or over the socket)."""
    first, count, started = None, 0, 0.0
    request = Generate(
        new_request_id(),
        messages=MESSAGES,
        max_tokens=max_tokens,
        sampling=Sampling(),
        speculative=Speculative("none"),
        ignore_eos=True,
        cache_prompt=False,
    )
    for reply in client.generate(request):
        if isinstance(reply, Chunk):
            if first is None:
                first, started = len(reply.tokens), time.perf_counter()
            count += len(reply.tokens)
    return (count - first) / (time.perf_counter() - started)


def streamed_reply(http: httpx.Client, url: str, max_tokens: int) -> tuple[float, int]:
    """One streamed chat reply through a gateway (one content chunk a token): (decode tok/s from the first
    content chunk to the last, content chunks)."""
    body = {
        "messages": MESSAGES,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
        "cache_prompt": False,
        "speculative": {"kind": "none"},
    }
    started, count = None, 0
    with http.stream("POST", url + "/v1/chat/completions", json=body) as response:
        for line in response.iter_lines():
            if line.startswith("data: {") and '"content"' in line:
                count += 1
                if started is None:
                    started = time.perf_counter()
    return (count - 1) / (time.perf_counter() - started), count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--max-tokens", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    daemon, endpoint = start_daemon("--model", args.model)
    gateway, url = start_gateway(endpoint)
    rates: dict[str, list[float]] = {"in process": [], "socket": [], "http": []}
    try:
        with local_client(model=args.model) as local, Client(endpoint) as remote, httpx.Client(timeout=600) as http:
            layers = {
                "in process": lambda: protocol_rate(local, args.max_tokens),
                "socket": lambda: protocol_rate(remote, args.max_tokens),
                "http": lambda: streamed_reply(http, url, args.max_tokens)[0],
            }
            for measure in layers.values():
                measure()  # warm-up, not counted
            print(f"Model: {args.model}; {args.max_tokens} tokens a request, {args.rounds} rounds\n")
            print("| round | " + " | ".join(f"{name} tok/s" for name in layers) + " |")
            print("|---" * (len(layers) + 1) + "|")
            for round_ in range(args.rounds):
                order = list(layers) if round_ % 2 == 0 else list(layers)[::-1]
                for name in order:
                    rates[name].append(layers[name]())
                print(f"| {round_ + 1} | " + " | ".join(f"{rates[name][-1]:.1f}" for name in layers) + " |", flush=True)
        print()
        for name, values in rates.items():
            median = statistics.median(values)
            print(f"{name}: median {median:.1f} tok/s, {1000 / median:.2f} ms a token")
    finally:
        gateway.terminate()
        gateway.wait()
        stop_daemon(daemon, endpoint)


if __name__ == "__main__":
    main()
