"""llama-server's endpoints and options beyond /completion's basics: /props, /slots, /metrics names,
un-prefixed routes, prompt forms, response_fields, n_probs, the context error and the server defaults."""

from __future__ import annotations

import pytest

from ..daemon.conftest import STORIES, private_endpoint, start_daemon, stop_daemon
from .conftest import Gateway, sse_events


@pytest.fixture(scope="module")
def llama_daemon():
    """stories260K as llama-server's test preset runs it: 2 rows of 256 tokens, seed 42, chatml."""
    if not STORIES.is_dir():
        pytest.skip(f"{STORIES} is not present")
    endpoint = private_endpoint("l")
    process = start_daemon(
        endpoint,
        "-m",
        str(STORIES),
        "--max-batch",
        "2",
        "--max-kv-size",
        "256",
        "--seed",
        "42",
        "--chat-template",
        "chatml",
        "--stream-interval-ms",
        "0",
    )
    yield endpoint
    stop_daemon(process, endpoint)


@pytest.fixture(scope="module")
def llama_gateway(llama_daemon):
    gateway = Gateway([llama_daemon], "--n-predict", "16", "--alias", "tinyllama-2")
    yield gateway
    gateway.stop()


def test_props_and_slots_describe_the_daemon(llama_gateway):
    props = llama_gateway.client.get("/props").json()
    assert props["total_slots"] == 2 and props["default_generation_settings"]["n_ctx"] == 256
    assert props["default_generation_settings"]["params"]["seed"] == 42
    assert props["default_generation_settings"]["params"]["repeat_penalty"] == 1.0  # off, in llama-server's terms
    assert props["model_alias"] == "tinyllama-2" and "im_start" in props["chat_template"]
    assert props["webui"] is True  # the web page is on unless --no-webui
    assert llama_gateway.client.post("/props", json={}).status_code == 501
    slots = llama_gateway.client.get("/slots").json()
    assert [slot["id"] for slot in slots] == [0, 1] and not any(slot["is_processing"] for slot in slots)


def test_disabled_slots_and_metrics_answer_501(llama_daemon):
    gateway = Gateway([llama_daemon], "--no-slots", "--no-metrics")
    try:
        for path in ("/slots", "/metrics"):
            response = gateway.client.get(path)
            assert response.status_code == 501 and response.json()["error"]["type"] == "not_supported_error"
    finally:
        gateway.stop()


def test_completion_has_llama_server_fields_and_obeys_n_predict(llama_gateway):
    answer = llama_gateway.client.post(
        "/completions", json={"prompt": "Once upon a time", "return_tokens": True}
    ).json()
    assert answer["tokens_predicted"] == 16 and len(answer["tokens"]) == 16  # --n-predict is the default
    assert answer["generation_settings"]["n_predict"] == 16 and answer["generation_settings"]["seed"] == 42
    assert answer["generation_settings"]["repeat_penalty"] == 1.0
    assert answer["prompt"].startswith("<s>") and answer["id_slot"] == -1 and answer["index"] == 0
    assert answer["has_new_line"] == ("\n" in answer["content"])
    # a request's own n_predict overrides --n-predict (today's llama-server no longer caps it)
    longer = llama_gateway.client.post(
        "/completion", json={"prompt": "Once upon a time", "n_predict": 24, "ignore_eos": True}
    ).json()
    assert longer["tokens_predicted"] == 24 and longer["tokens"] == []


def test_seeded_default_repeats_and_a_list_of_prompts_gets_a_list(llama_gateway):
    body = {"prompt": "Once upon a time", "temperature": 1.0}
    first, again = (llama_gateway.client.post("/completion", json=body).json()["content"] for _ in range(2))
    assert first == again  # the daemon's --seed applies to a request that sends none
    tokens = llama_gateway.client.post("/tokenize", json={"content": "Once upon a time", "add_special": True}).json()[
        "tokens"
    ]
    answers = llama_gateway.client.post(
        "/completion", json={"prompt": [tokens, "Once upon a time"], "temperature": 0}
    ).json()
    assert [answer["index"] for answer in answers] == [0, 1] and answers[0]["content"] == answers[1]["content"]


