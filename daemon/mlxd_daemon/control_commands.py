"""``mlxd status`` and ``mlxd stop``: ask a running daemon for its status, or to shut down.

Contract: both exit 1 with ``mlxd: no daemon answers at ENDPOINT (...)`` on stderr when none does; they
speak the protocol's ``Client`` and never load the engine. ``endpoint_option`` is the ``--endpoint``
option these commands and ``mlxd`` itself take, its default read from ``DaemonOptions``.
"""

from __future__ import annotations

import json
import sys

import click

from mlxd_protocol import Client, DaemonError, DaemonTimeout
from mlxd_protocol.endpoints import default_endpoint

from .options import DaemonOptions

DEFAULTS = DaemonOptions()  # the one home of mlxd's defaults


def endpoint_option(function):
    """The ``--endpoint`` option of ``mlxd`` and of its ``status`` and ``stop`` commands."""
    return click.option(
        "--endpoint",
        default=DEFAULTS.endpoint,
        help="ipc:///path or tcp://127.0.0.1:PORT (default: private ipc socket)",
    )(function)


@click.command("status")
@endpoint_option
@click.option("--json", "as_json", is_flag=True, help="print the status as JSON")
def status_command(endpoint, as_json):
    """Print the daemon's status; exit 0 when it answers, 1 when none does."""
    endpoint = endpoint or default_endpoint()
    try:
        with Client(endpoint, timeout_s=2.0) as client:
            reply = client.status()
    except (DaemonTimeout, DaemonError) as error:
        click.echo(f"mlxd: no daemon answers at {endpoint} ({error})", err=True)
        sys.exit(1)
    fields = {
        name: getattr(reply, name)
        for name in (
            "model",
            "pid",
            "uptime_s",
            "active",
            "queued",
            "max_batch",
            "protocol_version",
            "daemon_version",
            "memory",
            "totals",
            "options",
        )
    }
    if as_json:
        click.echo(json.dumps(fields, indent=2))
        return
    click.echo(
        f"mlxd at {endpoint}: model {reply.model}, pid {reply.pid}, up {reply.uptime_s:.0f}s, "
        f"active {reply.active}, queued {reply.queued}, rss {reply.memory.get('rss_bytes', 0) / 2**20:.0f} MiB"
    )
    group = (reply.options or {}).get("group")
    if group:
        click.echo(
            f"group: {group['ranks']} ranks, {group['mode']} parallel, {group['backend']} backend"
            + (f", lost: {group['lost']}" if group.get("lost") else "")
        )


@click.command("stop")
@endpoint_option
def stop_command(endpoint):
    """Ask the daemon to shut down."""
    endpoint = endpoint or default_endpoint()
    try:
        with Client(endpoint, timeout_s=5.0) as client:
            client.shutdown()
    except (DaemonTimeout, DaemonError) as error:
        click.echo(f"mlxd: no daemon answers at {endpoint} ({error})", err=True)
        sys.exit(1)
    click.echo(f"mlxd at {endpoint}: stopping")
