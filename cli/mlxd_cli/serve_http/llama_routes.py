"""llama-server-compatible routes: POST /completion, /tokenize, /detokenize; GET /health, /metrics.

Contract:
    * ``/completion`` sends ``prompt`` with ``chat=False`` (or ``prompt_tokens`` for a token list).
      ``n_predict`` -1 (the default) means "until end of sequence", bounded by the daemon's context;
      a larger ``n_predict`` is capped at that context too. ``cache_prompt: false`` bypasses the prefix cache;
      ``speculative`` and ``ignore_eos`` pass through to the daemon.
    * The answer has llama-server's fields: content, stop (true), tokens_predicted,
      tokens_evaluated, stop_type ("eos" | "word" | "limit", "none" when cancelled), stopping_word,
      truncated (false), model and timings (the daemon's, already in llama-server's names, with
      draft_kind / draft_n / draft_n_accepted when speculation ran). Streaming sends
      ``data: {"content": ..., "stop": false}`` events, then the full answer with empty content and
      ``"stop": true`` as the last event (no ``[DONE]``, as llama-server).
    * ``/health`` is 200 ``{"status": "ok"}`` when at least one daemon answers, else 503 with an
      error body; ``/metrics`` is the Prometheus page (see ``metrics``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse

from mlxd_protocol import Done, Generate, new_request_id

from .context import gateway
from .daemon_pool import DaemonHandle, DaemonPool, GenerationStream, call_daemon, open_generation
from .errors import ERROR_RESPONSES, ApiError, NoDaemonAvailable, from_daemon_failure
from .json_body import JsonBodyRoute
from .metrics import CONTENT_TYPE
from .schemas import (
    MAX_TOKENS_LIMIT, DetokenizeRequest, DetokenizeResponse, Health, LlamaCompletion, LlamaCompletionRequest,
    LlamaStreamChunk, TokenizeRequest, TokenizeResponse, build_sampling, normalize_stop)
from .request_fields import (
    LLAMA_NO_EFFECT, LLAMA_UNIMPLEMENTED, check_extra_fields, ignored_fields_header, name_daemon_field)
from .streaming import SSE_HEADERS, ClosingStreamingResponse, StreamedOutput, collect_generation, sse_body, sse_event

router = APIRouter(route_class=JsonBodyRoute)  # bodies read by json_body.parse_json
FALLBACK_CONTEXT = 4096  # n_predict -1 on a daemon that has not reported its context bound


def completion_request_builder(body: LlamaCompletionRequest):
    """``make_request(handle) -> Generate`` for a /completion body, using that daemon's defaults."""
    stop = normalize_stop(body.stop)
    overrides = body.sampling_overrides()
    speculative = body.speculative.to_protocol() if body.speculative else None
    prompt_fields = {"prompt_tokens": body.prompt} if isinstance(body.prompt, list) else {"prompt": body.prompt}
    constraint = body.constraint()

    def make_request(handle: DaemonHandle) -> Generate:
        context = min(handle.context_bound or FALLBACK_CONTEXT, MAX_TOKENS_LIMIT)
        max_tokens = context if body.n_predict == -1 else min(body.n_predict, context)
        return Generate(id=new_request_id(), **prompt_fields, chat=False, max_tokens=max_tokens, stop=stop,
                        stream=True, sampling=build_sampling(overrides, handle.sampling_defaults),
                        speculative=speculative, ignore_eos=body.ignore_eos, constraint=constraint,
                        cache_prompt=body.cache_prompt)

    return make_request


async def stop_reason(pool: DaemonPool, done: Done, tokens: list[int], stop: list[str]) -> tuple[str, str]:
    """llama-server's (stop_type, stopping_word) for a finished generation.

    The daemon says "stop" for both an end-of-sequence token and a stop string; which one it was is
    read off the raw output: the output text is cut before the first stop string, so if the
    detokenized tokens contain a stop string, the earliest one is what matched.

    Args:
        pool: The daemons (to detokenize).
        done: The generation's Done.
        tokens: Every output token.
        stop: The request's stop strings.

    Returns:
        ("limit" | "eos" | "word" | "none", the stop string that matched or "").
    """
    if done.finish_reason == "length":
        return "limit", ""
    if done.finish_reason == "cancelled":
        return "none", ""
    if not stop or not tokens:
        return "eos", ""
    raw = await call_daemon(pool, lambda client: client.detokenize(tokens))
    found = [(raw.find(word), word) for word in stop if word in raw]
    return ("word", min(found)[1]) if found else ("eos", "")