def test_response_fields_and_n_probs(llama_gateway):
    picked = llama_gateway.client.post(
        "/completion",
        json={"prompt": "Once", "n_predict": 4, "response_fields": ["content", "generation_settings/n_predict"]},
    ).json()
    assert set(picked) == {"content", "generation_settings/n_predict"} and picked["generation_settings/n_predict"] == 4
    answer = llama_gateway.client.post(
        "/completion", json={"prompt": "Once", "n_predict": 3, "n_probs": 5, "temperature": 0}
    ).json()
    probabilities = answer["completion_probabilities"]
    assert len(probabilities) == 3 and all(len(entry["top_logprobs"]) == 5 for entry in probabilities)
    # the daemon's text drops the leading space of a reply's first token; the token texts keep it
    assert "".join(entry["token"] for entry in probabilities).lstrip() == answer["content"].lstrip()


def test_stream_sends_tokens_per_event(llama_gateway):
    with llama_gateway.client.stream(
        "POST", "/completion", json={"prompt": "Once", "n_predict": 6, "stream": True}
    ) as response:
        events = sse_events(response.iter_lines())
    partial = [event for event in events if not event["stop"]]
    assert sum(len(event["tokens"]) for event in partial) == 6 and all(event["tokens"] for event in partial)
    assert events[-1]["stop"] is True and events[-1]["generation_settings"]["n_predict"] == 6


def test_prompt_over_the_context_is_exceed_context_size_error(llama_gateway):
    response = llama_gateway.client.post(
        "/chat/completions", json={"messages": [{"role": "user", "content": "Once upon a time there was a dog. " * 40}]}
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "exceed_context_size_error" and error["n_ctx"] == 256 and error["n_prompt_tokens"] > 256
    assert "exceeds the available context size" in error["message"]


def test_ignore_eos_shows_in_logit_bias(llama_gateway):
    answer = llama_gateway.client.post(
        "/completion", json={"prompt": "Once upon a time", "n_predict": 16, "ignore_eos": True}
    ).json()
    assert answer["truncated"] is False
    assert (
        answer["generation_settings"]["logit_bias"] and answer["generation_settings"]["logit_bias"][0]["bias"] is None
    )


def test_metrics_carry_llama_server_names(llama_gateway):
    answer = llama_gateway.client.post("/completion", json={"prompt": "Once upon", "n_predict": 4}).json()
    page = llama_gateway.client.get("/metrics")
    # written as llama-server writes it: its clients look names up case-sensitively in a dict
    assert b"Process-Start-Time-Unix" in [name for name, _ in page.headers.raw]
    assert b"Content-Type" in [name for name, _ in page.headers.raw]
    values = dict(line.split(" ", 1) for line in page.text.splitlines() if line.startswith("llamacpp:"))
    assert float(values["llamacpp:tokens_predicted_total"]) >= answer["timings"]["predicted_n"]
    assert "# TYPE llamacpp:requests_processing gauge" in page.text


def test_unprefixed_models_route(llama_gateway):
    assert llama_gateway.client.get("/models").json()["data"][0]["id"] == "tinyllama-2"


def test_apply_template_renders_the_chat_as_a_completion_would_be_prompted(llama_gateway):
    chat = {"messages": [{"role": "user", "content": "What is today?"}]}
    prompt = llama_gateway.client.post("/apply-template", json=chat).json()["prompt"]
    assert prompt.endswith("<|im_start|>user\nWhat is today?<|im_end|>\n<|im_start|>assistant\n")
    bare = llama_gateway.client.post("/apply-template", json={**chat, "add_generation_prompt": False}).json()["prompt"]
    assert bare == prompt.removesuffix("<|im_start|>assistant\n")
    # as llama-server's: no BOS text (tokenizing with special tokens adds BOS, as /completion does)
    assert not prompt.startswith("<s>")
    tokens = llama_gateway.client.post("/tokenize", json={"content": prompt, "add_special": True}).json()["tokens"]
    answer = llama_gateway.client.post(
        "/v1/chat/completions", json={**chat, "max_tokens": 1, "chat_template_kwargs": {"enable_thinking": False}}
    ).json()
    assert answer["usage"]["prompt_tokens"] == len(tokens)


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [{"role": "user", "content": "x"}], "n_predict": 3},  # not a field of /apply-template
        {"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"add_generation_prompt": False}},
        {"messages": []},
    ],
)
def test_apply_template_refuses_what_it_cannot_honour(llama_gateway, body):
    response = llama_gateway.client.post("/apply-template", json=body)
    assert response.status_code == 400 and "error" in response.json()


