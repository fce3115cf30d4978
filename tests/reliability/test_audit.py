"""Source audit (no pickle / eval / exec) and no prompt text in info-level logs."""

from __future__ import annotations

import io
import subprocess
import sys
import tokenize
import uuid

import httpx
import pytest

from mlxd_protocol import Client, Generate, new_request_id
from tests.daemon.conftest import ROOT, STORIES, private_endpoint, start_daemon, stop_daemon
from tests.serve_http.conftest import free_port


def forbidden_uses(source: str) -> list[str]:
    """``pickle`` anywhere in code, or a call of the ``eval`` / ``exec`` builtins (``mx.eval`` is MLX array
    evaluation, not Python's eval: attribute calls are fine). Comments and strings are not code."""
    tokens = [
        t
        for t in tokenize.generate_tokens(io.StringIO(source).readline)
        if t.type not in (tokenize.COMMENT, tokenize.STRING, tokenize.NL, tokenize.NEWLINE)
    ]
    found = []
    for index, token in enumerate(tokens):
        if token.type != tokenize.NAME:
            continue
        if token.string == "pickle" or token.string in ("cPickle", "marshal"):
            found.append(f"{token.start[0]}: {token.string}")
        elif token.string in ("eval", "exec"):
            before = tokens[index - 1].string if index else ""
            after = tokens[index + 1].string if index + 1 < len(tokens) else ""
            if before != "." and after == "(":
                found.append(f"{token.start[0]}: {token.string}(")
    return found


def test_no_pickle_eval_or_exec_in_the_source():
    found = []
    for top in ("packages", "daemon", "cli"):
        for path in (ROOT / top).rglob("*.py"):
            found += [f"{path.relative_to(ROOT)}:{use}" for use in forbidden_uses(path.read_text())]
    assert not found, f"pickle / eval / exec in: {found}"
    assert forbidden_uses("import pickle\nx = eval(s)\n") and not forbidden_uses("mx.eval(a)  # eval(\n")


def test_prompts_are_not_logged_at_info(tmp_path):
    if not STORIES.is_dir():
        pytest.skip("stories260K is not present")
    marker = f"zebra{uuid.uuid4().hex[:12]}"
    endpoint = private_endpoint("l")
    daemon = start_daemon(endpoint, "-m", str(STORIES), "--log-level", "info")
    port = free_port()
    gateway_log = tmp_path / "gateway.log"
    with gateway_log.open("w") as sink:
        gateway = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mlxd_cli.serve_http.main",
                "--daemon",
                endpoint,
                "--port",
                str(port),
                "--log-level",
                "info",
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        with Client(endpoint, timeout_s=10) as client:
            replies = list(client.generate(Generate(id=new_request_id(), prompt=f"Once {marker}", max_tokens=4)))
            assert replies[-1].TYPE == "done"
        for _ in range(100):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            import time

            time.sleep(0.2)
        url = f"http://127.0.0.1:{port}"
        assert (
            httpx.post(f"{url}/completion", json={"prompt": f"Once {marker}", "n_predict": 4}, timeout=30).status_code
            == 200
        )
        assert (
            httpx.post(f"{url}/v1/completions", json={"prompt": marker, "max_tokens": 4}, timeout=30).status_code == 200
        )
        httpx.post(f"{url}/v1/completions", json={"prompt": marker, "max_tokens": -1}, timeout=30)  # a 400 too
    finally:
        gateway.terminate()
        gateway.wait(timeout=15)
        stop_daemon(daemon, endpoint)
    daemon_log = daemon.stderr.read()
    assert "model=" in daemon_log  # the info log is on
    assert marker not in daemon_log
    assert marker not in gateway_log.read_text()
