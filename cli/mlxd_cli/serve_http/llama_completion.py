"""llama-server's completion endpoint: POST /completion (and /completions, its other name there).

Contract:
    * Prompts: every form ``schemas.llama.LlamaCompletionBody`` takes. A string goes to the daemon as
      ``prompt`` (BOS added), token ids as ``prompt_tokens``; a list mixing ids and strings is one prompt,
      its strings tokenized here (BOS only before a leading string); a list of prompts gets a list of
      answers, generated concurrently (not streamed: 400 naming ``prompt``).
    * ``n_predict`` -1 (the default) means "until end of sequence", bounded by the daemon's context: the
      prompt and its output together fill at most the context, as llama-server's (a text prompt is then
      tokenized here first, to know its length); the gateway's ``--n-predict`` is the default, which a
      request's own n_predict overrides (as today's llama-server: it no longer caps a request at its
      --n-predict). ``cache_prompt: false`` bypasses the
      prefix cache; ``speculative`` and ``ignore_eos`` pass through; ``n_probs`` asks for that many
      alternatives per token (``completion_probabilities``, log-probabilities of the model's distribution;
      with ``post_sampling_probs`` probabilities of the distribution the sampler draws from, as ``prob`` and
      ``top_probs``: the daemon refuses it beside penalties, logit_bias, a grammar or ignore_eos).
      ``logit_bias`` (llama-server's forms, ``schemas.llama``) goes to the daemon by token id: a text's
      tokens (tokenized without special tokens, as llama-server does) each get its bias, and biases of one
      token add up (false, -inf, wins); a token id outside the vocabulary is the daemon's 400.
    * The answer has llama-server's fields: index, content, tokens (the output's ids with
      ``return_tokens``, else []), id_slot (-1: mlxd has no fixed slots), stop, model, tokens_predicted,
      tokens_evaluated, tokens_cached, generation_settings (the settings the request ran with), prompt
      (the prompt's tokens as text), has_new_line, truncated (true when the context bound ended the
      output), stop_type ("eos" | "word" | "limit", "none" when cancelled), stopping_word and timings
      (the daemon's, unrounded, with draft_kind / draft_n / draft_n_accepted when speculation ran).
      ``response_fields`` keeps only the named fields, "a/b" naming b inside a (the key stays "a/b").
    * Streaming sends one event per daemon chunk (one token each when the daemon streams every token:
      ``mlxd --stream-interval-ms 0``) with content, tokens, stop false and, with ``n_probs``, that chunk's
      ``completion_probabilities``; then the full answer with empty content and tokens, stop true (no
      ``[DONE]``, as llama-server). With ``return_progress`` (streams only) events with empty content and
      ``prompt_progress`` (``total``, ``cache``, ``processed``, ``time_ms``) come first, as the daemon
      prefills the prompt (one when it starts, one after each ``mlxd --prefill-chunk`` tokens). With
      ``timings_per_token`` every streamed event carries ``timings`` so far (the daemon's, on each chunk; of
      the prefill, on a progress event).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from mlxd_protocol import Done, Generate, Progress, new_request_id

from .context import gateway
from .daemon_pool import DaemonHandle, DaemonPool, GenerationStream, call_daemon, open_generation
from .errors import ERROR_RESPONSES, ApiError
from .json_body import JsonBodyRoute
from .llama_answer import final_answer, per_token_events, pick_fields, prefill_timings, probabilities, prompt_as_text
from .request_fields import (
    LLAMA_NO_EFFECT,
    LLAMA_UNIMPLEMENTED,
    check_extra_fields,
    ignored_fields_header,
    name_daemon_field,
)
from .schemas import MAX_TOKENS_LIMIT, build_sampling, normalize_stop, shared_drafts
from .schemas.llama import LlamaCompletionBody, PromptObject, is_single_prompt
from .streaming import SSE_HEADERS, ClosingStreamingResponse, StreamedOutput, collect_generation, sse_body, sse_event

router = APIRouter(route_class=JsonBodyRoute)
FALLBACK_CONTEXT = 4096  # n_predict -1 on a daemon that has not reported its context bound


async def prompt_fields(pool: DaemonPool, prompt: Any) -> dict:
    """The Generate fields of one llama-server prompt (``prompt`` or ``prompt_tokens``).

    Raises:
        ApiError: 400 for a JSON prompt carrying media.
    """
    if isinstance(prompt, dict):
        item = PromptObject.model_validate(prompt)
        if item.multimodal_data:
            raise ApiError(
                400,
                "prompt: multimodal_data is not supported (this model takes text only)",
                param="prompt",
                code="unsupported_field",
            )
        return {"prompt": item.prompt_string}
    if isinstance(prompt, str):
        return {"prompt": prompt}
    if all(isinstance(part, int) for part in prompt):
        return {"prompt_tokens": list(prompt)}
    tokens: list[int] = []
    for index, part in enumerate(prompt):  # llama-server's mixed prompt: BOS only before a leading string
        if isinstance(part, int):
            tokens.append(part)
        else:
            tokens += await call_daemon(
                pool,
                # mypy cannot infer the type of a lambda with default arguments
                lambda client, text=part, first=index == 0: client.tokenize(  # type: ignore[misc]
                    text=text, add_special_tokens=first
                ),
            )
    return {"prompt_tokens": tokens}


async def resolve_logit_bias(pool: DaemonPool, body: LlamaCompletionBody) -> None:
    """Resolve ``body.logit_bias`` to token ids (``body.set_token_bias``): texts tokenized on a daemon."""
    entries = body.bias_entries()
    texts = list(dict.fromkeys(token for token, _ in entries if isinstance(token, str)))
    tokenized = await asyncio.gather(
        *(
            call_daemon(
                pool,
                # mypy cannot infer the type of a lambda with default arguments
                lambda client, text=text: client.tokenize(text=text, add_special_tokens=False),  # type: ignore[misc]
            )
            for text in texts
        )
    )
    tokens_of = dict(zip(texts, tokenized, strict=True))
    bias: dict[int, float] = {}
    for token, value in entries:
        for token_id in tokens_of[token] if isinstance(token, str) else (token,):
            bias[token_id] = bias.get(token_id, 0.0) + value
    body.set_token_bias(bias)


def effective_n_predict(body: LlamaCompletionBody, server_default: int | None) -> int:
    """The request's n_predict (-1 too), else the gateway's ``--n-predict`` (-1: until end of sequence)."""
    if "n_predict" not in body.model_fields_set and server_default is not None:
        return server_default
    return body.n_predict


def request_builder(body: LlamaCompletionBody, fields: dict, n_predict: int):
    """``make_request(handle) -> Generate`` for one prompt, using that daemon's defaults."""
    overrides = body.sampling_overrides()
    if body.n_probs:
        overrides["logprobs"] = body.n_probs
        if body.post_sampling_probs:
            overrides["post_sampling"] = True
    if body.token_bias():
        overrides["logit_bias"] = body.token_bias()
    speculative = body.speculative.to_protocol() if body.speculative else None

    prompt_length = len(fields.get("prompt_tokens") or ())

    def make_request(handle: DaemonHandle) -> Generate:
        context = min(handle.context_bound or FALLBACK_CONTEXT, MAX_TOKENS_LIMIT)
        if handle.shifts_context:  # a full context is shifted, never the end (llama-server's --context-shift)
            max_tokens = MAX_TOKENS_LIMIT if n_predict == -1 else n_predict
        elif n_predict == -1:  # until the context is full: the prompt and its output fill it, as llama-server's
            max_tokens = context - prompt_length if 0 < prompt_length < context else context
        else:
            max_tokens = min(n_predict, context)
        return Generate(
            id=new_request_id(),
            **fields,
            chat=False,
            max_tokens=max_tokens,
            stop=normalize_stop(body.stop),
            stream=True,
            sampling=build_sampling(overrides, handle.sampling_defaults),
            speculative=speculative,
            shared_drafts=shared_drafts(body.speculative),
            ignore_eos=body.ignore_eos,
            constraint=body.constraint(),
            cache_prompt=body.cache_prompt,
            return_progress=body.return_progress,
            timings_per_token=body.timings_per_token and body.stream,
            n_keep=body.n_keep,
            n_discard=body.n_discard,
        )

    return make_request


