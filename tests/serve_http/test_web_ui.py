"""The web UI (``web_ui``): its files and headers over HTTP, and the chat page in headless Chromium.

The browser tests drive Debian's chromium with Selenium (the ``browser`` fixture skips, with one reason,
where there is none) against the embedded model's daemon: type a message, see the reply stream in with its
numbers, stop a long reply, reload and find the conversation, give the API key once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import threading
import time
from pathlib import Path

import pytest

from mlxd_cli.serve_http import tick_feed, web_ui
from mlxd_cli.serve_http.daemon_pool import DaemonHandle
from mlxd_protocol import Tick, TickRow

from .conftest import Gateway

PAGE_WEIGHT_LIMIT = 300 * 1024
LONG_PROMPT = "Tell me a story about **code**:"  # the embedded model answers it with thousands of tokens
# MLXD_WEBUI_SCREENSHOTS=docs/images: the browser tests leave a screenshot of each page there (the README's):
# the live view's here, the chat page's from test_web_ui_smollm2.py (a real model's answer)
SCREENSHOTS = Path(os.environ.get("MLXD_WEBUI_SCREENSHOTS", "/nonexistent"))


def wait_for(condition, timeout_s: float = 30.0, what: str = "the page"):
    """Poll ``condition()`` until it returns something true; that value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def open_page(browser, url: str):
    browser.get(url)
    wait_for(lambda: browser.execute_script("return document.body.dataset.ready"), what="the model list")


def set_field(browser, field: str, value: str) -> None:
    """Type into a settings field (opening the settings) and commit it (its change event)."""
    from selenium.webdriver.common.by import By

    if browser.find_element(By.ID, "settings").get_attribute("hidden") is not None:
        browser.find_element(By.ID, "settings-toggle").click()
    element = browser.find_element(By.ID, field)
    element.clear()
    element.send_keys(value)
    browser.execute_script("arguments[0].dispatchEvent(new Event('change'))", element)


def send(browser, text: str) -> None:
    from selenium.webdriver.common.by import By

    browser.find_element(By.ID, "input").send_keys(text + "\n")


def replies(browser) -> list[dict]:
    return browser.execute_script(
        "return Array.from(document.querySelectorAll('.message.assistant')).map(m => ({"
        "text: m.querySelector('.body').innerText, stats: m.querySelector('.stats').textContent}))"
    )


# ---- over HTTP ----------------------------------------------------------------------------------------------


def test_the_page_is_small_and_self_contained():
    weight = sum(len(content) for content in web_ui.FILES.values())
    assert weight < PAGE_WEIGHT_LIMIT, f"the web UI weighs {weight} bytes"
    for name, content in web_ui.FILES.items():
        text = content.decode()
        for reference in ('src="', 'href="', "url("):  # every script, style sheet and link is this server's
            assert reference + "http" not in text and reference + "//" not in text, (name, reference)
        assert "<script>" not in text and " on" + "click=" not in text, name  # no inline script (the CSP forbids it)
    assert {"index.html", "chat.js", "markdown.js", "api.js", "style.css"} <= set(web_ui.FILES)


def test_pages_and_assets_are_served_with_a_strict_policy(embedded_gateway):
    page = embedded_gateway.client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert '<meta name="mlxd-api-key" content="optional">' in page.text  # no --api-key: the page asks for none
    assert page.headers["x-content-type-options"] == "nosniff"
    script = embedded_gateway.client.get("/ui/assets/chat.js")
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    for path in ("/ui/assets/nothing.js", "/ui/assets/index.html", "/ui/assets/web_ui.py", "/ui/assets/a/b.js"):
        missing = embedded_gateway.client.get(path)
        assert missing.status_code == 404 and missing.json()["error"]["code"] in ("not_found", None), path


def test_no_webui_serves_none_of_it(embedded_endpoint):
    gateway = Gateway([embedded_endpoint], "--no-webui", "--api-key", "k")
    try:
        headers = {"Authorization": "Bearer k"}
        for path in ("/", "/ui/ticks", "/ui/assets/chat.js", "/manifest.webmanifest", "/_app/version.json"):
            assert gateway.client.get(path, headers=headers).status_code == 404, path
            assert gateway.client.get(path).status_code == 401, path  # and nothing is open without the key
        assert gateway.client.get("/props", headers=headers).json()["webui"] is False  # llama-server's UI check
        # a browser that kept llama-server's UI worker gets one that removes itself, with the UI off too
        worker = gateway.client.get("/sw.js")
        assert worker.status_code == 200 and worker.headers["content-type"].startswith("text/javascript")
        assert "registration.unregister()" in worker.text and "caches.delete" in worker.text
    finally:
        gateway.stop()


