"""The web UI's first paint and page weight, measured in headless Chromium (issue 39's goals: < 300 KB, < 1 s).

Starts mlxd on ``--model`` (default: the embedded model) and mlx-serve-http in front of it, then opens the chat
page ``/`` and the live view ``/ui/ticks`` in Debian's headless chromium through Selenium (chromedriver started
without ``LD_PRELOAD``, as tests/serve_http/test_web_ui.py does; nothing downloads a browser). Each round, for
each ``--busy`` level (that many streamed chat requests kept running on the server meanwhile) and each page:
one cold load (a fresh browser: new profile, no cache, new renderer) and ``--warm`` warm loads (the same browser
opens the page again, from ``about:blank``). Read from the browser's Performance API: first paint and first
contentful paint (``paint`` entries), DOMContentLoaded and the load event (the navigation entry), all in ms from
the navigation's start; and the page weight: the bytes of every file the page loads (the navigation entry and
its resources: body bytes and bytes on the wire with the headers). The page's API calls (``/v1/models``) are
listed apart; the live view's feed (``/ui/ticks/stream``) stays open and is not part of the weight.

Printed (and written to ``--out``): the weight of each page file by file, and median [min-max] over rounds of
each timing per page, load kind and busy level.

Run: chrt -f 1 .venv/bin/python scripts/bench_webui_paint.py --rounds 5 --warm 3 --busy 0,4 \\
         --out docs/benchmark_results/webui_first_paint.md
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from mlxd_fast_blas import ensure_fast_blas  # noqa: E402

ensure_fast_blas()  # the daemon started here inherits it; Chromium is started without it (new_browser)

from bench_common import command_line, machine_facts, start_daemon, start_gateway, stop_daemon  # noqa: E402

PAGES = {"chat": "/", "live view": "/ui/ticks"}
WEIGHT_GOAL_BYTES = 300 * 1024
FIRST_PAINT_GOAL_MS = 1000.0
BUSY_PROMPT = "Tell me a story about **code**:"  # the embedded model answers it with thousands of tokens
TIMINGS = ("files-received", "first-paint", "first-contentful-paint", "dom-content-loaded", "load")
# What the page reads in one go, read back after its load: paint entries, the navigation, every resource.
READ_PERFORMANCE = """
const paint = Object.fromEntries(performance.getEntriesByType('paint').map(e => [e.name, e.startTime]));
const nav = performance.getEntriesByType('navigation')[0];
return {
  paint,
  navigation: {name: nav.name, type: 'document', body: nav.decodedBodySize, wire: nav.transferSize,
               end: nav.responseEnd, dcl: nav.domContentLoadedEventEnd, load: nav.loadEventEnd},
  resources: performance.getEntriesByType('resource').map(e => ({
    name: e.name, type: e.initiatorType, body: e.decodedBodySize, wire: e.transferSize, end: e.responseEnd})),
};
"""
FILE_INITIATORS = ("link", "script", "css", "img", "other")  # fetch / xmlhttprequest: the page's API calls


def new_browser():
    """A fresh headless Chromium (new profile and cache), driven by Selenium; SystemExit without one."""
    binary = next((shutil.which(name) for name in ("chromium", "chromium-browser") if shutil.which(name)), None)
    driver_path = shutil.which("chromedriver")
    try:
        # imported here: only this benchmark and the browser tests need selenium
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        binary = None
    if binary is None or driver_path is None:
        raise SystemExit("needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(argument)
    options.add_argument("--window-size=1200,760")
    # not the OpenBLAS preload a benchmark may run under: Chromium started with it fails to open a session
    environment = {name: value for name, value in os.environ.items() if name != "LD_PRELOAD"}
    return webdriver.Chrome(service=Service(driver_path, env=environment), options=options)


def load_page(browser, url: str) -> dict:
    """Open ``url`` (Selenium returns after the load event) and read its timings and files once painted."""
    browser.get(url)
    deadline = time.monotonic() + 10
    while True:
        reading = browser.execute_script(READ_PERFORMANCE)
        if "first-contentful-paint" in reading["paint"] and reading["navigation"]["load"] > 0:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url}: no first contentful paint within 10 s: {reading['paint']}")
        time.sleep(0.05)
    if url.endswith("/"):  # the chat page's model list: its API call is listed too
        while not browser.execute_script("return document.body.dataset.ready"):
            time.sleep(0.02)
        reading = browser.execute_script(READ_PERFORMANCE)
    paint, navigation = reading["paint"], reading["navigation"]
    files = [navigation, *(entry for entry in reading["resources"] if entry["type"] in FILE_INITIATORS)]
    timings = {
        "files-received": max(entry["end"] for entry in files),
        "first-paint": paint.get("first-paint", paint["first-contentful-paint"]),
        "first-contentful-paint": paint["first-contentful-paint"],
        "dom-content-loaded": navigation["dcl"],
        "load": navigation["load"],
    }
    return {"timings": timings, "entries": [navigation, *reading["resources"]]}


class BusyServer:
    """``count`` streamed chat requests kept running on the gateway (each one restarted when it ends)."""

    def __init__(self, url: str, count: int, max_tokens: int) -> None:
        self.url, self.count, self.max_tokens = url, count, max_tokens
        self.stop = threading.Event()
        self.streaming = threading.Semaphore(0)  # released once per request at its first chunk
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(count)]

    def run(self) -> None:
        body = {"messages": [{"role": "user", "content": BUSY_PROMPT}], "max_tokens": self.max_tokens}
        body |= {"temperature": 0.8, "stream": True}
        first = True
        with httpx.Client(base_url=self.url, timeout=120) as client:
            while not self.stop.is_set():
                with client.stream("POST", "/v1/chat/completions", json=body) as response:
                    for line in response.iter_lines():
                        if first and line.startswith("data: "):
                            first = False
                            self.streaming.release()
                        if self.stop.is_set():
                            break  # leaving the stream cancels the generation

    def __enter__(self) -> BusyServer:
        for thread in self.threads:
            thread.start()
        for _ in range(self.count):
            if not self.streaming.acquire(timeout=120):
                raise RuntimeError("the busy requests did not start streaming")
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)


def weight_rows(page: str, entries: list[dict]) -> tuple[list[str], int, int]:
    """Markdown rows of a page's files and API calls; (rows, file bytes, file bytes on the wire)."""
    rows, body, wire = [], 0, 0
    for entry in entries:
        path = "/" + entry["name"].split("/", 3)[3] if entry["name"].count("/") >= 3 else entry["name"]
        if entry["type"] == "document" or entry["type"] in FILE_INITIATORS:
            body, wire = body + entry["body"], wire + entry["wire"]
            rows.append(f"| {page} | `{path}` | {entry['type']} | {entry['body']} | {entry['wire']} |")
        else:
            rows.append(
                f"| {page} | `{path}` (API call, not counted) | {entry['type']} | {entry['body']} | {entry['wire']} |"
            )
    rows.append(f"| {page} | **all files** | | **{body}** ({body / 1024:.1f} KB) | **{wire}** |")
    return rows, body, wire


