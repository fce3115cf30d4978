"""``mlx-inspect-tick``: watch a running daemon's scheduler ticks live.

    mlx-inspect-tick [--endpoint E] [--json] [--count N] [--rows N] [--auth-token-file F]

Shows a rich table of the latest ticks (tick number, batch size, pipelined or synchronous, what each
row did, duration); ``--json`` prints one JSON object per tick instead; ``--count N`` exits after N
ticks. Subscribing costs the daemon nothing while no one watches (it publishes only to subscribers).
Ticks arrive as the protocol's typed ``Tick`` messages (``Client.subscribe_ticks``); ``--json`` prints
each as a JSON object of its fields (a row's unset fields left out). A daemon started with an auth token
takes it on the trace socket too: ``--auth-token-file`` or ``$MLXD_AUTH_TOKEN``.
"""

from __future__ import annotations

import json
import sys
from collections import deque
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import click

from mlxd_protocol import Client, DaemonError, DaemonTimeout, Tick
from mlxd_protocol.endpoints import default_endpoint

if TYPE_CHECKING:
    from rich.table import Table


def tick_record(tick: Tick) -> dict:
    """A Tick as a plain dict: its fields, each row without the fields it left unset (no ``id``)."""
    record = {
        name: getattr(tick, name) for name in ("tick", "batch", "pipelined", "duration_ms", "prefill_tokens", "steps")
    }
    record["rows"] = [{key: value for key, value in asdict(row).items() if value is not None} for row in tick.rows]
    return record


def describe_row(row: dict) -> str:
    action = row["action"]
    if action == "verify":
        source = f" ({row['detail']})" if row.get("detail") else ""  # where the draft came from
        return f"verify {row.get('accepted', 0)}/{row.get('drafted', 0)}{source}"
    if action == "finished":
        return f"finished:{row.get('detail', '')}"
    if action == "decode":
        count = f" x{row['tokens']}" if row.get("tokens") else ""
        return f"decode({row['detail']}){count}" if row.get("detail") else f"decode{count}"
    return action


def short_id(request_id: str) -> str:
    return request_id.rsplit(":", 1)[-1][:8]


def render(ticks) -> Table:
    from rich.table import Table

    table = Table(title="mlxd scheduler ticks", expand=False)
    for name, justify in (
        ("tick", "right"),
        ("batch", "right"),
        ("mode", "left"),
        ("rows", "left"),
        ("prefill", "right"),
        ("ms", "right"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]  # each one of rich's justify names
    for tick in ticks:
        rows = ", ".join(f"{short_id(r['request_id'])}:{describe_row(r)}" for r in tick["rows"])
        mode = "[green]pipelined[/]" if tick["pipelined"] else "[yellow]sync[/]"
        if tick.get("steps", 1) > 1:
            mode += f" x{tick['steps']}"
        table.add_row(
            str(tick["tick"]),
            str(tick["batch"]),
            mode,
            rows,
            str(tick.get("prefill_tokens", 0) or ""),
            f"{tick['duration_ms']:.2f}",
        )
    return table


def _read_token(path: str | None) -> str | None:
    """The token in ``path`` (first line, stripped), or None (the client then reads $MLXD_AUTH_TOKEN)."""
    if path is None:
        return None
    try:
        return Path(path).read_text().strip() or None
    except OSError as error:
        raise click.BadParameter(f"cannot read {path}: {error.strerror}", param_hint="--auth-token-file") from error


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--endpoint", default=None, help="daemon endpoint (default: the private ipc socket)")
@click.option("--json", "as_json", is_flag=True, help="one JSON object per tick on stdout")
@click.option("--count", default=0, type=click.IntRange(0), help="exit after this many ticks (0: run until ^C)")
@click.option("--rows", default=20, show_default=True, type=click.IntRange(1), help="ticks shown in the table")
@click.option(
    "--timeout", default=0.0, type=click.FloatRange(0), help="give up after this many seconds without a tick (0: wait)"
)
@click.option(
    "--auth-token-file",
    default=None,
    type=click.Path(dir_okay=False),
    help="file holding the daemon's auth token (else $MLXD_AUTH_TOKEN); the trace socket needs it too",
)
def main(endpoint, as_json, count, rows, timeout, auth_token_file):
    """Show mlxd's scheduler ticks as they happen."""
    endpoint = endpoint or default_endpoint()
    client = Client(endpoint, timeout_s=2.0, auth_token=_read_token(auth_token_file))
    if not client.ping(2.0):
        client.close()
        click.echo(f"mlx-inspect-tick: no daemon answers at {endpoint}", err=True)
        sys.exit(1)
    seen = 0
    recent: deque = deque(maxlen=rows)
    live = None
    if not as_json:
        from rich.live import Live

        live = Live(render(recent), refresh_per_second=8)
        live.start()
    subscription = client.subscribe_ticks(idle_timeout_s=timeout or None)
    try:
        for tick in subscription:
            record = tick_record(tick)
            seen += 1
            if as_json:
                click.echo(json.dumps(record))
            else:
                recent.append(record)
                live.update(render(recent))
            if count and seen >= count:
                break
    except DaemonTimeout:
        pass  # --timeout: no tick for that long
    except DaemonError as error:
        click.echo(f"mlx-inspect-tick: {error}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        pass
    finally:
        if live is not None:
            live.stop()
        subscription.close()
        client.close()
    if count and seen < count:
        click.echo(f"mlx-inspect-tick: saw {seen} of {count} ticks before the timeout", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
