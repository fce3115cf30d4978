"""``mlx-serve-http``: serve mlxd over HTTP with OpenAI's and llama-server's APIs.

    mlx-serve-http [--daemon ENDPOINT ...] [-m MODEL] [--host 127.0.0.1] [--port 8080] [--api-key KEY]
                   [--draft-kind KIND] [--draft-block-size N] [--prompt-lookup-max-batch N]
                   [--max-concurrency N] [--max-body-bytes N]

Without ``--daemon`` the default endpoint is used and mlxd is started there if none answers (with
``-m`` and the daemon options). With one or more ``--daemon`` the daemons must be running already;
requests go to the least busy one that is up.
"""

from __future__ import annotations

import logging
import sys

import click

from mlxd_protocol.autostart import AutostartError, ensure_daemon
from mlxd_protocol.endpoints import default_endpoint, parse_endpoint

from .app import DEFAULT_MAX_BODY_BYTES, Settings, create_app


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
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(1, 65535))
@click.option("--api-key", default=None, envvar="MLXD_HTTP_API_KEY",
              help="require 'Authorization: Bearer KEY' on every endpoint but /health (env MLXD_HTTP_API_KEY)")
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
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
def main(daemons, model, host, port, api_key, draft_kind, draft_block_size, prompt_lookup_max_batch,
         max_concurrency, max_requests_per_client, max_body_bytes, log_level):
    """Serve the mlxd daemon(s) over HTTP (OpenAI and llama-server APIs)."""
    import uvicorn

    logging.basicConfig(level=log_level.upper(), stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    extra_args = daemon_args(draft_kind, draft_block_size, prompt_lookup_max_batch)
    endpoints = list(dict.fromkeys(daemons))  # the same daemon twice would only skew the balance
    try:
        for endpoint in endpoints:
            parse_endpoint(endpoint)
        if not endpoints:
            endpoint = default_endpoint()
            if ensure_daemon(endpoint, model, extra_args):
                click.echo(f"mlx-serve-http: started mlxd at {endpoint}", err=True)
            endpoints = [endpoint]
        elif model or extra_args:
            click.echo("mlx-serve-http: -m and the daemon options only apply to a daemon started here; "
                       "ignored with --daemon", err=True)
    except (ValueError, AutostartError) as error:
        click.echo(f"mlx-serve-http: {error}", err=True)
        sys.exit(1)
    if host not in ("127.0.0.1", "::1", "localhost") and not api_key:
        click.echo(f"mlx-serve-http: warning: listening on {host} without --api-key", err=True)
    settings = Settings(daemons=endpoints, api_key=api_key, max_concurrency=max_concurrency,
                        max_body_bytes=max_body_bytes, max_requests_per_client=max_requests_per_client)
    click.echo(f"mlx-serve-http on http://{host}:{port} -> {', '.join(endpoints)}", err=True)
    uvicorn.run(create_app(settings), host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)


if __name__ == "__main__":
    main()