def spread_ms(values: list[float]) -> str:
    return f"{statistics.median(values):.0f} [{min(values):.0f}-{max(values):.0f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded", help="the daemon's model (default: the embedded model)")
    parser.add_argument("--rounds", type=int, default=5, help="cold loads of each page per busy level")
    parser.add_argument("--warm", type=int, default=3, help="warm loads after each cold one")
    parser.add_argument("--busy", default="0,4", help="streamed requests running meanwhile, comma-separated")
    parser.add_argument("--busy-max-tokens", type=int, default=256, help="max_tokens of each busy request")
    parser.add_argument("--out", type=Path, help="also write the results (Markdown) here")
    args = parser.parse_args()
    levels = [int(n) for n in args.busy.split(",")]
    daemon, endpoint = start_daemon("-m", args.model, "--max-batch", str(max(8, *levels)))
    gateway, url = start_gateway(endpoint)
    samples: dict[tuple[str, str, int], dict[str, list[float]]] = {}
    weights: dict[str, list[dict]] = {}
    browser_version = "?"
    try:
        for number in range(args.rounds):
            for busy in levels:
                with BusyServer(url, busy, args.busy_max_tokens):
                    for page, path in PAGES.items():
                        browser = new_browser()
                        try:
                            browser_version = browser.capabilities.get("browserVersion", "?")
                            for kind in ["cold"] + ["warm"] * args.warm:
                                if kind == "warm":
                                    browser.get("about:blank")
                                reading = load_page(browser, url + path)
                                weights.setdefault(page, reading["entries"])
                                into = samples.setdefault((page, kind, busy), {name: [] for name in TIMINGS})
                                for name in TIMINGS:
                                    into[name].append(reading["timings"][name])
                        finally:
                            browser.quit()
            print(f"round {number + 1}/{args.rounds} done", file=sys.stderr)
    finally:
        gateway.terminate()
        gateway.wait(timeout=20)
        stop_daemon(daemon, endpoint)
    facts = machine_facts()
    lines = [
        "# The web UI's first paint and page weight (headless Chromium)",
        "",
        f"Command: `{command_line()}`",
        "",
        "Machine: " + ", ".join(f"{key} {value}" for key, value in facts.items()) + f"; Chromium {browser_version}",
        "",
        f"Model: {args.model}. {args.rounds} rounds; in each, for every busy level (streamed chat requests running "
        f"on the server meanwhile, max_tokens {args.busy_max_tokens}) and page: a cold load (a fresh browser) and "
        f"{args.warm} warm loads (the same browser, from about:blank). Goals (issue 39): page weight under 300 KB, "
        "first paint under 1 s.",
        "",
        "## Page weight",
        "",
        "Every file each page loads, from the browser's resource timing: body bytes and bytes on the wire (with "
        "the response headers; no compression). The page's API calls are listed but not counted; the live view's "
        "feed (`/ui/ticks/stream`, SSE) stays open and is not counted either.",
        "",
        "| page | file | loaded as | bytes | on the wire |",
        "|---|---|---|---|---|",
    ]
    heaviest = 0
    for page, entries in weights.items():
        rows, body, _ = weight_rows(page, entries)
        lines += rows
        heaviest = max(heaviest, body)
    lines += [
        "",
        "## Timings",
        "",
        "ms from the navigation's start; median [min-max] over every load of that kind (cold: one per round; "
        "warm: `--warm` per round). Files received: the last byte of the page's last file (document, style "
        "sheet, scripts).",
        "",
        "| page | load | busy requests | loads | files received | first paint | first contentful paint "
        "| DOMContentLoaded | load event |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    slowest_paint = 0.0
    for (page, kind, busy), values in samples.items():
        cells = " | ".join(spread_ms(values[name]) for name in TIMINGS)
        lines.append(f"| {page} | {kind} | {busy} | {len(values['first-paint'])} | {cells} |")
        slowest_paint = max(slowest_paint, statistics.median(values["first-paint"]))
    lines += [
        "",
        f"Heaviest page: {heaviest} bytes ({'under' if heaviest < WEIGHT_GOAL_BYTES else 'over'} the 300 KB goal); "
        f"slowest median first paint: {slowest_paint:.0f} ms "
        f"({'under' if slowest_paint < FIRST_PAINT_GOAL_MS else 'over'} the 1 s goal).",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
