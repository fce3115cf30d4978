"""``mlx-serve-http``: serve mlxd over HTTP with OpenAI's and llama-server's APIs.

    mlx-serve-http [--daemon ENDPOINT ...] [-m MODEL] [--alias NAME] [--host 127.0.0.1] [--port 8080]
                   [--api-key KEY] [--allowed-hosts NAMES] [--cors-origins ORIGINS]
                   [--draft-kind KIND] [--draft-block-size N] [--prompt-lookup-max-batch N]
                   [--max-concurrency N] [--max-body-bytes N] [--header-timeout S] [--body-timeout S]

Without ``--daemon`` the default endpoint is used and mlxd is started there if none answers (with
``-m`` and the daemon options); a daemon started here is supervised: restarted, with back-off, whenever
it exits (``supervisor``). With one or more ``--daemon`` the daemons must be running already; requests
go to the least busy one that is up, and one that goes away is waited for, never restarted.
"""

from __future__ import annotations

import logging
import sys

import click

from mlxd_protocol.autostart import AutostartError, daemon_answers, start_daemon
from mlxd_protocol.endpoints import default_endpoint, parse_endpoint

from .app import DEFAULT_MAX_BODY_BYTES, Settings, create_app
from .http_timeouts import header_timeout_protocol
from .request_guard import default_allowed_hosts
from .settings import DEFAULT_BODY_TIMEOUT_S, DEFAULT_HEADER_TIMEOUT_S
from .supervisor import DaemonSupervisor


def daemon_args(draft_kind: str | None, draft_block_size: int | None, prompt_lookup_max_batch: int | None) -> list[str]:
    """The ``mlxd`` options for a daemon this command starts.

    Args:
        draft_kind: ``--draft-kind`` (prompt-lookup or none), or None.
        draft_block_size: ``--draft-block-size``, or None.
        prompt_lookup_max_batch: ``--prompt-lookup-max-batch``, or None.

    Returns:
        The argument list (empty when all are None).
    """
    args: list[str] = []
    for flag, value in (("--draft-kind", draft_kind), ("--draft-block-size", draft_block_size),
                        ("--prompt-lookup-max-batch", prompt_lookup_max_batch)):
        if value is not None:
            args += [flag, str(value)]
    return args


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--daemon", "daemons", multiple=True,
              help="mlxd endpoint to forward to (repeatable; default: the private ipc socket, started if needed)")
@click.option("-m", "--model", default=None, help="model for a daemon started by this command: checkpoint directory, .gguf file, hub id or 'embedded' (default: the default model, SmolLM2-135M-Instruct)")
@click.option("--alias", default=None, help="the model name replies carry (default: the checkpoint's directory name)")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(1, 65535))
@click.option("--api-key", default=None, envvar="MLXD_HTTP_API_KEY",
              help="require 'Authorization: Bearer KEY' on every endpoint but /health (env MLXD_HTTP_API_KEY)")
@click.option("--allowed-hosts", default=None,
              help="comma-separated Host header names answered besides the loopback names and --host; '*': any "
                   "(default: only those; any when --host is a wildcard address such as 0.0.0.0)")
@click.option("--cors-origins", default="",
              help="comma-separated browser origins allowed to call the API (CORS), e.g. http://localhost:3000; "
                   "'*': any (default: none)")
@click.option("--draft-kind", default=None, type=click.Choice(["prompt-lookup", "none"]),
              help="speculative decoding for a daemon started here")
@click.option("--draft-block-size", default=None, type=click.IntRange(1), help="most draft tokens per verify round")
@click.option("--prompt-lookup-max-batch", default=None, type=click.IntRange(0),
              help="verify gate of a daemon started here: no verify rounds above this many rows")
@click.option("--max-concurrency", default=None, type=click.IntRange(1),
              help="most requests in flight; more are answered 429 at once (default: no limit)")
@click.option("--max-requests-per-client", default=32, show_default=True, type=click.IntRange(1),
              help="most requests in flight from one client address; more are answered 429")
@click.option("--max-body-bytes", default=DEFAULT_MAX_BODY_BYTES, show_default=True, type=click.IntRange(1),
              help="largest request body; larger ones are answered 413")
@click.option("--header-timeout", default=DEFAULT_HEADER_TIMEOUT_S, show_default=True, type=click.FloatRange(min=0.1),
              help="seconds a client has to send a request's headers; slower connections are closed")
@click.option("--body-timeout", default=DEFAULT_BODY_TIMEOUT_S, show_default=True, type=click.FloatRange(min=0.1),
              help="seconds a client has to send a request's body, once its headers came; then 408")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
def main(daemons, model, alias, host, port, api_key, allowed_hosts, cors_origins, draft_kind, draft_block_size,
         prompt_lookup_max_batch, max_concurrency, max_requests_per_client, max_body_bytes, header_timeout,
         body_timeout, log_level):
    """Serve the mlxd daemon(s) over HTTP (OpenAI and llama-server APIs)."""
    import uvicorn

    logging.basicConfig(level=log_level.upper(), stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    extra_args = daemon_args(draft_kind, draft_block_size, prompt_lookup_max_batch)
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
                click.echo(f"mlx-serve-http: started mlxd at {endpoint} (pid {process.pid}); it is restarted "
                           "if it exits", err=True)
            endpoints = [endpoint]
        elif model or extra_args:
            click.echo("mlx-serve-http: -m and the daemon options only apply to a daemon started here; "
                       "ignored with --daemon", err=True)
    except (ValueError, AutostartError) as error:
        click.echo(f"mlx-serve-http: {error}", err=True)
        sys.exit(1)
    if host not in ("127.0.0.1", "::1", "localhost") and not api_key:
        click.echo(f"mlx-serve-http: warning: listening on {host} without --api-key", err=True)
    hosts = default_allowed_hosts(host, allowed_hosts.split(",") if allowed_hosts is not None else None)
    settings = Settings(daemons=endpoints, api_key=api_key, max_concurrency=max_concurrency,
                        max_body_bytes=max_body_bytes, max_requests_per_client=max_requests_per_client,
                        model_alias=alias, allowed_hosts=hosts,
                        cors_origins=tuple(origin.strip().rstrip("/") for origin in cors_origins.split(",") if origin.strip()),
                        header_timeout_s=header_timeout, body_timeout_s=body_timeout)
    click.echo(f"mlx-serve-http on http://{host}:{port} -> {', '.join(endpoints)}", err=True)
    uvicorn.run(create_app(settings, supervisor), host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5,
                http=header_timeout_protocol(header_timeout))


if __name__ == "__main__":
    main()