def test_the_files_are_open_but_the_api_needs_the_key(embedded_endpoint):
    gateway = Gateway([embedded_endpoint], "--api-key", "secret")
    try:
        # the files llama-server's UI assets are open too (llama.cpp's test_access_static_assets_without_api_key)
        for path in ("/", "/ui/assets/api.js", "/sw.js", "/manifest.webmanifest", "/_app/version.json"):
            assert gateway.client.get(path).status_code == 200, path
        for path in ("/", "/ui/ticks"):  # the pages say a key is needed (so they ask before any request), never which
            page = gateway.client.get(path).text
            assert '<meta name="mlxd-api-key" content="required">' in page and "secret" not in page, path
        assert gateway.client.get("/manifest.webmanifest").json()["start_url"] == "/"
        assert gateway.client.get("/_app/version.json").json()["version"].startswith("mlx-serve-http")
        assert gateway.client.get("/v1/models").status_code == 401
        assert gateway.client.get("/ui/assets/../v1/models").status_code == 401  # the client normalizes the path
    finally:
        gateway.stop()


def test_the_startup_log_prints_the_page_address(embedded_endpoint):
    gateway = Gateway([embedded_endpoint])
    try:
        gateway.process.terminate()
        output = gateway.process.communicate(timeout=15)[0]
    finally:
        gateway.stop()
    assert f"chat page at http://127.0.0.1:{gateway.port}/" in output


# ---- in the browser -----------------------------------------------------------------------------------------


def test_markdown_is_rendered_safely(browser, embedded_gateway):
    open_page(browser, embedded_gateway.url)
    html = browser.execute_script(
        "return mlxdMarkdown.render(arguments[0])",
        "**bold** <img src=x onerror=alert(1)> [a](javascript:alert(1)) [b](https://example.com)\n"
        "```html\n<script>alert(1)</script>\n```\n- item",
    )
    assert "<strong>bold</strong>" in html and "<img" not in html and "<script>" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html and "&lt;script&gt;" in html
    assert 'href="https://example.com"' in html and "javascript:" not in html.replace("[a](javascript:", "")
    assert '<div class="code">' in html and "<li>item</li>" in html


def test_a_streamed_reply_appears_and_the_conversation_survives_a_reload(browser, embedded_gateway):
    from selenium.webdriver.common.by import By

    open_page(browser, embedded_gateway.url)
    set_field(browser, "max_tokens", "24")
    set_field(browser, "temperature", "0")
    send(browser, "Write hello world in Python")
    wait_for(lambda: "tok/s" in replies(browser)[0]["stats"], what="the reply's numbers")
    (reply,) = replies(browser)
    assert reply["text"].strip(), "the reply is empty"
    assert "TTFT" in reply["stats"] and "cached" in reply["stats"] and "drafts" in reply["stats"]
    expected = embedded_gateway.client.post(
        "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "Write hello world in Python"}],
            "max_tokens": 24,
            "temperature": 0,
        },
    ).json()
    assert expected["usage"]["completion_tokens"] == int(reply["stats"].split(" tokens")[0])
    assert " ".join(reply["text"].split()) == " ".join(expected["choices"][0]["message"]["content"].split())
    browser.refresh()
    open_page(browser, embedded_gateway.url)
    titles = [element.text for element in browser.find_elements(By.CSS_SELECTOR, "#conversations .name")]
    assert titles == ["Write hello world in Python"]
    assert replies(browser) == [reply]
    assert browser.find_element(By.ID, "max_tokens").get_attribute("value") == "24"  # kept with the conversation


def test_stop_ends_a_reply_mid_stream(browser, embedded_gateway):
    from selenium.webdriver.common.by import By

    open_page(browser, embedded_gateway.url)
    set_field(browser, "max_tokens", "6000")
    set_field(browser, "temperature", "0")
    send(browser, LONG_PROMPT)
    wait_for(lambda: len(replies(browser)[0]["text"]) > 20, what="the reply to start streaming")
    browser.find_element(By.ID, "stop").click()
    wait_for(lambda: "stopped" in replies(browser)[0]["stats"], what="the reply to stop")
    stopped = replies(browser)[0]["text"]
    assert browser.find_element(By.ID, "send").is_displayed()
    time.sleep(0.3)
    assert replies(browser)[0]["text"] == stopped  # nothing came after the stop
    # the daemon let the row go: every slot idle again
    wait_for(
        lambda: not any(slot["is_processing"] for slot in embedded_gateway.client.get("/slots").json()),
        timeout_s=10,
        what="the daemon to cancel the generation",
    )


