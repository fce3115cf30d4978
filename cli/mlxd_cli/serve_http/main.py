"""``mlx-serve-http``: serve mlxd over HTTP with OpenAI's and llama-server's APIs.

    mlx-serve-http [--daemon ENDPOINT ...] [-m MODEL] [--alias NAME,...] [--tags TAGS] [--host 127.0.0.1 ...]
                   [--port 8080]
                   [--api-key KEY[,KEY...]] [--api-key-file FILE]
                   [--allowed-hosts NAMES] [--cors-origins ORIGINS] [--cors-methods M]
                   [--cors-headers H] [--cors-credentials/--no-cors-credentials]
                   [--draft-kind KIND] [--draft-block-size N] [--prompt-lookup-max-batch N] [--no-shared-drafts]
                   [--kv-dtype float32|float16] [--cpu-weights FORM]
                   [--seed N] [--chat-template NAME|JINJA] [--chat-template-file FILE] [--reasoning on|off|auto]
                   [--n-predict N] [--metrics/--no-metrics] [--slots/--no-slots] [--webui/--no-webui] [--ui-mcp-proxy]
                   [--verbose-replies]
                   [--max-concurrency N] [--max-body-bytes N] [--header-timeout S] [--body-timeout S]

Without ``--daemon`` the default endpoint is used and mlxd is started there if none answers (with
``-m`` and the daemon options); a daemon started here is supervised: restarted, with back-off, whenever
it exits (``supervisor``). With one or more ``--daemon`` the daemons must be running already; requests
go to the least busy one that is up, and one that goes away is waited for, never restarted. ``--host``
may be given several times (or as a comma-separated list): the gateway listens on every address.
"""

from __future__ import annotations

import logging
import socket
import sys

import click

from mlxd_protocol.autostart import AutostartError, daemon_answers, start_daemon
from mlxd_protocol.endpoints import default_endpoint, parse_endpoint
from mlxd_protocol.serving_defaults import CPU_WEIGHT_FORMS, KV_DTYPE_NAMES, REASONING_MODES

from .app import DEFAULT_MAX_BODY_BYTES, Settings, create_app
from .http_timeouts import header_timeout_protocol
from .request_guard import WILDCARD_ADDRESSES, default_allowed_hosts
from .settings import DEFAULT_BODY_TIMEOUT_S, DEFAULT_CORS_HEADERS, DEFAULT_CORS_METHODS, DEFAULT_HEADER_TIMEOUT_S
from .supervisor import DaemonSupervisor