def llama_answer(model: str, content: str, done: Done, stop_type: str, stopping_word: str) -> LlamaCompletion:
    """The /completion body (also the last streamed event, with empty content)."""
    return LlamaCompletion(
        content=content, model=model, tokens_predicted=int(done.usage.get("completion_tokens", 0)),
        tokens_evaluated=int(done.usage.get("prompt_tokens", 0)),
        tokens_cached=int(done.usage.get("cached_tokens", 0)), stop_type=stop_type,
        stopping_word=stopping_word, timings=done.timings)


@router.post("/completion", response_model=LlamaCompletion,
             responses={200: {"content": {"text/event-stream": {}}}, **ERROR_RESPONSES})
async def completion(body: LlamaCompletionRequest, request: Request, response: Response):
    """Text completion, llama-server's native API (no chat template)."""
    headers = ignored_fields_header(check_extra_fields(body, LLAMA_UNIMPLEMENTED, LLAMA_NO_EFFECT))
    pool = gateway(request).pool
    try:
        stream = await open_generation(pool, completion_request_builder(body))
    except ApiError as error:
        raise name_daemon_field(error, {"constraint": "grammar" if body.grammar else "json_schema"}) from error
    if body.stream:
        return ClosingStreamingResponse(_completion_events(stream, request, normalize_stop(body.stop)),
                                        media_type="text/event-stream", headers={**SSE_HEADERS, **headers})
    result = await collect_generation(stream, request)
    if result is None:
        return Response(status_code=499)
    response.headers.update(headers)
    gateway(request).count_generation(result.done)
    stop_type, word = await stop_reason(pool, result.done, result.tokens, normalize_stop(body.stop))
    return llama_answer(gateway(request).model_name(stream.handle), result.text, result.done, stop_type, word)


def _completion_events(stream: GenerationStream, request: Request, stop: list[str]) -> AsyncIterator[bytes]:
    output = StreamedOutput()

    async def events_for(reply) -> AsyncIterator[bytes]:
        text, _ = output.add(reply)
        if text:
            yield sse_event(LlamaStreamChunk(content=text).model_dump_json())
        if isinstance(reply, Done):
            gateway(request).count_generation(reply)
            stop_type, word = await stop_reason(gateway(request).pool, reply, output.tokens, stop)
            yield sse_event(llama_answer(gateway(request).model_name(stream.handle), "", reply, stop_type, word).model_dump_json())

    return sse_body(stream, request, events_for)


@router.post("/tokenize", response_model=TokenizeResponse, responses=ERROR_RESPONSES)
async def tokenize(body: TokenizeRequest, request: Request) -> TokenizeResponse:
    """Token ids of ``content`` (``add_special`` adds BOS and the like, default false)."""
    tokens = await call_daemon(gateway(request).pool,
                               lambda client: client.tokenize(text=body.content, add_special_tokens=body.add_special))
    return TokenizeResponse(tokens=tokens)


@router.post("/detokenize", response_model=DetokenizeResponse, responses=ERROR_RESPONSES)
async def detokenize(body: DetokenizeRequest, request: Request) -> DetokenizeResponse:
    """The text of token ids."""
    text = await call_daemon(gateway(request).pool, lambda client: client.detokenize(body.tokens))
    return DetokenizeResponse(content=text)


@router.get("/health", response_model=Health, responses={503: ERROR_RESPONSES[503]})
async def health(request: Request):
    """200 when at least one daemon answers; 503 while none does (starting, loading or down)."""
    pool: DaemonPool = gateway(request).pool
    if not pool.up_handles():
        await pool.probe_all()  # do not make a client wait for the next round of the health task
    if pool.up_handles():
        return Health(status="ok")
    error = from_daemon_failure(NoDaemonAvailable(pool.down_reasons() or "no daemon answers (loading?)"))
    return JSONResponse(error.body(), status_code=503, headers=error.headers())


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(request: Request) -> PlainTextResponse:
    """Prometheus text: gateway counters and each daemon's queue, batch and speculation totals."""
    statuses = await gateway(request).pool.statuses()
    page = gateway(request).metrics.render([(handle.endpoint, handle.up, status) for handle, status in statuses])
    return PlainTextResponse(page, media_type=CONTENT_TYPE)
