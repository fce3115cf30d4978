"""Run llama.cpp's own server test suite against mlx-serve-http + mlxd.

    .venv/bin/python scripts/llama_cpp_server_suite.py [--files test_basic.py ...] [-k EXPR]

Contract: at set-up time (nothing of llama.cpp is kept in this repository) it fetches the PyPI sdist of
llama-cpp-python ``SDIST_VERSION`` with pip into ``<cache>/llama-cpp-suite/`` (``<cache>``: $MLXD_CACHE_DIR,
else $XDG_CACHE_HOME/mlxd, else ~/.cache/mlxd), extracts ``vendor/llama.cpp/tools/server/tests`` and
the chat templates beside it (``vendor/llama.cpp/models/templates``, which the tests read by relative
path), builds a virtual environment with the suite's own ``requirements.txt``, and runs pytest there on
``OFFLINE_FILES``, with ``LLAMA_SERVER_BIN_PATH`` pointing at ``scripts/llama_server_compat.py`` (through
a small wrapper of this checkout's that runs it with this interpreter, this checkout's packages first on
its path; the servers listen on a free port, or on $PORT when set). The suite's tests run on as many pytest-xdist
workers (in its requirements) as the machine has cores, up to ``MAX_WORKERS`` ($MLXD_SUITE_WORKERS to choose):
a test mostly waits for its server to start, which takes one core, and each worker's servers listen on a
free port of their own. Tests in ``DESELECTED`` are
deselected, each for the reason given (a model or a mode that cannot run offline). Text sampled at
temperature > 0 is compared as the suite wrote it: the launcher has mlxd draw seeded requests as
llama.cpp's sampler does (``mlxd --sampler-rng llama.cpp``). It prints the pass / fail / deselect counts
and the deselected tests, and exits with pytest's status (non-zero when a test failed).

Loaded by that pytest as a plugin (``-p llama_cpp_server_suite``), this module also makes the suite's
session fixture ``ServerPreset.load_all`` (which starts every preset once, only to download its model)
a no-op: the models are local, and presets of other models cannot start offline.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SDIST_VERSION = "0.3.36"
SDIST_NAME = f"llama_cpp_python-{SDIST_VERSION}"
TESTS_IN_SDIST = f"{SDIST_NAME}/vendor/llama.cpp/tools/server/tests"
TEMPLATES_IN_SDIST = f"{SDIST_NAME}/vendor/llama.cpp/models/templates"
OFFLINE_FILES = [
    "test_basic.py",
    "test_chat_completion.py",
    "test_completion.py",
    "test_ctx_shift.py",
    "test_ignore_eos.py",
    "test_tokenize.py",
    "test_security.py",
    "test_metrics.py",
    "test_template.py",
]
MAX_WORKERS = 4
WORKER_PORTS = "MLXD_SUITE_WORKER_PORTS"  # the free port of each xdist worker, in worker order
_OFFLINE = "needs a hub model other than stories260K, which cannot be had offline"
_ROUTER = "router mode (a server without a model, loading models on demand), which mlxd does not have"
DESELECTED: dict[str, str] = {
    "test_basic.py::test_load_split_model": _OFFLINE + " (stories15M split GGUF)",
    "test_completion.py::test_completion_stream_with_openai_library_stops": _OFFLINE + " (Phi-3.5-mini)",
    "test_metrics.py::test_metrics_embedding_prompt_is_counted": _OFFLINE + " (bert-bge-small)",
    "test_security.py::test_local_media_file": _OFFLINE + " (tinygemma3)",
    "test_security.py::test_cors_origins_localhost_reflects": _ROUTER,
    "test_security.py::test_cors_origins_localhost_rejects": _ROUTER,
    "test_security.py::test_cors_origins_defaults_to_localhost_with_tools_enabled": _ROUTER,
}


def cache_dir() -> Path:
    """Where the sdist, the extracted suite and its virtual environment live."""
    if os.environ.get("MLXD_CACHE_DIR"):
        base = Path(os.environ["MLXD_CACHE_DIR"])
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mlxd"
    return base / "llama-cpp-suite"


def fetch_sdist(cache: Path) -> Path:
    """The sdist archive, downloaded once with pip (no build, no dependencies)."""
    archive = cache / f"{SDIST_NAME}.tar.gz"
    if not archive.exists():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"llama-cpp-python=={SDIST_VERSION}",
                "-d",
                str(cache),
            ],
            check=True,
        )
    return archive


def extract_suite(cache: Path, archive: Path) -> Path:
    """The suite's ``tests`` folder, extracted once (with the templates it reads by relative path)."""
    tests = cache / TESTS_IN_SDIST
    if not (tests / "utils.py").exists():
        with tarfile.open(archive) as tar:
            members = [
                member
                for member in tar.getmembers()
                if member.name.startswith((TESTS_IN_SDIST + "/", TEMPLATES_IN_SDIST + "/"))
            ]
            tar.extractall(cache, members=members, filter="data")
    return tests


