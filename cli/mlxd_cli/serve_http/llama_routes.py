"""llama-server-compatible routes: POST /completion(s), /tokenize, /detokenize, /apply-template, GET|POST
/props, GET /slots, /health, /metrics.

Contract:
    * ``/completion`` (and ``/completions``, its other name in llama-server) is ``llama_completion``;
      ``/props`` and ``/slots`` are ``llama_props``. This router includes both.
    * ``/apply-template``: ``{"prompt": text}``, the chat (``messages``, ``tools``, ``add_generation_prompt``,
      ``chat_template_kwargs``) through the chat template as a chat completion of it would be prompted
      (the daemon's ``--reasoning`` included); nothing is generated. Fields it does not define are a 400.
    * ``/tokenize``: ``{"tokens": [...]}``, with ``with_pieces`` ``{"tokens": [{"id", "piece"}, ...]}`` (a
      piece is the token's text; bytes that are not whole UTF-8 characters come as a list of byte values,
      as llama-server sends them).
    * ``/health`` (and ``/v1/health``) is 200 ``{"status": "ok"}`` when at least one daemon answers, else
      503 with an error body; ``/metrics`` is the Prometheus page (see ``metrics``), 501 with ``--no-metrics``.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from . import llama_completion, llama_props
from .context import gateway
from .daemon_pool import DaemonPool, call_daemon
from .errors import ERROR_RESPONSES, ApiError, NoDaemonAvailable, from_daemon_failure
from .json_body import JsonBodyRoute
from .metrics import CONTENT_TYPE
from .schemas import DetokenizeRequest, DetokenizeResponse, Health
from .schemas.llama import ApplyTemplateBody, TokenizeBody

router = APIRouter(route_class=JsonBodyRoute)  # bodies read by json_body.parse_json
router.include_router(llama_completion.router)
router.include_router(llama_props.router)


@router.post("/tokenize", responses=ERROR_RESPONSES)
async def tokenize(body: TokenizeBody, request: Request) -> dict:
    """Token ids of ``content`` (``add_special`` adds BOS and the like, default false)."""
    context = gateway(request)
    tokens = await call_daemon(
        context.pool, lambda client: client.tokenize(text=body.content, add_special_tokens=body.add_special)
    )
    if not body.with_pieces:
        return {"tokens": tokens}
    texts = await context.token_texts([{"token": token} for token in tokens])
    return {"tokens": [{"id": token, "piece": _piece(texts[token])} for token in tokens]}


@router.post("/apply-template", responses=ERROR_RESPONSES)
async def apply_template(body: ApplyTemplateBody, request: Request) -> dict:
    """The prompt text a chat renders to through the model's chat template."""
    unknown = sorted(body.model_extra or {})
    if unknown:
        raise ApiError(400, f"{unknown[0]}: not a field of /apply-template", param=unknown[0], code="unsupported_field")
    messages = [message.to_protocol() for message in body.messages]
    tools = [tool.to_protocol() for tool in body.tools] if body.tools else None
    try:
        text = await call_daemon(
            gateway(request).pool,
            lambda client: client.render_chat(messages, tools, body.add_generation_prompt, body.chat_template_kwargs),
        )
    except ApiError as error:
        if error.status == 400 and "no chat template" in error.message:
            raise ApiError(
                400,
                "this model has no chat template (start the server with --chat-template)",
                param="messages",
                code=error.code,
            ) from error
        raise
    return {"prompt": text}


def _piece(text: str) -> str | list[int]:
    """A token's piece: its text, or its bytes when the text is not whole characters (U+FFFD in it)."""
    return list(text.encode("utf-8", "surrogateescape")) if "\ufffd" in text else text


@router.post("/detokenize", response_model=DetokenizeResponse, responses=ERROR_RESPONSES)
async def detokenize(body: DetokenizeRequest, request: Request) -> DetokenizeResponse:
    """The text of token ids."""
    text = await call_daemon(gateway(request).pool, lambda client: client.detokenize(body.tokens))
    return DetokenizeResponse(content=text)


@router.get("/health", response_model=Health, responses={503: ERROR_RESPONSES[503]})
@router.get("/v1/health", include_in_schema=False)  # llama-server's other name for it
async def health(request: Request):
    """200 when at least one daemon answers; 503 while none does (starting, loading or down)."""
    pool: DaemonPool = gateway(request).pool
    if not pool.up_handles():
        await pool.probe_all()  # do not make a client wait for the next round of the health task
    if pool.up_handles():
        return Health(status="ok")
    error = from_daemon_failure(NoDaemonAvailable(pool.down_reasons() or "no daemon answers (loading?)"))
    return JSONResponse(error.body(), status_code=503, headers=error.headers())


@router.get("/metrics", response_class=PlainTextResponse, responses={501: ERROR_RESPONSES[500]})
async def metrics(request: Request) -> PlainTextResponse:
    """Prometheus text: gateway counters (also under llama-server's names) and each daemon's queue, batch and
    speculation totals."""
    context = gateway(request)
    if not context.settings.metrics_enabled:
        raise ApiError(
            501,
            "this server does not serve /metrics (started without --metrics)",
            code="not_supported",
            error_type="not_supported_error",
        )
    statuses = await context.pool.statuses()
    page = context.metrics.render([(handle.endpoint, handle.up, status) for handle, status in statuses])
    return PlainTextResponse(
        page, media_type=CONTENT_TYPE, headers={"Process-Start-Time-Unix": str(int(context.metrics.started))}
    )