def test_conversations_are_created_renamed_and_deleted(browser, embedded_gateway):
    from selenium.webdriver.common.by import By

    open_page(browser, embedded_gateway.url)
    browser.find_element(By.ID, "new-chat").click()
    browser.find_element(By.ID, "new-chat").click()
    assert len(browser.find_elements(By.CSS_SELECTOR, "#conversations li")) == 2
    browser.find_element(By.CSS_SELECTOR, "#conversations li.active .rename").click()
    alert = browser.switch_to.alert
    alert.send_keys("Renamed")
    alert.accept()
    names = [element.text for element in browser.find_elements(By.CSS_SELECTOR, "#conversations .name")]
    assert names == ["Renamed", "New chat"]
    browser.find_element(By.CSS_SELECTOR, "#conversations li.active .delete").click()
    browser.switch_to.alert.accept()
    names = [element.text for element in browser.find_elements(By.CSS_SELECTOR, "#conversations .name")]
    assert names == ["New chat"]


def fetched(browser) -> list[list]:
    """Every finished ``fetch()`` of the page, as ``[path, HTTP status]`` (the browser's Resource Timing)."""
    return browser.execute_script(
        "return performance.getEntriesByType('resource').filter(e => e.initiatorType === 'fetch')"
        ".map(e => [new URL(e.name).pathname, e.responseStatus])"
    )


def asked_for_key(browser) -> list[list]:
    """Wait for the page to ask for the API key; the page's requests so far (``fetched``)."""
    from selenium.webdriver.common.by import By

    wait_for(lambda: browser.find_element(By.ID, "key-dialog").is_displayed(), what="the page to ask for the key")
    return fetched(browser)


def test_the_api_key_is_asked_once_and_sent_with_every_request(browser, embedded_endpoint):
    from selenium.webdriver.common.by import By

    gateway = Gateway([embedded_endpoint], "--api-key", "s3cret")
    try:
        browser.get(gateway.url)
        assert asked_for_key(browser) == []  # asked before the page's first request: none left without the key
        browser.find_element(By.ID, "key-input").send_keys("s3cret\n")
        wait_for(lambda: browser.execute_script("return document.body.dataset.ready"), what="the model list")
        assert browser.find_element(By.ID, "model").text == "mlxd-qwen3-tiny"
        assert browser.execute_script("return sessionStorage.getItem('mlxd-api-key')") == "s3cret"
        set_field(browser, "max_tokens", "8")
        send(browser, "Hi")
        wait_for(lambda: "tok/s" in replies(browser)[0]["stats"], what="the reply")
        assert not browser.find_element(By.ID, "key-dialog").is_displayed()  # asked once
        requests = wait_for(lambda: len(fetched(browser)) >= 2 and fetched(browser), what="the reply's request")
        assert requests == [["/v1/models", 200], ["/v1/chat/completions", 200]]  # no 401: each carried the key

        # the live view, in a tab that has no key yet: asked before the feed is opened; a wrong key is asked again
        browser.get(gateway.url + "/ui/ticks")
        browser.execute_script("sessionStorage.clear()")
        browser.refresh()
        assert asked_for_key(browser) == []
        browser.find_element(By.ID, "key-input").send_keys("wrong\n")
        wait_for(lambda: fetched(browser), what="the wrong key's answer")
        assert asked_for_key(browser) == [["/ui/ticks/stream", 401]]  # refused, asked again
        browser.find_element(By.ID, "key-input").send_keys("s3cret\n")
        wait_for(lambda: browser.execute_script("return document.body.dataset.updates"), what="the first update")
        assert fetched(browser) == [["/ui/ticks/stream", 401]]  # the wrong key's refusal, the only one
    finally:
        gateway.stop()


# ---- the live view ------------------------------------------------------------------------------------------


class FakeSubscription:
    """A tick trace that gives its ticks, then nothing."""

    def __init__(self, ticks: list[Tick]) -> None:
        self.ticks = list(ticks)
        self.closed = False

    async def receive(self, timeout_s: float | None = None) -> Tick | None:
        if self.ticks:
            return self.ticks.pop(0)
        await asyncio.sleep(timeout_s or 0)
        return None

    def close(self) -> None:
        self.closed = True


class FakeClient:
    def __init__(self, ticks: list[Tick]) -> None:
        self.ticks = ticks
        self.subscriptions: list[FakeSubscription] = []

    def subscribe_ticks(self) -> FakeSubscription:
        self.subscriptions.append(FakeSubscription(self.ticks))
        return self.subscriptions[-1]


def sample_tick(number: int) -> Tick:
    return Tick(
        tick=number,
        batch=3,
        pipelined=False,
        rows=[
            TickRow(request_id="chatcmpl:aaaaaaaaaaaa", action="decode", tokens=4),
            TickRow(request_id="chatcmpl:bbbbbbbb", action="verify", drafted=5, accepted=3, detail="prompt"),
            TickRow(request_id="chatcmpl:cccccccc", action="first-token"),
        ],
        duration_ms=2.5,
        prefill_tokens=12,
    )