def suite_python(cache: Path, tests: Path) -> Path:
    """A virtual environment with the suite's requirements (built once)."""
    venv = cache / "venv"
    python = venv / "bin" / "python"
    marker = venv / ".requirements-installed"
    if not marker.exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "-r", str(tests / "requirements.txt")], check=True)
        marker.write_text("ok\n")
    return python


def launcher_wrapper(cache: Path) -> Path:
    """An executable running the launcher with this interpreter (the suite executes the path it is given).

    One per checkout and interpreter (named by their hash): the cache is shared, and a run from another
    checkout rewriting a common wrapper would start that checkout's launcher in this run's tests."""
    launcher = ROOT / "scripts" / "llama_server_compat.py"
    text = f'#!/bin/sh\nexec "{sys.executable}" "{launcher}" "$@"\n'
    wrapper = cache / f"llama-server-{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    if not wrapper.exists() or wrapper.read_text() != text:
        wrapper.write_text(text)
        wrapper.chmod(0o755)
    return wrapper


def suite_env(environ: dict[str, str]) -> dict[str, str]:
    """``environ`` with this checkout's packages first on PYTHONPATH (and this script's folder, the plugin's):
    the interpreter's own install may be another checkout's (editable), and the servers must run this one."""
    parts = [str(ROOT / part) for part in ("scripts", "packages", "daemon", "cli")]
    return {**environ, "PYTHONPATH": os.pathsep.join([*parts, environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}


def free_port() -> int:
    """A TCP port nothing listens on now (the suite starts each of its servers on it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def suite_workers(environ: dict[str, str]) -> int:
    """How many pytest-xdist workers run the suite: $MLXD_SUITE_WORKERS, else the cores, at most MAX_WORKERS."""
    if environ.get("MLXD_SUITE_WORKERS"):
        return max(1, int(environ["MLXD_SUITE_WORKERS"]))
    return max(1, min(MAX_WORKERS, os.cpu_count() or 1))


def run_suite(files: list[str], keyword: str | None) -> int:
    cache = cache_dir()
    tests = extract_suite(cache, fetch_sdist(cache))
    python = suite_python(cache, tests)
    env = {**suite_env(dict(os.environ)), "LLAMA_SERVER_BIN_PATH": str(launcher_wrapper(cache))}
    env.setdefault("PORT", str(free_port()))  # the suite's port: not 8080, which a real server may hold, and not
    # a fixed one, which a run from another checkout may hold at the same time
    workers = suite_workers(env)
    command = [str(python), "-m", "pytest", "-p", "llama_cpp_server_suite", "-q", "-rfE", "--tb=line"]
    if workers > 1:
        # each worker's servers on a port of their own (the suite's conftest would give 8080 + 10 x worker)
        env[WORKER_PORTS] = ",".join(str(free_port()) for _ in range(workers))
        command += ["-n", str(workers)]
    command += [f"unit/{name}" for name in files]
    for test_id in DESELECTED:
        if test_id.split("::")[0] in files:
            command += ["--deselect", f"unit/{test_id}"]
    if keyword:
        command += ["-k", keyword]
    started = time.monotonic()
    result = subprocess.run(command, cwd=tests, env=env, capture_output=True, text=True)
    elapsed = time.monotonic() - started
    output = result.stdout + result.stderr
    print("\n".join(line for line in output.splitlines() if line.startswith(("FAILED", "ERROR"))))
    summary = next((line for line in reversed(output.splitlines()) if re.search(r"\d+ (passed|failed)", line)), "")
    print(f"\nllama.cpp server suite ({len(files)} files) in {elapsed:.0f} s: {summary.strip('= ')}")
    print(f"deselected ({sum(test_id.split('::')[0] in files for test_id in DESELECTED)}):")
    for test_id, reason in DESELECTED.items():
        if test_id.split("::")[0] in files:
            print(f"  {test_id}: {reason}")
    if result.returncode not in (0, 1):
        print(output[-4000:])
    return result.returncode


def pytest_configure(config) -> None:
    """As a pytest plugin: the suite's model-download warm-up starts nothing (see the module docstring)."""
    utils = sys.modules.get("utils")
    if utils is None:
        import utils  # the suite's own module, on its path once its conftest is loaded
    utils.ServerPreset.load_all = staticmethod(lambda: None)
    worker = getattr(config, "workerinput", {}).get("workerid")  # "gw0", "gw1", ... under pytest-xdist
    if worker is not None and os.environ.get(WORKER_PORTS):
        port = int(os.environ[WORKER_PORTS].split(",")[int(worker[2:])])
        start = utils.ServerProcess.__init__

        def on_own_port(self) -> None:
            start(self)
            self.server_port = port

        utils.ServerProcess.__init__ = on_own_port


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", nargs="+", default=OFFLINE_FILES, help="test files of the suite's unit/ folder")
    parser.add_argument("-k", dest="keyword", default=None, help="pytest -k expression")
    args = parser.parse_args()
    return run_suite(args.files, args.keyword)


if __name__ == "__main__":
    sys.exit(main())