def test_chat_template_kwargs_are_checked_on_chat_completions(llama_gateway):
    response = llama_gateway.client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"messages": []}},
    )
    assert response.status_code == 400 and "chat_template_kwargs" in response.text


def test_a_continued_message_joins_its_text_parts_by_a_blank_line(llama_gateway):
    # llama-server joins the parts of the message it continues by "\n\n" (render_content), and those of any
    # other message by "\n" for a template of string contents (chatml here)
    parts = [{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}]
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is"}, {"type": "text", "text": "best"}]}]
    for prefill, continued in (("Whill", "Whill"), (parts, "Wh\n\nill")):
        body = {"messages": [*messages, {"role": "assistant", "content": prefill}], "max_tokens": 1, "verbose": True}
        prompt = llama_gateway.client.post("/v1/chat/completions", json=body).json()["__verbose"]["prompt"]
        assert prompt.endswith(f"<|im_start|>user\nWhat is\nbest<|im_end|>\n<|im_start|>assistant\n{continued}")
    # a final assistant message that is not continued keeps the newline
    body = {"messages": [*messages, {"role": "assistant", "content": parts}], "continue_final_message": False}
    prompt = llama_gateway.client.post("/v1/chat/completions", json={**body, "max_tokens": 1, "verbose": True}).json()
    assert "<|im_start|>assistant\nWh\nill<|im_end|>" in prompt["__verbose"]["prompt"]


def test_chat_input_tokens_counts_the_prompt_of_a_chat_completion(llama_gateway):
    chat = {"messages": [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]}
    for path in ("/chat/completions/input_tokens", "/v1/chat/completions/input_tokens"):
        counted = llama_gateway.client.post(path, json=chat).json()["input_tokens"]
        answer = llama_gateway.client.post("/v1/chat/completions", json={**chat, "max_tokens": 1}).json()
        assert counted == answer["usage"]["prompt_tokens"] > 5
    prefilled = {"messages": [*chat["messages"], {"role": "assistant", "content": "Once upon"}]}
    counted = llama_gateway.client.post("/chat/completions/input_tokens", json=prefilled).json()["input_tokens"]
    answer = llama_gateway.client.post("/v1/chat/completions", json={**prefilled, "max_tokens": 1}).json()
    assert counted == answer["usage"]["prompt_tokens"]
    assert llama_gateway.client.post("/chat/completions/input_tokens", json={"messages": []}).status_code == 400


def test_logit_bias_takes_llama_server_forms(llama_gateway):
    def complete(**fields):
        body = {"prompt": "Once upon a time", "n_predict": 6, "temperature": 0, "return_tokens": True, **fields}
        response = llama_gateway.client.post("/completion", json=body)
        assert response.status_code == 200, response.text
        return response.json()

    greedy = complete()
    first = greedy["tokens"][0]
    banned = complete(logit_bias=[[first, False]])
    assert banned["tokens"][0] != first
    assert {"token": first, "bias": None} in banned["generation_settings"]["logit_bias"]  # null: -inf
    # the object form, the id as a string; a bias adds up over entries naming the same token
    assert complete(logit_bias={str(first): -50, "0": 1.5})["tokens"][0] != first
    pushed = complete(logit_bias=[[first, 2.0], [first, 3.0]])["generation_settings"]["logit_bias"]
    assert pushed == [{"token": first, "bias": 5.0}]
    # a text stands for each of its tokens (tokenized without BOS)
    piece = llama_gateway.client.post("/detokenize", json={"tokens": [first]}).json()["content"]
    by_text = complete(logit_bias={piece: False})
    assert by_text["tokens"][0] != first and by_text["generation_settings"]["logit_bias"]


