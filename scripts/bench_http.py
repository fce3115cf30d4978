"""B=1 tok/s over HTTP: mlx-serve-http (in front of mlxd) vs mlx-lm's own server, same model and prompts.

Each round sends every prompt to each server in turn (interleaved), once non-streaming and once
streaming, one request at a time, greedy, on /v1/completions. Non-streaming tok/s is completion
tokens / wall time of the request; streaming reports the time to the first token and the decode tok/s
after it (tokens - 1 over first-to-last chunk). Results are median [min-max] over rounds and prompts,
written to docs/benchmark_results/http_b1.md.

Run: .venv/bin/python scripts/bench_http.py [--model PATH] [--rounds 5] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mlxd_fast_blas import ensure_fast_blas  # noqa: E402

ensure_fast_blas()  # before starting anything: both servers inherit the same BLAS through LD_PRELOAD

import httpx  # noqa: E402

from bench_common import (  # noqa: E402
    ROOT,
    command_line,
    free_port,
    machine_facts,
    spread,
    start_daemon,
    stop_daemon,
    wait_ready,
)

PROMPTS = [
    "The Python standard library contains built-in modules that provide access to system functionality such as",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "Repeat the following paragraph exactly: The quick brown fox jumps over the lazy dog near the river bank.",
]


# Both servers honour OpenAI's logit_bias: pushing the end-of-sequence ids down makes every reply run to
# max_tokens, so the two servers decode the same number of tokens (set in main from the model's config).
NO_EOS: dict[str, float] = {}


def non_streaming(http: httpx.Client, prompt: str, max_tokens: int) -> dict:
    started = time.perf_counter()
    response = http.post(
        "/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "logit_bias": NO_EOS}
    )
    wall = time.perf_counter() - started
    response.raise_for_status()
    tokens = response.json()["usage"]["completion_tokens"]
    return {"tokens": tokens, "tok_s": tokens / wall}


def streaming(http: httpx.Client, prompt: str, max_tokens: int) -> dict:
    body = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "logit_bias": NO_EOS,
    }
    started = time.perf_counter()
    first = last = None
    chunks, usage_tokens = 0, None
    with http.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                usage_tokens = event["usage"]["completion_tokens"]
            if any(choice.get("text") for choice in event.get("choices", [])):
                now = time.perf_counter()
                first = first or now
                last = now
                chunks += 1
    tokens = usage_tokens if usage_tokens is not None else chunks
    decode_s = (last - first) if first and last and last > first else float("nan")
    return {
        "tokens": tokens,
        "ttft_ms": ((first or started) - started) * 1000,
        "tok_s": (tokens - 1) / decode_s if tokens > 1 else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "models" / "mlxd-qwen3-tiny"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--output", default=str(ROOT / "docs" / "benchmark_results" / "http_b1.md"))
    args = parser.parse_args()
    eos = json.loads((Path(args.model) / "config.json").read_text()).get("eos_token_id", [])
    NO_EOS.update({str(token): -100.0 for token in (eos if isinstance(eos, list) else [eos])})

    daemon, endpoint = start_daemon("-m", args.model, "--max-batch", "8")
    gateway_port, mlx_lm_port = free_port(), free_port()
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "env": dict(os.environ)}
    gateway = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlxd_cli.serve_http.main",
            "--daemon",
            endpoint,
            "--port",
            str(gateway_port),
            "--log-level",
            "warning",
        ],
        **quiet,
    )
    mlx_lm = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlx_lm",
            "server",
            "--model",
            args.model,
            "--port",
            str(mlx_lm_port),
            "--log-level",
            "WARNING",
        ],
        **quiet,
    )
    servers = {
        "mlx-serve-http + mlxd": f"http://127.0.0.1:{gateway_port}",
        "mlx_lm.server": f"http://127.0.0.1:{mlx_lm_port}",
    }
    results: dict[tuple[str, str], list[dict]] = {}
    try:
        wait_ready(servers["mlx-serve-http + mlxd"], "/health", gateway)
        wait_ready(servers["mlx_lm.server"], "/v1/models", mlx_lm)
        clients = {name: httpx.Client(base_url=url, timeout=600) for name, url in servers.items()}
        for http in clients.values():  # warm-up: first requests compile kernels and fill caches
            non_streaming(http, PROMPTS[0], 8)
        for round_index in range(args.rounds):
            for prompt in PROMPTS:
                for name, http in clients.items():
                    results.setdefault((name, "non-streaming"), []).append(non_streaming(http, prompt, args.max_tokens))
                    results.setdefault((name, "streaming"), []).append(streaming(http, prompt, args.max_tokens))
            print(f"round {round_index + 1}/{args.rounds} done", file=sys.stderr)
    finally:
        for process in (gateway, mlx_lm):
            process.terminate()
            process.wait(timeout=30)
        stop_daemon(daemon, endpoint)
    write_report(Path(args.output), args, results)


def write_report(path: Path, args, results: dict[tuple[str, str], list[dict]]) -> None:
    facts = machine_facts()
    lines = [
        "# B=1 over HTTP: mlx-serve-http + mlxd vs mlx_lm.server",
        "",
        f"Command: `{command_line()}`",
        "",
        f"Model `{Path(args.model).name}`; {len(PROMPTS)} prompts, {args.rounds} interleaved rounds, "
        f"max_tokens {args.max_tokens}, greedy, one request at a time on `/v1/completions`.",
        f"Machine: {facts['cpu']}, {facts['cores']} cores, {facts['memory']}; mlx {facts['mlx']} on "
        f"{facts['device']}; BLAS {facts['blas']}; Python {facts['python']}.",
        "",
        "| server | mode | tok/s median [min-max] | TTFT ms median [min-max] | tokens per reply |",
        "|---|---|---|---|---|",
    ]
    for (name, mode), samples in results.items():
        ttft = spread([s["ttft_ms"] for s in samples]) if mode == "streaming" else "-"
        tokens = sorted({s["tokens"] for s in samples})
        lines.append(
            f"| {name} | {mode} | {spread([s['tok_s'] for s in samples])} | {ttft} | {', '.join(map(str, tokens))} |"
        )
    lines += [
        "",
        "Non-streaming tok/s counts the whole request (prefill included); streaming tok/s is the "
        "decode rate after the first token. End-of-sequence ids get a logit bias of -100 on both "
        "servers (OpenAI's logit_bias), so every reply is max_tokens long.",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
