"""llama.cpp's own server test suite against mlx-serve-http + mlxd (``scripts/llama_cpp_server_suite.py``).

Fetches the suite (PyPI sdist of llama-cpp-python) and its requirements on first use, so it needs the
network once; skipped when PyPI cannot be reached and nothing is cached.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import llama_cpp_server_suite as suite  # noqa: E402
import llama_server_compat as compat  # noqa: E402

# A quick part of the suite (about 2 minutes here; the whole offline selection takes about 6: run the
# script without --files): every selected test of it passes, so a change that breaks one fails here.
# test_template.py holds /apply-template and --reasoning.
QUICK_FILES = ["test_tokenize.py", "test_basic.py", "test_ignore_eos.py", "test_metrics.py", "test_template.py"]
MIN_PASSING = 56  # all 56 selected (2 deselected: a split GGUF and an embedding model, not to be had offline)


def _pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


def test_launcher_refuses_an_unknown_flag_and_maps_the_known_ones():
    with pytest.raises(compat.UsageError, match="--lora"):
        compat.parse_llama_args(["--port", "1", "--lora", "x.gguf"])
    shifting = compat.parse_llama_args(["--context-shift"])
    assert "--context-shift" in compat.daemon_command(shifting, compat.STORIES_260K, "ipc:///tmp/x.sock")
    args = compat.parse_llama_args(["-c", "512", "-np", "2", "--seed=7", "-ngl", "99", "--jinja", "--metrics"])
    command = compat.daemon_command(args, compat.STORIES_260K, "ipc:///tmp/x.sock")
    assert "--context-shift" not in command  # off unless asked for, as llama-server's
    assert command[command.index("--max-kv-size") + 1] == "256" and command[command.index("--max-batch") + 1] == "2"
    assert command[command.index("--seed") + 1] == "7" and "99" not in command
    # llama-server's sampler defaults (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05), each overridable
    assert [command[command.index(flag) + 1] for flag in ("--temp", "--top-k", "--top-p", "--min-p")] == [
        "0.8",
        "40",
        "0.95",
        "0.05",
    ]
    greedy = compat.daemon_command(compat.parse_llama_args(["--temp", "0", "--top-k", "1"]), compat.STORIES_260K, "x")
    assert greedy[greedy.index("--temp") + 1] == "0" and greedy[greedy.index("--top-k") + 1] == "1"
    assert greedy.count("--top-k") == 1
    gateway = compat.gateway_args(args, "ipc:///tmp/x.sock")
    assert "--metrics" in gateway
    # llama-server's CORS defaults: any origin, echoed back with credentials
    assert gateway[gateway.index("--cors-origins") + 1] == "*" and "--cors-credentials" in gateway
    assert gateway[gateway.index("--cors-methods") + 1] == "GET, POST, DELETE, OPTIONS"
    assert gateway[gateway.index("--cors-headers") + 1] == "*"
    strict = compat.gateway_args(
        compat.parse_llama_args(["--cors-origins", "http://a.example", "--no-cors-credentials"]), "ipc:///tmp/x.sock"
    )
    assert strict[strict.index("--cors-origins") + 1] == "http://a.example" and "--no-cors-credentials" in strict
    # llama-server keeps its aliases in a sorted set, the first naming the model
    named = compat.gateway_args(compat.parse_llama_args(["--alias", "tiny, fim,code", "--tags", "chat"]), "ipc://x")
    assert named[named.index("--alias") + 1] == "code,fim,tiny" and named[named.index("--tags") + 1] == "chat"
    assert "--ui" in named and "--no-ui" in compat.gateway_args(compat.parse_llama_args(["--no-webui"]), "ipc://x")
    assert "--ui-mcp-proxy" not in named
    assert "--ui-mcp-proxy" in compat.gateway_args(compat.parse_llama_args(["--ui-mcp-proxy"]), "ipc://x")


def test_suite_runs_this_checkouts_launcher_on_a_free_port(tmp_path):
    # the cache is shared by every checkout: each has its own wrapper, so concurrent runs cannot swap launchers
    wrapper = suite.launcher_wrapper(tmp_path)
    assert wrapper.name.startswith("llama-server-") and wrapper.name != "llama-server"
    assert (
        str(ROOT / "scripts" / "llama_server_compat.py") in wrapper.read_text()
        and sys.executable in wrapper.read_text()
    )
    assert suite.launcher_wrapper(tmp_path) == wrapper and len(list(tmp_path.iterdir())) == 1
    port = suite.free_port()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port))  # nothing held it


def test_each_xdist_worker_starts_its_servers_on_a_port_of_its_own(monkeypatch):
    assert suite.suite_workers({"MLXD_SUITE_WORKERS": "3"}) == 3
    assert suite.suite_workers({"MLXD_SUITE_WORKERS": "0"}) == 1
    monkeypatch.setattr(suite.os, "cpu_count", lambda: 64)
    assert suite.suite_workers({}) == suite.MAX_WORKERS

    class ServerProcess:  # the suite's utils.ServerProcess: its port from $PORT, set per worker by its conftest
        def __init__(self):
            self.server_port = 8080

    class ServerPreset:
        @staticmethod
        def load_all():
            raise AssertionError("the model-download warm-up must not run")

    utils = type(sys)("utils")
    utils.ServerProcess, utils.ServerPreset = ServerProcess, ServerPreset
    monkeypatch.setitem(sys.modules, "utils", utils)
    monkeypatch.setenv(suite.WORKER_PORTS, "41001,41002")
    config = type("Config", (), {"workerinput": {"workerid": "gw1"}})()
    suite.pytest_configure(config)
    utils.ServerPreset.load_all()
    assert ServerProcess().server_port == 41002


def test_suite_runs_this_checkouts_packages():
    # the interpreter's own install may be another checkout's: the suite's servers must import this one's
    path = suite.suite_env({})["PYTHONPATH"].split(":")
    assert path[:4] == [str(ROOT / part) for part in ("scripts", "packages", "daemon", "cli")]
    assert suite.suite_env({"PYTHONPATH": "/elsewhere"})["PYTHONPATH"].endswith(":/elsewhere")


@pytest.mark.slow
def test_llama_cpp_server_suite_keeps_its_passing_tests():
    archive = suite.cache_dir() / f"{suite.SDIST_NAME}.tar.gz"
    if not archive.exists() and not _pypi_reachable():
        pytest.skip("PyPI is not reachable and the llama.cpp suite is not cached")
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "llama_cpp_server_suite.py"), "--files", *QUICK_FILES],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    summary = re.search(r"(\d+) passed", result.stdout)
    assert summary, result.stdout[-3000:] + result.stderr[-3000:]
    assert int(summary.group(1)) >= MIN_PASSING, result.stdout[-6000:]
