"""llama-server's server-description endpoints: GET|POST /props, GET /slots.

Contract:
    * ``GET /props`` describes the first daemon that answers, in llama-server's shape:
      ``default_generation_settings`` (``n_ctx``: tokens per sequence; ``params``: the settings a request
      sending nothing runs with), ``total_slots`` (rows the daemon decodes together), ``model_alias``,
      ``model_path`` (the daemon's model as it reports it), ``n_ctx_train``, ``chat_template`` (the
      ``--chat-template`` text when one was given), ``modalities`` (text only), and which optional
      endpoints are on (``webui``: the web page, false with ``--no-webui``). ``POST /props`` is 501, as
      llama-server started without ``--props``: no global property can be changed.
    * ``GET /slots`` (501 with ``--no-slots``): one entry per row of that daemon: ``id``, ``n_ctx``,
      ``is_processing`` (the first ``active`` rows of its Status), ``id_task`` -1, ``speculative`` and an
      idle ``next_token``. mlxd keeps no fixed slot per request, so a busy entry names no request.
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from .context import gateway
from .daemon_pool import DaemonHandle
from .errors import ERROR_RESPONSES, ApiError, NoDaemonAvailable, from_daemon_failure
from .json_body import JsonBodyRoute
from .llama_answer import settings_of

router = APIRouter(route_class=JsonBodyRoute)


def _not_supported(message: str) -> ApiError:
    return ApiError(501, message, code="not_supported", error_type="not_supported_error")


async def _serving_handle(request: Request) -> DaemonHandle:
    pool = gateway(request).pool
    if not pool.up_handles():
        await pool.probe_all()
    handles = [handle for handle in pool.up_handles() if handle.status is not None]
    if not handles:
        raise from_daemon_failure(NoDaemonAvailable(pool.down_reasons() or "no daemon answers"))
    return handles[0]


def default_params(request: Request, handle: DaemonHandle) -> dict:
    """The generation settings of a /completion that sends nothing."""
    n_predict = gateway(request).settings.default_n_predict
    return settings_of(
        handle,
        {},
        n_predict=-1 if n_predict is None else n_predict,
        stop=[],
        ignore_eos=False,
        stream=False,
        cache_prompt=True,
        n_probs=0,
        token_bias={},
    )


@router.get("/props", responses=ERROR_RESPONSES)
async def props(request: Request) -> dict:
    """What this server serves and how (llama-server's /props)."""
    context = gateway(request)
    handle = await _serving_handle(request)
    assert handle.status is not None  # _serving_handle gives a handle with a Status
    options = handle.status.options
    return {
        "default_generation_settings": {
            "id": 0,
            "id_task": -1,
            "n_ctx": handle.context_bound,
            "speculative": False,
            "is_processing": False,
            "params": default_params(request, handle),
        },
        "total_slots": handle.status.max_batch,
        "model_alias": context.model_name(handle),
        "model_path": handle.status.model,
        "n_ctx_train": options.get("context_length"),
        "chat_template": options.get("chat_template") or "",
        "modalities": {"vision": False, "audio": False},
        "endpoint_slots": context.settings.slots_enabled,
        "endpoint_props": False,
        "endpoint_metrics": context.settings.metrics_enabled,
        "webui": context.settings.ui_enabled,
        "is_sleeping": False,
        "cors_proxy_enabled": context.settings.ui_mcp_proxy,
        "build_info": f"mlxd {handle.status.daemon_version}",
    }


@router.post("/props", responses=ERROR_RESPONSES)
async def change_props(request: Request) -> dict:
    """501: no global property can be changed (llama-server without --props)."""
    raise _not_supported("this server does not support changing global properties")


@router.get("/slots", responses=ERROR_RESPONSES)
async def slots(request: Request) -> list[dict]:
    """One entry per row of the first daemon that answers (501 with --no-slots)."""
    if not gateway(request).settings.slots_enabled:
        raise _not_supported("this server does not support slots endpoint (started with --no-slots)")
    handle = await _serving_handle(request)
    fresh = dict((one.endpoint, status) for one, status in await gateway(request).pool.statuses())
    status = fresh.get(handle.endpoint) or handle.status
    assert status is not None  # _serving_handle gives a handle with a Status
    return [
        {
            "id": index,
            "id_task": -1,
            "n_ctx": handle.context_bound,
            "speculative": False,
            "is_processing": index < status.active,
            "next_token": [{"has_next_token": index < status.active, "n_remain": -1, "n_decoded": 0}],
        }
        for index in range(status.max_batch)
    ]