@pytest.mark.unit
def test_a_tick_becomes_a_compact_row_and_a_whole_record():
    tick = sample_tick(7)
    assert tick_feed.tick_tokens(tick) == 4 + (3 + 1) + 1
    assert dict(zip(tick_feed.TICK_COLUMNS, tick_feed.tick_row(tick))) == {
        "tick": 7,
        "batch": 3,
        "pipelined": 0,
        "steps": 1,
        "duration_ms": 2.5,
        "tokens": 9,
        "drafted": 5,
        "accepted": 3,
        "prefill": 12,
    }
    rows = tick_feed.tick_detail(tick)["rows"]
    assert rows[0] == {"action": "decode", "tokens": 4, "request": "aaaaaaaa"}
    assert rows[1] == {"action": "verify", "drafted": 5, "accepted": 3, "detail": "prompt", "request": "bbbbbbbb"}


@pytest.mark.unit
def test_one_subscription_serves_every_viewer_while_one_watches():
    async def scenario():
        client = FakeClient([sample_tick(1), sample_tick(2)])
        feed = tick_feed.TickFeed(DaemonHandle("ipc:///nowhere", client), interval_s=0.02)  # type: ignore[arg-type]
        first, second = feed.join(), feed.join()
        updates = [await asyncio.wait_for(first.get(), 2), await asyncio.wait_for(second.get(), 2)]
        assert len(client.subscriptions) == 1  # two viewers, one subscription
        assert [row[0] for row in updates[0]["ticks"]] == [1, 2] and updates[0] is updates[1]
        for _ in range(tick_feed.MAX_VIEWERS - 2):
            feed.join()
        with pytest.raises(tick_feed.ViewersFull):
            feed.join()
        for viewer in list(feed._viewers):
            await feed.leave(viewer)
        assert client.subscriptions[0].closed and feed.viewers == 0
        feed.join()  # a new viewer subscribes again
        await asyncio.sleep(0.05)
        assert len(client.subscriptions) == 2

    asyncio.run(scenario())


def test_the_feed_needs_the_key_and_a_daemon_index(embedded_endpoint):
    gateway = Gateway([embedded_endpoint], "--api-key", "k")
    try:
        assert gateway.client.get("/ui/ticks").status_code == 200  # the page itself is open
        assert gateway.client.get("/ui/ticks/stream").status_code == 401
        headers = {"Authorization": "Bearer k"}
        assert gateway.client.get("/ui/ticks/stream?daemon=1", headers=headers).status_code == 400
        assert gateway.client.get("/ui/ticks/stream?daemon=x", headers=headers).status_code in (400, 422)
        with gateway.client.stream("GET", "/ui/ticks/stream", headers=headers) as response:
            assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
            first = next(line for line in response.iter_lines() if line.startswith("data: "))
        update = json.loads(first.removeprefix("data: "))
        assert update["columns"] == list(tick_feed.TICK_COLUMNS) and update["status"]["max_batch"] == 4
    finally:
        gateway.stop()


def test_the_live_view_shows_the_batch_grow_while_4_requests_run(browser, embedded_gateway):
    browser.get(embedded_gateway.url + "/ui/ticks")
    wait_for(lambda: browser.execute_script("return document.body.dataset.updates"), what="the first update")
    time.sleep(0.5)  # the gateway's subscription reaches the daemon's publisher
    body = {
        "messages": [{"role": "user", "content": LONG_PROMPT}],
        "max_tokens": 6000,
        "temperature": 0,
        "stream": True,
        "speculative": {"kind": "prompt-lookup"},
    }
    seen = threading.Event()  # the page saw the batch of 4: the requests may stop

    def request() -> int:
        with embedded_gateway.client.stream("POST", "/v1/chat/completions", json=body) as response:
            for _ in response.iter_lines():
                if seen.is_set():
                    break  # leaving cancels the generation
            return response.status_code

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = [pool.submit(request) for _ in range(4)]
        try:
            wait_for(
                lambda: int(browser.execute_script("return document.body.dataset.peakBatch || 0")) >= 4,
                what="a tick with 4 rows",
            )
            table = browser.execute_script("return document.getElementById('recent').innerText")
            if SCREENSHOTS.is_dir():
                browser.save_screenshot(str(SCREENSHOTS / "webui-ticks.png"))
        finally:
            seen.set()
        assert [answer.result() for answer in answers] == [200] * 4
    assert "verify" in table or "decode" in table