async def open_one(request: Request, body: LlamaCompletionBody, prompt: Any, n_predict: int):
    """Open the generation of one prompt: (stream, its Generate fields)."""
    pool = gateway(request).pool
    fields = await prompt_fields(pool, prompt)
    if n_predict == -1 and "prompt" in fields:
        # the prompt's length bounds the output (request_builder): tokenized here as the daemon would
        fields = {"prompt_tokens": await call_daemon(pool, lambda client: client.tokenize(text=fields["prompt"]))}
    try:
        stream = await open_generation(pool, request_builder(body, fields, n_predict))
    except ApiError as error:
        raise name_daemon_field(error, {"constraint": "grammar" if body.grammar else "json_schema"}) from error
    return stream, fields


@router.post("/completion", responses={200: {"content": {"text/event-stream": {}}}, **ERROR_RESPONSES})
@router.post("/completions", include_in_schema=False)
async def completion(body: LlamaCompletionBody, request: Request, response: Response):
    """Text completion, llama-server's native API (no chat template)."""
    headers = ignored_fields_header(check_extra_fields(body, LLAMA_UNIMPLEMENTED, LLAMA_NO_EFFECT))
    prompts = body.prompts()
    if body.stream and len(prompts) > 1:
        raise ApiError(400, "prompt: a streamed completion takes one prompt", param="prompt", code="invalid_value")
    n_predict = effective_n_predict(body, gateway(request).settings.default_n_predict)
    if body.logit_bias:
        await resolve_logit_bias(gateway(request).pool, body)
    if body.stream:
        stream, fields = await open_one(request, body, prompts[0], n_predict)
        events = _completion_events(request, body, stream, fields, n_predict)
        return ClosingStreamingResponse(events, media_type="text/event-stream", headers={**SSE_HEADERS, **headers})
    answers = await asyncio.gather(
        *(_answer_one(request, body, prompt, n_predict, index) for index, prompt in enumerate(prompts))
    )
    if any(answer is None for answer in answers):
        return Response(status_code=499)  # the client left; nobody reads this
    if body.response_fields:
        answers = [pick_fields(answer, body.response_fields) for answer in answers]  # type: ignore[arg-type]  # no None
    return JSONResponse(answers[0] if is_single_prompt(body.prompt) else answers, headers=headers)


