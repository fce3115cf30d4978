"""Helpers shared by the benchmark scripts: daemons on private endpoints, gateways on free ports, spreads, machine
facts."""

from __future__ import annotations

import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from mlxd_protocol import Client, Done, Generate, Sampling, Speculative, new_request_id

ROOT = Path(__file__).resolve().parent.parent


def start_daemon(*args: str) -> tuple[subprocess.Popen, str]:
    directory = Path(tempfile.mkdtemp(prefix="mlxd-b-", dir="/tmp"))
    directory.chmod(0o700)
    endpoint = f"ipc://{directory}/d.sock"
    process = subprocess.Popen(
        [sys.executable, "-m", "mlxd_daemon", "--endpoint", endpoint, "--log-level", "warning", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    line = process.stdout.readline()
    if not line.startswith("mlxd ready"):
        process.kill()
        raise RuntimeError(f"daemon did not start: {line!r}")
    with Client(endpoint, timeout_s=5) as client:
        deadline = time.monotonic() + 60
        while not client.ping(0.5):
            if time.monotonic() > deadline:
                raise RuntimeError("daemon did not answer")
    return process, endpoint


def stop_daemon(process: subprocess.Popen, endpoint: str) -> None:
    try:
        with Client(endpoint, timeout_s=5) as client:
            client.shutdown()
        process.wait(timeout=20)
    except Exception:  # noqa: BLE001
        process.kill()
    shutil.rmtree(Path(endpoint.removeprefix("ipc://")).parent, ignore_errors=True)  # the private folder


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_ready(url: str, path: str, process: subprocess.Popen, timeout_s: float = 300) -> None:
    """Wait until ``url + path`` answers 200; RuntimeError when ``process`` exits first or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url}: the server exited with {process.returncode}")
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} did not become ready")


def start_gateway(endpoint: str, timeout_s: float = 60, pythonpath: str | None = None) -> tuple[subprocess.Popen, str]:
    """mlx-serve-http in front of ``endpoint`` on a free port; (process, base URL) once /health answers 200
    (the process killed and RuntimeError when it does not within ``timeout_s``). ``pythonpath``: run the code
    found there first (another commit's worktree) instead of this checkout's."""
    port = free_port()
    command = [sys.executable, "-m", "mlxd_cli.serve_http.main", "--port", str(port), "--daemon", endpoint]
    env = {**os.environ, "PYTHONPATH": pythonpath} if pythonpath else None
    process = subprocess.Popen(
        [*command, "--log-level", "warning"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, "/health", process, timeout_s)
    except RuntimeError:
        process.kill()
        raise
    return process, url


def spread(values: list[float]) -> str:
    """median [min-max] with one decimal; "-" when the variant did not run here (e.g. no OpenBLAS)."""
    if not values:
        return "-"
    return f"{statistics.median(values):.1f} [{min(values):.1f}-{max(values):.1f}]"


def ratio_spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


def machine_facts() -> dict:
    import mlx.core as mx

    from mlxd_fast_blas import blas_in_use

    try:
        import psutil

        memory = f"{psutil.virtual_memory().total / 2**30:.0f} GiB"
    except ImportError:
        memory = "?"
    return {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "memory": memory,
        "mlx": mx.__version__,
        "device": str(mx.default_device()),
        "blas": blas_in_use(),
        "python": platform.python_version(),
    }


def command_line() -> str:
    return " ".join(
        [
            Path(sys.argv[0]).relative_to(ROOT).as_posix() if Path(sys.argv[0]).is_absolute() else sys.argv[0],
            *sys.argv[1:],
        ]
    )


def serving_engine(model: str, rows: int = 8, max_kv: int = 4096, kv_dtype: str = "float32"):
    """The model loaded as mlxd serves it (the CPU weight rule) in an engine of ``rows`` slots and a
    ``max_kv``-token bound (keys and values kept as ``kv_dtype``: ``mlxd --kv-dtype``), its step settings
    tuned as mlxd does at start-up: the in-process benchmarks' engine. Returns (loaded, engine)."""
    from mlxd_daemon.model_setup import load_for_serving
    from mlxd_daemon.options import DaemonOptions
    from mlxd_daemon.step_tuning import tune_steps
    from mlxd_engine import Engine, parse_kv_dtype

    loaded = load_for_serving(DaemonOptions(model=model, max_batch=rows))
    engine = Engine(loaded, max_sequences=rows, max_kv_size=max_kv, kv_dtype=parse_kv_dtype(kv_dtype))
    tune_steps(engine)
    return loaded, engine


def record_rounds(rows: list, outcomes: list) -> list:
    """Each verify round's tokens recorded on its row (a script is its own update step). Returns ``outcomes``."""
    for row, outcome in zip(rows, outcomes):
        row.record(outcome.emitted)
    return outcomes


def prefilled_rows(engine, lengths: list[int], max_kv: int) -> list:
    """One prefilled sequence per length (row i's prompt: token ids (13 k + i) mod vocab), each with room to
    grow to ``max_kv`` tokens: the rows the in-process forward benchmarks time."""
    from mlxd_engine import SamplingParams, prefill_and_record

    vocab = engine.loaded.vocab_size
    seqs = []
    for row, length in enumerate(lengths):
        seq = engine.add_sequence([(13 * i + row) % vocab for i in range(length)], SamplingParams(), max_kv - length)
        while prefill_and_record(engine, seq) is None:
            pass
        seqs.append(seq)
    return seqs


def chat_batch(client, texts: list[str], max_tokens: int, lookup: bool, shared_drafts: bool) -> tuple[float, list]:
    """Send ``texts`` as chat requests at once (greedy, prefix cache off) and read their streams in turn, so
    the scheduler batches them as a server's; returns the wall seconds and each request's ``Done.timings``."""
    streams = [
        client.generate(
            Generate(
                new_request_id(),
                messages=[{"role": "user", "content": text}],
                max_tokens=max_tokens,
                sampling=Sampling(),
                speculative=Speculative("prompt-lookup" if lookup else "none"),
                shared_drafts=shared_drafts,
                cache_prompt=False,
            )
        )
        for text in texts
    ]
    last: list = [None] * len(streams)
    started = time.perf_counter()
    while any(stream is not None for stream in streams):
        for i, stream in enumerate(streams):
            if stream is not None:
                last[i] = next(stream, None) or last[i]
                if isinstance(last[i], Done):
                    streams[i] = None
    return time.perf_counter() - started, [done.timings for done in last]
