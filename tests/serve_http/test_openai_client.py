"""mlx-serve-http through the real ``openai`` client: completions and chat, streaming or not, equal
to mlx-generate's greedy output; plus /v1/models, /tokenize, /detokenize and /metrics."""

from __future__ import annotations

import openai
import pytest

from mlxd_protocol import Client

from .conftest import run_generate

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def stories_openai(stories_gateway):
    with openai.OpenAI(base_url=f"{stories_gateway.url}/v1", api_key="unused", max_retries=0, timeout=120) as client:
        yield client


def test_completion_equals_mlx_generate(stories_openai, stories_endpoint):
    reference = run_generate(stories_endpoint, PROMPT, 40, chat=False)
    reply = stories_openai.completions.create(model="stories", prompt=PROMPT, max_tokens=40, temperature=0)
    assert reply.object == "text_completion" and reply.choices[0].text == reference["text"]
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 40 and reply.usage.prompt_tokens == (
        reference["timings"]["prompt_n"] + reference["timings"]["cache_n"]
    )  # prefilled + taken from the prefix cache
    assert reply.model.endswith("stories260K")
    assert reply.model_extra["timings"]["predicted_n"] == 40  # the extension: the daemon's timings as they are


def test_streamed_completion_equals_mlx_generate(stories_openai, stories_endpoint):
    reference = run_generate(stories_endpoint, PROMPT, 40, chat=False)
    chunks = list(
        stories_openai.completions.create(
            model="stories",
            prompt=PROMPT,
            max_tokens=40,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert all(chunk.object == "text_completion" for chunk in chunks)
    assert "".join(chunk.choices[0].text for chunk in chunks if chunk.choices) == reference["text"]
    finishes = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 40
    assert len(chunks) > 5  # streamed, not one blob


def test_completion_from_token_ids_and_stop(stories_openai, stories_gateway):
    tokens = stories_gateway.client.post("/tokenize", json={"content": PROMPT, "add_special": True}).json()["tokens"]
    by_text = stories_openai.completions.create(model="m", prompt=PROMPT, max_tokens=12, temperature=0)
    by_tokens = stories_openai.completions.create(model="m", prompt=tokens, max_tokens=12, temperature=0)
    assert by_tokens.choices[0].text == by_text.choices[0].text
    stopped = stories_openai.completions.create(model="m", prompt=PROMPT, max_tokens=40, temperature=0, stop=["Lily"])
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == by_text.choices[0].text[: by_text.choices[0].text.index("Lily")]


def test_prefix_cache_is_reported_and_cache_prompt_false_bypasses_it(stories_openai, stories_gateway):
    """OpenAI usage.prompt_tokens_details.cached_tokens and llama-server tokens_cached / timings.cache_n: the
    same prompt again is taken from the prefix cache (all but its last token), with the same text; with
    cache_prompt false nothing is."""
    prompt = "Tom had a red ball. He liked to throw the ball to his dog. One day the ball went over the fence"
    first = stories_openai.completions.create(model="m", prompt=prompt, max_tokens=16, temperature=0)
    again = stories_openai.completions.create(model="m", prompt=prompt, max_tokens=16, temperature=0)
    assert again.choices[0].text == first.choices[0].text
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    bypass = stories_openai.completions.create(
        model="m", prompt=prompt, max_tokens=16, temperature=0, extra_body={"cache_prompt": False}
    )
    assert bypass.choices[0].text == first.choices[0].text and bypass.usage.prompt_tokens_details.cached_tokens == 0
    llama = stories_gateway.client.post("/completion", json={"prompt": prompt, "n_predict": 16}).json()
    assert llama["content"] == first.choices[0].text
    assert llama["tokens_cached"] == llama["timings"]["cache_n"] == llama["tokens_evaluated"] - 1
    cold = stories_gateway.client.post("/completion", json={"prompt": prompt, "n_predict": 16, "cache_prompt": False})
    assert cold.json()["tokens_cached"] == 0 and "x-mlxd-ignored-fields" not in {k.lower() for k in cold.headers}
    page = stories_gateway.client.get("/metrics").text
    assert "# TYPE mlxd_daemon_prefix_cache_hits_total counter" in page


def test_completion_logprobs(stories_openai):
    reply = stories_openai.completions.create(model="m", prompt=PROMPT, max_tokens=8, temperature=0, logprobs=3)
    logprobs = reply.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 8
    assert all(value <= 0 for value in logprobs.token_logprobs)
    assert all(len(top) >= 1 for top in logprobs.top_logprobs)
    assert "".join(logprobs.tokens) == reply.choices[0].text  # token texts keep their spaces


def test_sampling_with_seed_is_reproducible(stories_openai):
    def sample():
        return (
            stories_openai.completions.create(
                model="m",
                prompt=PROMPT,
                max_tokens=30,
                temperature=1.0,
                top_p=0.9,
                seed=11,
                extra_body={"top_k": 20, "min_p": 0.01},
            )
            .choices[0]
            .text
        )

    assert sample() == sample()


def test_chat_without_template_is_a_clear_400(stories_openai):
    with pytest.raises(openai.BadRequestError) as error:
        stories_openai.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert "chat template" in error.value.message


def test_models_lists_the_daemon_model(stories_openai, stories_endpoint):
    with Client(stories_endpoint) as daemon:
        model = daemon.status().model
    # the checkpoint's name, never the server's path to it
    assert [entry.id for entry in stories_openai.models.list().data] == [model.rstrip("/").rsplit("/", 1)[-1]]


def test_tokenize_detokenize_round_trip(stories_gateway):
    http = stories_gateway.client
    tokens = http.post("/tokenize", json={"content": "Lily and Ben went to the park."}).json()["tokens"]
    assert tokens and all(isinstance(token, int) for token in tokens)
    assert http.post("/detokenize", json={"tokens": tokens}).json() == {"content": "Lily and Ben went to the park."}
    with_bos = http.post("/tokenize", json={"content": "Lily", "add_special": True}).json()["tokens"]
    assert len(with_bos) == len(http.post("/tokenize", json={"content": "Lily"}).json()["tokens"]) + 1


def test_metrics_page(stories_gateway, stories_openai):
    stories_openai.completions.create(model="m", prompt=PROMPT, max_tokens=5)
    response = stories_gateway.client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    page = response.text
    for name in (
        "mlxd_http_requests_total",
        "mlxd_http_generated_tokens_total",
        "mlxd_http_prompt_tokens_total",
        "mlxd_http_tokens_per_second",
        "mlxd_http_requests_in_flight",
        "mlxd_daemon_up",
        "mlxd_daemon_queued",
        "mlxd_daemon_active",
        "mlxd_daemon_draft_tokens_total",
        "mlxd_daemon_draft_accepted_total",
        "mlxd_daemon_verify_rounds_total",
        "mlxd_daemon_declined_gate_total",
        "mlxd_daemon_declined_governor_total",
    ):
        assert f"# TYPE {name} " in page, name
    samples = dict(line.rsplit(" ", 1) for line in page.splitlines() if line and not line.startswith("#"))
    assert int(samples['mlxd_http_requests_total{endpoint="/v1/completions",status="200"}']) >= 1
    assert int(samples["mlxd_http_generated_tokens_total"]) >= 5
    assert float(samples["mlxd_http_tokens_per_second"]) > 0
    for kind in ("tokens", "accepted"):  # draft counts by source, as the daemon's status names them
        for source in ("prompt", "output", "prediction", "shared"):
            assert f'mlxd_daemon_draft_{kind}_by_source_total{{daemon="0",source="{source}"}}' in samples


def test_openapi_is_served(stories_gateway):
    spec = stories_gateway.client.get("/openapi.json").json()
    for path in (
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/models",
        "/completion",
        "/tokenize",
        "/detokenize",
        "/health",
        "/metrics",
    ):
        assert path in spec["paths"]
    assert "ChatCompletionRequest" in spec["components"]["schemas"]


# ---- chat on stories260K with a minimal chat template (always runs) ---------------------------


@pytest.fixture(scope="module")
def templated_openai(templated_stories_gateway):
    with openai.OpenAI(
        base_url=f"{templated_stories_gateway.url}/v1", api_key="unused", max_retries=0, timeout=120
    ) as client:
        yield client


def test_chat_path_equals_mlx_generate(templated_openai, templated_stories_endpoint):
    reference = run_generate(templated_stories_endpoint, "Lily and Ben", 24, chat=True)
    messages = [{"role": "user", "content": "Lily and Ben"}]
    reply = templated_openai.chat.completions.create(model="m", messages=messages, max_tokens=24, temperature=0)
    assert reply.object == "chat.completion" and reply.choices[0].message.content == reference["text"]
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 24
    chunks = list(
        templated_openai.chat.completions.create(
            model="m",
            messages=messages,
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices) == reference["text"]
    assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 24
    # llama-server's usage chunk carries the timings too
    assert chunks[-1].model_extra["timings"]["predicted_n"] == 24


def test_chat_logprobs_on_the_templated_model(templated_openai):
    reply = templated_openai.chat.completions.create(
        model="m",
        messages=[{"role": "system", "content": "Tell a story."}, {"role": "user", "content": "Lily"}],
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    content = reply.choices[0].logprobs.content
    assert len(content) == 6 and "".join(entry.token for entry in content) == reply.choices[0].message.content
    assert all(len(entry.top_logprobs) == 2 and entry.logprob <= 0 for entry in content)


# ---- chat: needs the embedded model (qwen3 with a ChatML template) ----------------------------

CHAT_PROMPT = "Name three colors."


@pytest.fixture(scope="module")
def embedded_openai(embedded_gateway):
    with openai.OpenAI(base_url=f"{embedded_gateway.url}/v1", api_key="unused", max_retries=0, timeout=300) as client:
        yield client


@pytest.mark.slow
def test_chat_equals_mlx_generate(embedded_openai, embedded_endpoint):
    reference = run_generate(embedded_endpoint, CHAT_PROMPT, 32, chat=True)
    reply = embedded_openai.chat.completions.create(
        model="mlxd", messages=[{"role": "user", "content": CHAT_PROMPT}], max_tokens=32, temperature=0
    )
    assert reply.object == "chat.completion"
    assert reply.choices[0].message.role == "assistant" and reply.choices[0].message.content == reference["text"]
    assert reply.choices[0].finish_reason == {"stop": "stop", "length": "length"}[reference["finish_reason"]]
    assert reply.usage.completion_tokens == len(reference["tokens"])


@pytest.mark.slow
def test_streamed_chat_equals_mlx_generate(embedded_openai, embedded_endpoint):
    reference = run_generate(embedded_endpoint, CHAT_PROMPT, 32, chat=True)
    chunks = list(
        embedded_openai.chat.completions.create(
            model="mlxd",
            messages=[{"role": "user", "content": CHAT_PROMPT}],
            max_completion_tokens=32,
            temperature=0,
            stream=True,
        )
    )
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    # the opening chunk: the role and content null (no text yet), as llama-server sends it
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content is None
    assert all(chunk.choices[0].delta.role is None for chunk in chunks[1:])
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks) == reference["text"]
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert all(chunk.choices[0].finish_reason is None for chunk in chunks[:-1])


@pytest.mark.slow
def test_chat_logprobs_and_system_message(embedded_openai):
    reply = embedded_openai.chat.completions.create(
        model="mlxd",
        messages=[
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": [{"type": "text", "text": CHAT_PROMPT}]},
        ],
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    assert all(len(entry.top_logprobs) == 2 and entry.logprob <= 0 for entry in content)


def test_predicted_output_changes_nothing_and_is_counted(templated_openai):
    """OpenAI's prediction: the reply is the same, and usage says how many prediction tokens it took."""
    messages = [{"role": "user", "content": "Tell me about Lily and her dog."}]
    plain = templated_openai.chat.completions.create(model="m", messages=messages, max_tokens=40, temperature=0)
    text = plain.choices[0].message.content
    predicted = templated_openai.chat.completions.create(
        model="m",
        messages=messages,
        max_tokens=40,
        temperature=0,
        extra_body={"prediction": {"type": "content", "content": [{"type": "text", "text": text}]}},
    )
    assert predicted.choices[0].message.content == text
    details = predicted.usage.completion_tokens_details
    assert details.accepted_prediction_tokens > 0
    assert plain.usage.completion_tokens_details is None
