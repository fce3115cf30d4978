"""The web UI's first use on the default model, in headless Chromium: a bare ``mlx-serve-http`` (no ``-m``,
no ``--daemon``) starts mlxd on SmolLM2-135M-Instruct from the cache ``make setup`` fills, prints the page's
address; the page opened at that address chats: a reply streams in, finishes, and shows its tokens/s.

Skipped, with one line saying why, when the default model is not in the cache (``MLXD_OFFLINE=1``: the
test never fetches it) or when there is no headless Chromium (the ``browser`` fixture).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mlxd_engine.loading.default_model import GGUF_SHA256, NAME, OFFLINE_ENV, downloaded_gguf, gguf_destination
from mlxd_protocol import Client
from mlxd_protocol.autostart import daemon_answers

from ..daemon.conftest import private_endpoint
from .conftest import Gateway
from .test_web_ui import SCREENSHOTS, open_page, replies, send, set_field, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        downloaded_gguf() is None,
        reason=f"the default model {NAME} is not in the cache ({gguf_destination()}): `make setup` fetches it",
    ),
]

QUESTION = "Write a Python function that adds two numbers."
MAX_TOKENS = 25  # SmolLM2's greedy answer: a code block of 25 tokens (the README's screenshot)


def printed_address(gateway: Gateway) -> str:
    """The chat page's address from the gateway's start-up lines (printed before it serves)."""
    for _ in range(20):
        line = gateway.process.stdout.readline()
        found = re.search(r"chat page at (http://\S+/)", line)
        if found:
            return found.group(1)
    raise AssertionError("mlx-serve-http did not print the chat page's address")


def test_a_new_user_opens_the_printed_address_and_chats_with_smollm2(browser):
    from selenium.webdriver.common.by import By  # here: selenium is only there where `browser` did not skip

    endpoint = private_endpoint("w")  # the "default" endpoint of this gateway, through $MLXD_ENDPOINT
    gateway = None
    try:
        gateway = Gateway([], env={"MLXD_ENDPOINT": endpoint, OFFLINE_ENV: "1"}, timeout_s=300)
        address = printed_address(gateway)
        assert address == gateway.url + "/"
        open_page(browser, address)
        model = browser.find_element(By.ID, "model").text
        assert model == gateway.client.get("/v1/models").json()["data"][0]["id"]
        with Client(endpoint, timeout_s=5) as daemon:
            served = Path(daemon.status().model)
        assert served.name == GGUF_SHA256, f"the default model is not what the daemon serves: {served}"
        set_field(browser, "max_tokens", str(MAX_TOKENS))
        set_field(browser, "temperature", "0")
        send(browser, QUESTION)
        # streamed: part of the reply is on the page while the stop button still shows
        wait_for(
            lambda: (
                replies(browser)
                and replies(browser)[0]["text"].strip()
                and browser.find_element(By.ID, "stop").is_displayed()
            ),
            timeout_s=60,
            what="the reply to start streaming",
        )
        wait_for(lambda: "tok/s" in replies(browser)[0]["stats"], timeout_s=120, what="the reply to finish")
        (reply,) = replies(browser)
        numbers = re.match(r"(\d+) tokens · ([\d.]+) tok/s · TTFT \d+ ms", reply["stats"])
        assert numbers, f"the reply's numbers: {reply['stats']!r}"
        assert 0 < int(numbers[1]) <= MAX_TOKENS and float(numbers[2]) > 0, reply["stats"]
        assert browser.find_element(By.ID, "send").is_displayed()
        # the reply is SmolLM2's greedy answer to the question, as the API gives it
        stored = json.loads(browser.execute_script("return localStorage.getItem('mlxd-chat')"))
        text = stored["conversations"][0]["messages"][1]["content"]
        expected = gateway.client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": QUESTION}], "max_tokens": MAX_TOKENS, "temperature": 0},
        ).json()
        assert text == expected["choices"][0]["message"]["content"]
        assert browser.find_elements(By.CSS_SELECTOR, ".message.assistant .code code")  # rendered as a code block
        assert int(numbers[1]) == expected["usage"]["completion_tokens"]
        if SCREENSHOTS.is_dir():
            browser.find_element(By.ID, "settings-toggle").click()  # the settings set above, closed again
            browser.save_screenshot(str(SCREENSHOTS / "webui-chat.png"))
    finally:
        if gateway is not None:
            gateway.stop()
        if daemon_answers(endpoint):
            with Client(endpoint, timeout_s=5) as daemon:
                daemon.shutdown()  # it was started detached: it outlives the gateway