async def _answer_one(
    request: Request, body: LlamaCompletionBody, prompt: Any, n_predict: int, index: int
) -> dict | None:
    stream, fields = await open_one(request, body, prompt, n_predict)
    result = await collect_generation(stream, request)
    if result is None:
        return None
    gateway(request).count_generation(result.done)
    prompt_text = await prompt_as_text(gateway(request).pool, fields)
    answer = await final_answer(
        request, body, stream, result.done, result.text, result.tokens, prompt_text, n_predict, index
    )
    if body.n_probs:
        answer["completion_probabilities"] = await probabilities(
            gateway(request), result.logprobs, body.post_sampling_probs
        )
    return answer


def _completion_events(
    request: Request, body: LlamaCompletionBody, stream: GenerationStream, fields: dict, n_predict: int
) -> AsyncIterator[bytes]:
    output = StreamedOutput()

    async def events_for(reply) -> AsyncIterator[bytes]:
        if isinstance(reply, Progress):
            progress = {"total": reply.total, "cache": reply.cache, "processed": reply.processed}
            event = {"index": 0, "content": "", "tokens": [], "stop": False, "id_slot": -1}
            if body.timings_per_token:
                event["timings"] = prefill_timings(reply)
            yield sse_event(json.dumps({**event, "prompt_progress": {**progress, "time_ms": reply.time_ms}}))
            return
        text, tokens = output.add(reply)
        if isinstance(reply, Done):
            if text or tokens:
                yield sse_event(
                    json.dumps({"index": 0, "content": text, "tokens": tokens, "stop": False, "id_slot": -1})
                )
            gateway(request).count_generation(reply)
            prompt_text = await prompt_as_text(gateway(request).pool, fields)
            answer = await final_answer(request, body, stream, reply, "", output.tokens, prompt_text, n_predict, 0)
            if body.response_fields:
                answer = pick_fields(answer, body.response_fields) | {"stop": True}
            yield sse_event(json.dumps(answer))
            return
        if not (text or tokens):
            return
        timed = {"timings": reply.timings} if reply.timings else {}
        if body.n_probs and reply.logprobs:
            probs = await probabilities(gateway(request), reply.logprobs, body.post_sampling_probs)
            for piece, token_ids, token_probs in per_token_events(text, tokens, probs):
                event = {"index": 0, "content": piece, "tokens": token_ids, "stop": False, "id_slot": -1, **timed}
                yield sse_event(json.dumps({**event, "completion_probabilities": token_probs}))
            return
        event = {"index": 0, "content": text, "tokens": tokens, "stop": False, "id_slot": -1, **timed}
        yield sse_event(json.dumps(event))

    return sse_body(stream, request, events_for)
