"""llama-server's /completion through mlx-serve-http, prompt lookup, and cancellation on disconnect."""

from __future__ import annotations

import time

import httpx
import pytest

from mlxd_protocol import Client

from .conftest import sse_events

PARK = "Lily and Ben went to the park."


def complete(gateway, **body) -> dict:
    response = gateway.client.post("/completion", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_prompt_lookup_drafts_and_keeps_the_output(stories_gateway):
    plain = complete(stories_gateway, prompt=PARK, n_predict=200, temperature=0, speculative={"kind": "none"})
    looked_up = complete(
        stories_gateway, prompt=PARK, n_predict=200, temperature=0, speculative={"kind": "prompt-lookup"}
    )
    timings = looked_up["timings"]
    assert timings["draft_kind"] == "prompt-lookup"
    # how many drafts are verified is the verify gate's call (on stories260K few pay for their forward)
    assert 0 <= timings["draft_n_accepted"] <= timings["draft_n"]
    assert "draft_kind" not in plain["timings"]  # the daemon reports drafting only when it ran
    assert looked_up["content"] == plain["content"] and looked_up["tokens_predicted"] == 200


def test_a_request_can_keep_the_shared_draft_store_out(stories_gateway):
    """``speculative.shared_drafts: false`` asks for prompt lookup without drafts from earlier requests'
    outputs (Generate.shared_drafts); the same request twice, the second would otherwise find the first's reply."""
    from mlxd_cli.serve_http.schemas.requests import SpeculativeOptions, shared_drafts

    assert shared_drafts(None) and shared_drafts(SpeculativeOptions(kind="prompt-lookup"))
    assert not shared_drafts(SpeculativeOptions(kind="prompt-lookup", shared_drafts=False))
    body = dict(prompt=PARK, n_predict=64, temperature=0, ignore_eos=True)
    first = complete(stories_gateway, **body, speculative={"kind": "prompt-lookup"})
    again = complete(stories_gateway, **body, speculative={"kind": "prompt-lookup", "shared_drafts": False})
    assert again["content"] == first["content"]
    assert "shared" not in again["timings"].get("draft_sources", {}), again["timings"]
    response = stories_gateway.client.post(
        "/completion", json={**body, "speculative": {"kind": "prompt-lookup", "shared_drafts": "no"}}
    )
    assert response.status_code == 400 and "shared_drafts" in response.text


def test_answer_has_llama_server_fields(stories_gateway):
    answer = complete(stories_gateway, prompt="Once upon a time", n_predict=16, cache_prompt=True)
    assert answer["stop"] is True and answer["truncated"] is False
    assert answer["stop_type"] == "limit" and answer["stopping_word"] == ""
    assert answer["tokens_predicted"] == 16 and answer["tokens_evaluated"] > 0
    assert answer["model"].endswith("stories260K") and answer["content"].startswith(", there was")
    for name in (
        "prompt_n",
        "prompt_ms",
        "prompt_per_token_ms",
        "prompt_per_second",
        "predicted_n",
        "predicted_ms",
        "predicted_per_token_ms",
        "predicted_per_second",
    ):
        assert name in answer["timings"], name


def test_stop_types(stories_gateway):
    full = complete(stories_gateway, prompt="Once upon a time", n_predict=40)["content"]
    word = complete(stories_gateway, prompt="Once upon a time", n_predict=40, stop=["Lily", "zzz"])
    assert word["stop_type"] == "word" and word["stopping_word"] == "Lily"
    assert word["content"] == full[: full.index("Lily")]
    # n_predict -1: until end of sequence; the story model ends its stories, so this stops on EOS.
    until_eos = complete(stories_gateway, prompt="Once upon a time", n_predict=-1)
    assert until_eos["stop_type"] in ("eos", "limit")
    assert until_eos["stop_type"] == "eos" or until_eos["tokens_evaluated"] + until_eos["tokens_predicted"] >= 500


def test_token_prompt_equals_text_prompt(stories_gateway):
    tokens = stories_gateway.client.post("/tokenize", json={"content": PARK, "add_special": True}).json()["tokens"]
    assert (
        complete(stories_gateway, prompt=tokens, n_predict=20)["content"]
        == complete(stories_gateway, prompt=PARK, n_predict=20)["content"]
    )


def test_streaming_completion(stories_gateway):
    reference = complete(stories_gateway, prompt=PARK, n_predict=30)
    with stories_gateway.client.stream(
        "POST", "/completion", json={"prompt": PARK, "n_predict": 30, "stream": True}
    ) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response.iter_lines())
    assert "[DONE]" not in events  # llama-server ends /completion streams with the stop event
    *pieces, last = events
    assert all(piece["stop"] is False for piece in pieces) and len(pieces) > 3
    assert "".join(piece["content"] for piece in pieces) == reference["content"]
    assert last["stop"] is True and last["content"] == "" and last["stop_type"] == "limit"
    assert last["timings"]["predicted_n"] == 30 and last["tokens_predicted"] == 30


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 480, "stream": True}),
        ("/completion", {"prompt": "Once upon a time", "n_predict": 480, "ignore_eos": True, "stream": True}),
    ],
)
def test_client_disconnect_cancels_the_generation(stories_gateway, stories_endpoint, path, body):
    body = {**body, "temperature": 0}  # greedy on this prompt runs to the context bound without cancel
    with Client(stories_endpoint) as daemon:
        before = daemon.status().totals["completion_tokens"]
        with httpx.Client(base_url=stories_gateway.url, timeout=60) as http:
            with http.stream("POST", path, json=body) as response:
                assert response.status_code == 200
                lines = response.iter_lines()
                received = [line for line, _ in zip((line for line in lines if line.startswith("data: ")), range(2))]
                assert len(received) == 2
            # leaving the block closes the connection mid-stream
        deadline = time.monotonic() + 10
        while (status := daemon.status()).active and time.monotonic() < deadline:
            time.sleep(0.05)
        assert status.active == 0
        # Cancelled early: far fewer tokens than asked for were generated (a run to the end makes 480:
        # greedy decoding of this prompt never reaches an end of sequence).
        time.sleep(0.3)
        generated = daemon.status().totals["completion_tokens"] - before
    assert generated < 300, generated


def test_cancel_then_serve_again(stories_gateway):
    # The gateway and the daemon stay healthy after a cancelled stream.
    assert stories_gateway.client.get("/health").json() == {"status": "ok"}
    assert complete(stories_gateway, prompt=PARK, n_predict=8)["tokens_predicted"] == 8
