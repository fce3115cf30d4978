"""Real daemons and a real mlx-serve-http process (uvicorn in a subprocess) for the HTTP tests."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from ..daemon.conftest import STORIES, private_endpoint, start_daemon, stop_daemon
from ..markers import mark_directory

ROOT = Path(__file__).resolve().parents[2]
EMBEDDED = ROOT / "models" / "mlxd-qwen3-tiny"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Gateway:
    """A running mlx-serve-http: its base URL, process, and an httpx client bound to it."""

    def __init__(
        self,
        daemons: list[str],
        *args: str,
        wait_healthy: bool = True,
        timeout_s: float = 60.0,
        env: dict[str, str] | None = None,
    ):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "mlxd_cli.serve_http.main", "--port", str(self.port), "--log-level", "warning"]
        for endpoint in daemons:
            command += ["--daemon", endpoint]
        self.process = subprocess.Popen(
            [*command, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})),
        )
        self.client = httpx.Client(base_url=self.url, timeout=120.0)
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"mlx-serve-http exited: {self.process.stdout.read()[-3000:]}")
            try:
                response = self.client.get("/health")
                if response.status_code == 200 or not wait_healthy:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("mlx-serve-http did not become healthy")
            time.sleep(0.2)

    def stop(self) -> None:
        self.client.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process.stdout.close()


def run_generate(endpoint: str, prompt: str, max_tokens: int, chat: bool) -> dict:
    """mlx-generate's greedy answer (--json) for the same prompt, as the reference."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlxd_cli.generate",
            "--endpoint",
            endpoint,
            "--no-autostart",
            "--json",
            "--chat" if chat else "--no-chat",
            "--temp",
            "0",
            "--max-tokens",
            str(max_tokens),
            prompt,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def sse_events(lines) -> list:
    """Parse ``data: ...`` SSE lines into JSON documents (``[DONE]`` kept as the string)."""
    events = []
    for line in lines:
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


@pytest.fixture(scope="session")
def stories_endpoint():
    """One stories260K daemon for the whole session (it loads in seconds)."""
    if not STORIES.is_dir():
        pytest.skip(f"{STORIES} is not present")
    endpoint = private_endpoint("h")
    process = start_daemon(endpoint, "-m", str(STORIES), "--max-batch", "8")
    yield endpoint
    stop_daemon(process, endpoint)


@pytest.fixture(scope="session")
def stories_gateway(stories_endpoint):
    gateway = Gateway([stories_endpoint])
    yield gateway
    gateway.stop()


@pytest.fixture(scope="session")
def templated_stories_endpoint(tmp_path_factory):
    """stories260K given a minimal chat template, so the chat path runs even without the embedded model."""
    if not STORIES.is_dir():
        pytest.skip(f"{STORIES} is not present")
    model = tmp_path_factory.mktemp("stories-chat")
    for source in STORIES.iterdir():
        shutil.copy(source, model / source.name)
        (model / source.name).chmod(0o644)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = (
        "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    )
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    endpoint = private_endpoint("c")
    process = start_daemon(endpoint, "-m", str(model), "--max-batch", "4")
    yield endpoint
    stop_daemon(process, endpoint)


@pytest.fixture(scope="session")
def templated_stories_gateway(templated_stories_endpoint):
    gateway = Gateway([templated_stories_endpoint])
    yield gateway
    gateway.stop()


@pytest.fixture(scope="session")
def embedded_endpoint():
    """A daemon on the embedded chat model; skipped while the model is not there yet (it is being trained)."""
    if not (EMBEDDED / "config.json").is_file() or not any(EMBEDDED.glob("*.safetensors")):
        pytest.skip(f"the embedded model is not in {EMBEDDED} yet (being trained); chat tests need its chat template")
    endpoint = private_endpoint("e")
    process = start_daemon(endpoint, "-m", str(EMBEDDED), "--max-batch", "4")
    yield endpoint
    stop_daemon(process, endpoint)


@pytest.fixture(scope="session")
def embedded_gateway(embedded_endpoint):
    gateway = Gateway([embedded_endpoint])
    yield gateway
    gateway.stop()


def pytest_collection_modifyitems(items):
    mark_directory(items, __file__, "integration")


# ---- the web UI in a real browser: Debian's headless Chromium, driven by Selenium ------------------------------

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
NO_BROWSER = (
    "no headless Chromium here: the web UI's browser tests need Debian's chromium and chromium-driver "
    "(apt-get install -y chromium chromium-driver) and the selenium package"
)


def find_browser() -> tuple[str, str] | None:
    """The Chromium binary and its chromedriver on PATH, or None (nothing is ever downloaded)."""
    binary = next((shutil.which(name) for name in CHROMIUM_NAMES if shutil.which(name)), None)
    driver = shutil.which("chromedriver")
    return (binary, driver) if binary and driver else None


@pytest.fixture
def browser(request, tmp_path):
    """A headless Chromium page (Selenium); a failed test leaves its screenshot under its tmp_path."""
    found = find_browser()
    if found is None:
        pytest.skip(NO_BROWSER)
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip(NO_BROWSER)
    options = webdriver.ChromeOptions()
    options.binary_location = found[0]
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(argument)
    options.add_argument("--window-size=1200,760")
    # Not the OpenBLAS preload `make test` runs the suite with: Chromium started with it fails to open a session.
    environment = {name: value for name, value in os.environ.items() if name != "LD_PRELOAD"}
    driver = webdriver.Chrome(service=Service(found[1], env=environment), options=options)
    driver.implicitly_wait(0)
    yield driver
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed:
        try:
            driver.save_screenshot(str(tmp_path / "failure.png"))
            (tmp_path / "failure.html").write_text(driver.page_source)
        except Exception:  # noqa: BLE001 - the browser itself may be what failed
            pass
    driver.quit()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """Keep the call phase's report on the test item (the ``browser`` fixture screenshots failures)."""
    report = yield
    if report.when == "call":
        item.report_call = report
    return report