@pytest.mark.parametrize(
    "bias",
    [[[1, "x"]], [[1, True]], [[1]], [[-1, 1.0]], {"5": None}, [[99999, 1.0]], [[1.5, 1.0]]],
    ids=["string bias", "true", "not a pair", "negative id", "null bias", "outside the vocabulary", "float id"],
)
def test_logit_bias_refuses_what_llama_server_would_skip(llama_gateway, bias):
    response = llama_gateway.client.post("/completion", json={"prompt": "Once", "n_predict": 2, "logit_bias": bias})
    assert response.status_code == 400 and "logit_bias" in response.json()["error"]["message"]


def test_streamed_n_probs_come_one_token_per_event(llama_gateway):
    body = {"prompt": "I believe the meaning of life is", "n_predict": 8, "n_probs": 3, "temperature": 0}
    with llama_gateway.client.stream("POST", "/completion", json={**body, "stream": True}) as response:
        events = sse_events(response.iter_lines())
    partial = [event for event in events if not event["stop"]]
    assert sum(len(event["tokens"]) for event in partial) == 8
    for event in partial:
        assert len(event["tokens"]) == 1 and len(event["completion_probabilities"]) == 1
        assert event["completion_probabilities"][0]["id"] == event["tokens"][0]
        assert len(event["completion_probabilities"][0]["top_logprobs"]) == 3
    whole = llama_gateway.client.post("/completion", json=body).json()
    assert "".join(event["content"] for event in partial) == whole["content"]


def test_aliases_and_tags_are_listed_with_the_model(llama_daemon):
    gateway = Gateway([llama_daemon], "--alias", "tinyllama-2, code,tinyllama-2", "--tags", "chat,small")
    try:
        (model,) = gateway.client.get("/v1/models").json()["data"]
        assert model["id"] == "tinyllama-2" and model["aliases"] == ["tinyllama-2", "code"]
        assert model["tags"] == ["chat", "small"]
        answer = gateway.client.post("/completion", json={"prompt": "Once", "n_predict": 2}).json()
        assert answer["model"] == "tinyllama-2"
    finally:
        gateway.stop()


def test_chat_page_unless_no_ui(llama_gateway, llama_daemon):
    page = llama_gateway.client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.text.startswith("<!doctype html>") and "/ui/assets/chat.js" in page.text and "/docs" in page.text
    gateway = Gateway([llama_daemon], "--no-ui")
    try:
        assert gateway.client.get("/").status_code == 404
    finally:
        gateway.stop()