def daemon_args(
    draft_kind: str | None,
    draft_block_size: int | None,
    prompt_lookup_max_batch: int | None,
    seed: int | None = None,
    chat_template: str | None = None,
    chat_template_file: str | None = None,
    reasoning: str | None = None,
    shared_drafts: bool | None = None,
    context_shift: bool | None = None,
    kv_dtype: str | None = None,
    cpu_weights: str | None = None,
) -> list[str]:
    """The ``mlxd`` options for a daemon this command starts.

    Args:
        draft_kind: ``--draft-kind`` (prompt-lookup or none), or None.
        draft_block_size: ``--draft-block-size``, or None.
        prompt_lookup_max_batch: ``--prompt-lookup-max-batch``, or None.
        seed: ``--seed`` (the default sampling seed), or None.
        chat_template: ``--chat-template`` (a built-in name or Jinja text), or None.
        chat_template_file: ``--chat-template-file``, or None.
        reasoning: ``--reasoning`` (on, off or auto), or None.
        shared_drafts: ``--shared-drafts`` / ``--no-shared-drafts``, or None (the daemon's default).
        context_shift: ``--context-shift`` / ``--no-context-shift``, or None (the daemon's default: off).
        kv_dtype: ``--kv-dtype`` (float32 or float16), or None (the daemon's default: float32).
        cpu_weights: ``--cpu-weights`` (one of ``CPU_WEIGHT_FORMS``), or None (the daemon's default).

    Returns:
        The argument list (empty when all are None).
    """
    args: list[str] = []
    for flag, value in (
        ("--draft-kind", draft_kind),
        ("--draft-block-size", draft_block_size),
        ("--prompt-lookup-max-batch", prompt_lookup_max_batch),
        ("--seed", seed),
        ("--chat-template", chat_template),
        ("--chat-template-file", chat_template_file),
        ("--reasoning", reasoning),
        ("--kv-dtype", kv_dtype),
        ("--cpu-weights", cpu_weights),
    ):
        if value is not None:
            args += [flag, str(value)]
    if shared_drafts is not None:
        args.append("--shared-drafts" if shared_drafts else "--no-shared-drafts")
    if context_shift is not None:
        args.append("--context-shift" if context_shift else "--no-context-shift")
    return args


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--daemon",
    "daemons",
    multiple=True,
    help="mlxd endpoint to forward to (repeatable; default: the private ipc socket, started if needed)",
)
@click.option(
    "-m",
    "--model",
    default=None,
    help="model for a daemon started by this command: checkpoint directory, .gguf file, hub id or 'embedded' "
    "(default: the default model, SmolLM2-135M-Instruct)",
)
@click.option(
    "--alias",
    default=None,
    help="the model name replies carry (default: the checkpoint's directory name); comma-separated: the "
    "model's names, the first carried by replies, all listed by /v1/models as aliases",
)
@click.option("--tags", default=None, help="comma-separated informational tags /v1/models lists (llama-server's)")
@click.option(
    "--host",
    "hosts",
    multiple=True,
    default=["127.0.0.1"],
    show_default=True,
    help="address to listen on (repeatable, or comma-separated: every one is listened on)",
)
@click.option("--port", default=8080, show_default=True, type=click.IntRange(1, 65535))
@click.option(
    "--api-key",
    default=None,
    envvar="MLXD_HTTP_API_KEY",
    help="require 'Authorization: Bearer KEY' on every endpoint but /health; several keys comma-separated, each "
    "with a shared draft store of its own (env MLXD_HTTP_API_KEY)",
)
@click.option(
    "--api-key-file",
    default=None,
    type=click.Path(dir_okay=False),
    help="a file of API keys, one a line (blank lines skipped), accepted besides --api-key's",
)
@click.option(
    "--allowed-hosts",
    default=None,
    help="comma-separated Host header names answered besides the loopback names and --host; '*': any "
    "(default: only those; any when --host is a wildcard address such as 0.0.0.0)",
)
@click.option(
    "--cors-origins",
    default="",
    help="comma-separated browser origins allowed to call the API (CORS), e.g. http://localhost:3000; "
    "'*': any (default: none)",
)
@click.option(
    "--cors-methods",
    default=DEFAULT_CORS_METHODS,
    show_default=True,
    help="comma-separated methods a CORS preflight allows ('*': any)",
)
@click.option(
    "--cors-headers",
    default=DEFAULT_CORS_HEADERS,
    show_default=True,
    help="comma-separated request headers a CORS preflight allows ('*': any; sent as '*', which browsers "
    "do not read as covering Authorization)",
)
@click.option(
    "--cors-credentials/--no-cors-credentials",
    default=False,
    show_default=True,
    help="allow credentialed CORS requests (cookies, HTTP auth); with --cors-origins '*' the request's "
    "origin is echoed back, so any web page may call the API with the browser's credentials",
)
@click.option(
    "--draft-kind",
    default=None,
    type=click.Choice(["prompt-lookup", "none"]),
    help="speculative decoding for a daemon started here",
)
@click.option("--draft-block-size", default=None, type=click.IntRange(1), help="most draft tokens per verify round")
@click.option(
    "--prompt-lookup-max-batch",
    default=None,
    type=click.IntRange(0),
    help="verify gate of a daemon started here: no verify rounds above this many rows",
)
@click.option(
    "--kv-dtype",
    default=None,
    type=click.Choice(KV_DTYPE_NAMES),
    help="for a daemon started here: keys and values kept as float16 (half the KV memory and reads, as "
    "llama-server's default cache) or float32 (the default)",
)
@click.option(
    "--cpu-weights",
    default=None,
    type=click.Choice(CPU_WEIGHT_FORMS),
    help="for a daemon started here, on the CPU backend: kernel-int8 rounds each product's input to int8 "
    "(opt-in, as llama.cpp does: faster, not the float32 path's numbers); see mlxd --help",
)
@click.option(
    "--context-shift/--no-context-shift",
    default=None,
    help="llama-server's context shift for a daemon started here: a request whose context fills keeps its "
    "first n_keep tokens, drops half of the rest (or n_discard) and goes on (default: off, it ends there)",
)
@click.option(
    "--shared-drafts/--no-shared-drafts",
    default=None,
    help="shared draft store of a daemon started here: prompt lookup also drafts from earlier requests' "
    "outputs (default: the daemon's, on)",
)
@click.option(
    "--seed",
    default=None,
    type=click.IntRange(0, 2**63 - 1),
    help="default sampling seed of a daemon started here (requests that send none)",
)
@click.option(
    "--chat-template",
    default=None,
    help="chat template of a daemon started here instead of the model's: chatml, llama2, llama3, "
    "command-r, or Jinja text",
)
@click.option(
    "--chat-template-file",
    default=None,
    type=click.Path(dir_okay=False, exists=True),
    help="file holding the Jinja chat template of a daemon started here",
)
@click.option(
    "--reasoning",
    default=None,
    type=click.Choice(REASONING_MODES),
    help="thinking in the chat template of a daemon started here (mlxd --reasoning; default auto)",
)
@click.option(
    "--n-predict",
    default=None,
    type=click.IntRange(-1),
    help="llama-server's --n-predict: the token limit of a request that sends none (n_predict, max_tokens) "
    "(-1 or unset: until end of sequence)",
)
@click.option(
    "--metrics/--no-metrics",
    default=True,
    show_default=True,
    help="serve /metrics (off: 501, as llama-server without --metrics)",
)
@click.option("--slots/--no-slots", default=True, show_default=True, help="serve llama-server's /slots (off: 501)")
@click.option(
    "--webui/--no-webui",
    "--ui/--no-ui",
    "ui",
    default=True,
    show_default=True,
    help="serve the web UI: a chat page at /, the scheduler live at /ui/ticks (off: 404; llama-server's names)",
)
@click.option(
    "--ui-mcp-proxy/--no-ui-mcp-proxy",
    default=False,
    show_default=True,
    help="serve llama-server's /cors-proxy?url=URL: a GET or POST forwarded to URL with only the headers named "
    "x-llama-server-proxy-header-NAME (off: 403)",
)
@click.option(
    "--verbose-replies/--no-verbose-replies",
    default=False,
    show_default=True,
    help="OpenAI-style replies carry llama-server's __verbose debug object (its native answer: the prompt as "
    "tokenized, generation settings, ...) unless a request sends verbose: false (llama-server's --verbose)",
)
@click.option(
    "--max-concurrency",
    default=None,
    type=click.IntRange(1),
    help="most requests in flight; more are answered 429 at once (default: no limit)",
)
@click.option(
    "--max-requests-per-client",
    default=32,
    show_default=True,
    type=click.IntRange(1),
    help="most requests in flight from one client address; more are answered 429",
)
@click.option(
    "--max-body-bytes",
    default=DEFAULT_MAX_BODY_BYTES,
    show_default=True,
    type=click.IntRange(1),
    help="largest request body; larger ones are answered 413",
)
@click.option(
    "--header-timeout",
    default=DEFAULT_HEADER_TIMEOUT_S,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="seconds a client has to send a request's headers; slower connections are closed",
)
@click.option(
    "--body-timeout",
    default=DEFAULT_BODY_TIMEOUT_S,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="seconds a client has to send a request's body, once its headers came; then 408",
)
@click.option(
    "--log-level", default="info", show_default=True, type=click.Choice(["debug", "info", "warning", "error"])
)
def main(
    daemons,
    model,
    alias,
    tags,
    hosts,
    port,
    api_key,
    api_key_file,
    allowed_hosts,
    cors_origins,
    cors_methods,
    cors_headers,
    cors_credentials,
    draft_kind,
    draft_block_size,
    prompt_lookup_max_batch,
    kv_dtype,
    cpu_weights,
    context_shift,
    shared_drafts,
    seed,
    chat_template,
    chat_template_file,
    reasoning,
    n_predict,
    metrics,
    slots,
    ui,
    ui_mcp_proxy,
    verbose_replies,
    max_concurrency,
    max_requests_per_client,
    max_body_bytes,
    header_timeout,
    body_timeout,
    log_level,
):
    """Serve the mlxd daemon(s) over HTTP (OpenAI and llama-server APIs)."""
    import uvicorn

    logging.basicConfig(
        level=log_level.upper(), stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    extra_args = daemon_args(
        draft_kind,
        draft_block_size,
        prompt_lookup_max_batch,
        seed,
        chat_template,
        chat_template_file,
        reasoning,
        shared_drafts,
        context_shift,
        kv_dtype,
        cpu_weights,
    )
    hosts = list(dict.fromkeys(name.strip() for value in hosts for name in value.split(",") if name.strip()))
    aliases = split_names(alias)
    endpoints = list(dict.fromkeys(daemons))  # the same daemon twice would only skew the balance
    supervisor = None
    try:
        for endpoint in endpoints:
            parse_endpoint(endpoint)
        if not endpoints:
            endpoint = default_endpoint()
            if not daemon_answers(endpoint):
                process = start_daemon(endpoint, model, extra_args)
                supervisor = DaemonSupervisor(endpoint, model, extra_args, process)
                click.echo(
                    f"mlx-serve-http: started mlxd at {endpoint} (pid {process.pid}); it is restarted if it exits",
                    err=True,
                )
            endpoints = [endpoint]
        elif model or extra_args:
            click.echo(
                "mlx-serve-http: -m and the daemon options only apply to a daemon started here; ignored with --daemon",
                err=True,
            )
    except (ValueError, AutostartError) as error:
        click.echo(f"mlx-serve-http: {error}", err=True)
        sys.exit(1)
    try:
        api_key = joined_api_keys(api_key, api_key_file)
    except ValueError as error:
        click.echo(f"mlx-serve-http: {error}", err=True)
        sys.exit(1)
    for host in hosts:
        if host not in ("127.0.0.1", "::1", "localhost") and not api_key:
            click.echo(f"mlx-serve-http: warning: listening on {host} without --api-key", err=True)
    names = allowed_hosts.split(",") if allowed_hosts is not None else None
    allowed = frozenset().union(*(default_allowed_hosts(host, names) or {"*"} for host in hosts))
    allowed = None if "*" in allowed else allowed
    settings = Settings(
        daemons=endpoints,
        api_key=api_key,
        max_concurrency=max_concurrency,
        max_body_bytes=max_body_bytes,
        max_requests_per_client=max_requests_per_client,
        model_alias=aliases[0] if aliases else None,
        model_aliases=aliases,
        model_tags=split_names(tags),
        allowed_hosts=allowed,
        default_n_predict=None if n_predict == -1 else n_predict,
        metrics_enabled=metrics,
        slots_enabled=slots,
        ui_enabled=ui,
        ui_mcp_proxy=ui_mcp_proxy,
        verbose_replies=verbose_replies,
        cors_origins=tuple(origin.strip().rstrip("/") for origin in cors_origins.split(",") if origin.strip()),
        cors_methods=cors_methods,
        cors_headers=cors_headers,
        cors_credentials=cors_credentials,
        header_timeout_s=header_timeout,
        body_timeout_s=body_timeout,
    )
    urls = ", ".join(f"http://{f'[{host}]' if ':' in host else host}:{port}" for host in hosts)
    click.echo(f"mlx-serve-http on {urls} -> {', '.join(endpoints)}", err=True)
    if ui:
        page = f"http://{page_host(hosts[0])}:{port}/"
        click.echo(f"mlx-serve-http: chat page at {page} (the scheduler live: {page}ui/ticks)", err=True)
    config = uvicorn.Config(
        create_app(settings, supervisor),
        host=hosts[0],
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=5,
        http=header_timeout_protocol(header_timeout),
    )
    if len(hosts) == 1:
        uvicorn.Server(config).run()
        return
    try:
        sockets = [listening_socket(host, port) for host in hosts]
    except OSError as error:
        click.echo(f"mlx-serve-http: cannot listen: {error}", err=True)
        sys.exit(1)
    uvicorn.Server(config).run(sockets=sockets)


def joined_api_keys(api_key: str | None, api_key_file: str | None) -> str | None:
    """``--api-key``'s keys and ``--api-key-file``'s (one a line) as one comma-separated list (None: no keys).

    Raises:
        ValueError: The file cannot be read, or one of its keys holds a comma.
    """
    if api_key is not None and not any(key.strip() for key in api_key.split(",")):
        raise ValueError("--api-key: no key in it")
    if api_key_file is None:
        return api_key
    try:
        with open(api_key_file, encoding="utf-8") as handle:
            lines = [line.strip() for line in handle]
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"cannot read --api-key-file {api_key_file}: {error}") from None
    keys = [line for line in lines if line]
    if any("," in key for key in keys):
        raise ValueError(f"--api-key-file {api_key_file}: a key cannot hold a comma")
    joined = ",".join([*([api_key] if api_key else []), *keys])
    return joined or None


def page_host(host: str) -> str:
    """The host of the web UI's address as a browser on this machine writes it (a wildcard: localhost)."""
    host = host.strip()
    if host in WILDCARD_ADDRESSES:
        return "localhost"
    return f"[{host}]" if ":" in host else host


def split_names(value: str | None) -> tuple[str, ...]:
    """A comma-separated option's names: stripped, empty ones and repeats dropped, in the order given."""
    return tuple(dict.fromkeys(name.strip() for name in (value or "").split(",") if name.strip()))


def listening_socket(host: str, port: int) -> socket.socket:
    """A bound, listening TCP socket on ``host`` (an IPv4 or IPv6 address, or a name) and ``port``."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[
        0
    ]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # "::" and "0.0.0.0" may both be given
    sock.bind(address)
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


if __name__ == "__main__":
    main()