def test_verbose_adds_the_native_answer_to_openai_replies(llama_gateway):
    chat = {
        "messages": [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is"}],
        "max_tokens": 3,
    }
    plain = llama_gateway.client.post("/v1/chat/completions", json=chat).json()
    assert "__verbose" not in plain
    reply = llama_gateway.client.post("/chat/completions", json={**chat, "verbose": True}).json()
    debug = reply["__verbose"]
    # the prompt as tokenized: BOS and the rendered chatml template
    assert debug["prompt"].startswith("<s>") and "<|im_start|>system\nBook<|im_end|>" in debug["prompt"]
    assert debug["content"] == reply["choices"][0]["message"]["content"]
    assert debug["tokens_predicted"] == reply["usage"]["completion_tokens"] == 3
    assert debug["tokens_evaluated"] == reply["usage"]["prompt_tokens"]
    assert debug["stop_type"] == "limit" and debug["generation_settings"]["n_predict"] == 3
    assert debug["generation_settings"]["seed"] == 42
    with llama_gateway.client.stream(
        "POST", "/v1/chat/completions", json={**chat, "verbose": True, "stream": True}
    ) as response:
        events = [event for event in sse_events(response.iter_lines()) if event != "[DONE]"]
    finish = [event for event in events if event["choices"] and event["choices"][0]["finish_reason"]]
    assert finish[0]["__verbose"]["content"] == debug["content"]
    assert all("__verbose" not in event for event in events if event not in finish)
    completion = llama_gateway.client.post(
        "/v1/completions", json={"prompt": "Once upon", "max_tokens": 2, "verbose": True}
    ).json()
    assert completion["__verbose"]["prompt"] == "<s> Once upon"
    assert completion["__verbose"]["content"] == completion["choices"][0]["text"]


def test_verbose_replies_is_the_default_a_request_can_turn_off(llama_daemon):
    gateway = Gateway([llama_daemon], "--verbose-replies")
    try:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert "__verbose" in gateway.client.post("/v1/chat/completions", json=body).json()
        assert "__verbose" not in gateway.client.post("/v1/chat/completions", json={**body, "verbose": False}).json()
        # /completion's answer is the native one already: verbose changes nothing there
        answer = gateway.client.post("/completion", json={"prompt": "Once", "n_predict": 2, "verbose": True})
        assert answer.status_code == 200 and "__verbose" not in answer.json()
    finally:
        gateway.stop()


def test_n_predict_minus_one_fills_the_context_with_prompt_and_output(llama_gateway):
    """llama-server's rule: prompt and output together fill the context (256 tokens a row here); a request's
    own -1 overrides --n-predict."""
    body = {"prompt": "Hi how are you", "n_predict": -1, "ignore_eos": True}
    answer = llama_gateway.client.post("/completion", json=body).json()
    assert answer["tokens_evaluated"] + answer["tokens_predicted"] == 256
    assert answer["truncated"] is True and answer["stop_type"] == "limit"


def test_post_sampling_probs_are_the_samplers_distribution(llama_gateway):
    body = {"prompt": "Once upon a time", "n_predict": 3, "n_probs": 5, "temperature": 1.0, "top_k": 3}
    answer = llama_gateway.client.post("/completion", json={**body, "post_sampling_probs": True}).json()
    for entry in answer["completion_probabilities"]:
        assert 0.0 < entry["prob"] <= 1.0 and "logprob" not in entry
        # top_k 3: the other tokens have probability 0 and are left out, as llama-server leaves them
        assert len(entry["top_probs"]) == 3 and abs(sum(item["prob"] for item in entry["top_probs"]) - 1.0) < 1e-4
        assert entry["id"] in [item["id"] for item in entry["top_probs"]]
    plain = llama_gateway.client.post("/completion", json=body).json()["completion_probabilities"]
    assert "logprob" in plain[0] and len(plain[0]["top_logprobs"]) == 5
    refused = llama_gateway.client.post(
        "/completion", json={**body, "post_sampling_probs": True, "logit_bias": [[5, -1.0]]}
    )
    assert refused.status_code == 400 and "post_sampling" in refused.json()["error"]["message"]


def test_openai_endpoints_take_n_predict_and_default_to_n_predict(llama_gateway):
    """llama-server's token limit on the OpenAI endpoints: n_predict wins over max_tokens, and --n-predict
    (16 here) is the default."""
    body = {"prompt": "Once upon a time"}
    usage = llama_gateway.client.post("/v1/completions", json=body).json()["usage"]
    assert usage["completion_tokens"] == 16
    limited = llama_gateway.client.post("/v1/completions", json={**body, "max_tokens": 9, "n_predict": 4}).json()
    assert limited["usage"]["completion_tokens"] == 4
    chat = {"messages": [{"role": "user", "content": "Once upon a time"}], "n_predict": 3}
    assert llama_gateway.client.post("/v1/chat/completions", json=chat).json()["usage"]["completion_tokens"] <= 3
    refused = llama_gateway.client.post("/v1/completions", json={**body, "n_predict": 0})
    assert refused.status_code == 400 and "n_predict" in refused.text


@pytest.fixture(scope="module")
def chunked_gateway():
    """A daemon prefilling 32 prompt tokens per turn (llama-server's -b 32), behind a gateway."""
    if not STORIES.is_dir():
        pytest.skip(f"{STORIES} is not present")
    endpoint = private_endpoint("p")
    process = start_daemon(
        endpoint,
        "-m",
        str(STORIES),
        "--max-batch",
        "1",
        "--max-kv-size",
        "256",
        "--prefill-chunk",
        "32",
        "--chat-template",
        "chatml",
        "--stream-interval-ms",
        "0",
        "--prefix-cache-bytes",
        str(64 * 1024 * 1024),
    )
    gateway = Gateway([endpoint])
    yield gateway
    gateway.stop()
    stop_daemon(process, endpoint)


def test_return_progress_streams_the_prefill_chunks(chunked_gateway):
    chat = {"messages": [{"role": "user", "content": "This is a test " * 10}], "max_tokens": 3, "stream": True}
    with chunked_gateway.client.stream("POST", "/v1/chat/completions", json={**chat, "return_progress": True}) as reply:
        events = [event for event in sse_events(reply.iter_lines()) if event != "[DONE]"]
    progress = [event["prompt_progress"] for event in events if "prompt_progress" in event]
    first_token = next(
        i for i, event in enumerate(events) if event["choices"] and event["choices"][0]["delta"].get("content")
    )
    assert progress and all("prompt_progress" not in event for event in events[first_token:])
    total = progress[0]["total"]
    assert progress[0]["processed"] == progress[0]["cache"] == 0 and progress[-1]["processed"] == total
    assert [p["processed"] for p in progress] == [min(n, total) for n in range(0, total + 31, 32)]
    # again: the prompt (all but its last token) comes from the prefix cache
    with chunked_gateway.client.stream("POST", "/chat/completions", json={**chat, "return_progress": True}) as reply:
        again = [
            e["prompt_progress"] for e in sse_events(reply.iter_lines()) if e != "[DONE]" and "prompt_progress" in e
        ]
    assert len(again) == 2 and again[0]["cache"] == again[0]["processed"] > 0 and again[1]["processed"] == total
    with chunked_gateway.client.stream(
        "POST",
        "/completion",
        json={"prompt": "Once upon a time " * 12, "n_predict": 2, "stream": True, "return_progress": True},
    ) as reply:
        native = [event for event in sse_events(reply.iter_lines()) if "prompt_progress" in event]
    assert len(native) >= 3 and native[-1]["prompt_progress"]["processed"] == native[-1]["prompt_progress"]["total"]
    for path, body in (("/v1/chat/completions", {**chat, "stream": False}), ("/completion", {"prompt": "x"})):
        refused = chunked_gateway.client.post(path, json={**body, "return_progress": True})
        assert refused.status_code == 400 and "return_progress" in refused.text


def test_timings_per_token_on_every_streamed_event(chunked_gateway):
    body = {"prompt": "The little dog ran " * 12, "n_predict": 3, "stream": True, "timings_per_token": True}
    with chunked_gateway.client.stream("POST", "/completion", json={**body, "return_progress": True}) as reply:
        events = list(sse_events(reply.iter_lines()))
    progress = [event for event in events if "prompt_progress" in event]
    tokens = [event for event in events if event["tokens"]]
    assert progress[0]["timings"]["prompt_n"] == 0 and progress[0]["timings"]["prompt_ms"] == 0.0
    last = progress[-1]["prompt_progress"]
    assert progress[-1]["timings"]["prompt_n"] == last["total"] - last["cache"] and len(progress) >= 3
    assert all(event["timings"]["predicted_n"] == 0 for event in progress)
    sent = [sum(len(event["tokens"]) for event in tokens[: i + 1]) for i in range(len(tokens))]
    assert [event["timings"]["predicted_n"] for event in tokens] == sent  # the tokens so far
    assert events[-1]["stop"] is True and events[-1]["timings"]["predicted_n"] == 3


def test_timings_per_token_on_openai_streams(llama_gateway):
    chat = {"messages": [{"role": "user", "content": "Once upon a time"}], "max_tokens": 4, "stream": True}
    with llama_gateway.client.stream("POST", "/v1/chat/completions", json={**chat, "timings_per_token": True}) as reply:
        events = [event for event in sse_events(reply.iter_lines()) if event != "[DONE]"]
    content = [event for event in events if event["choices"] and event["choices"][0]["delta"].get("content")]
    assert content and all(event["timings"]["predicted_n"] >= 1 for event in content)
    assert [event["timings"]["predicted_n"] for event in content] == sorted(
        event["timings"]["predicted_n"] for event in content
    )
    with llama_gateway.client.stream("POST", "/v1/chat/completions", json=chat) as reply:
        plain = [event for event in sse_events(reply.iter_lines()) if event != "[DONE]"]
    assert all(
        "timings" not in event for event in plain if event["choices"] and event["choices"][0]["delta"].get("content")
    )
