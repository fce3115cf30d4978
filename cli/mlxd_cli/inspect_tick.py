"""``mlx-inspect-tick``: watch a running daemon's scheduler ticks live.

    mlx-inspect-tick [--endpoint E] [--json] [--count N] [--rows N]

Shows a rich table of the latest ticks (tick number, batch size, pipelined or synchronous, what each
row did, duration); ``--json`` prints one JSON object per tick instead; ``--count N`` exits after N
ticks. Subscribing costs the daemon nothing while no one watches (it publishes only to subscribers).
"""

from __future__ import annotations

import json
import sys
import time
from collections import deque

import click
import msgpack
import zmq

from mlxd_protocol import Client
from mlxd_protocol.endpoints import default_endpoint, trace_endpoint


def describe_row(row: dict) -> str:
    action = row["action"]
    if action == "verify":
        return f"verify {row.get('accepted', 0)}/{row.get('drafted', 0)}"
    if action == "finished":
        return f"finished:{row.get('detail', '')}"
    if action == "decode":
        count = f" x{row['tokens']}" if row.get("tokens") else ""
        return f"decode({row['detail']}){count}" if row.get("detail") else f"decode{count}"
    return action


def short_id(request_id: str) -> str:
    return request_id.rsplit(":", 1)[-1][:8]


def render(ticks) -> "Table":
    from rich.table import Table

    table = Table(title="mlxd scheduler ticks", expand=False)
    for name, justify in (("tick", "right"), ("batch", "right"), ("mode", "left"), ("rows", "left"),
                          ("prefill", "right"), ("ms", "right")):
        table.add_column(name, justify=justify)
    for tick in ticks:
        rows = ", ".join(f"{short_id(r['request_id'])}:{describe_row(r)}" for r in tick["rows"])
        mode = "[green]pipelined[/]" if tick["pipelined"] else "[yellow]sync[/]"
        if tick.get("steps", 1) > 1:
            mode += f" x{tick['steps']}"
        table.add_row(str(tick["tick"]), str(tick["batch"]), mode, rows, str(tick.get("prefill_tokens", 0) or ""),
                      f"{tick['duration_ms']:.2f}")
    return table


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--endpoint", default=None, help="daemon endpoint (default: the private ipc socket)")
@click.option("--json", "as_json", is_flag=True, help="one JSON object per tick on stdout")
@click.option("--count", default=0, type=click.IntRange(0), help="exit after this many ticks (0: run until ^C)")
@click.option("--rows", default=20, show_default=True, type=click.IntRange(1), help="ticks shown in the table")
@click.option("--timeout", default=0.0, type=click.FloatRange(0), help="give up after this many seconds without a tick (0: wait)")
def main(endpoint, as_json, count, rows, timeout):
    """Show mlxd's scheduler ticks as they happen."""
    endpoint = endpoint or default_endpoint()
    with Client(endpoint, timeout_s=2.0) as client:
        if not client.ping(2.0):
            click.echo(f"mlx-inspect-tick: no daemon answers at {endpoint}", err=True)
            sys.exit(1)
    socket = zmq.Context.instance().socket(zmq.SUB)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.SUBSCRIBE, b"tick")
    socket.connect(trace_endpoint(endpoint))
    seen = 0
    recent: deque = deque(maxlen=rows)
    live = None
    if not as_json:
        from rich.live import Live

        live = Live(render(recent), refresh_per_second=8)
        live.start()
    try:
        last = time.monotonic()
        while count == 0 or seen < count:
            if not socket.poll(200):
                if timeout and time.monotonic() - last > timeout:
                    break
                continue
            _, payload = socket.recv_multipart()
            tick = msgpack.unpackb(payload, raw=False)
            last = time.monotonic()
            seen += 1
            if as_json:
                click.echo(json.dumps(tick))
            else:
                recent.append(tick)
                live.update(render(recent))
    except KeyboardInterrupt:
        pass
    finally:
        if live is not None:
            live.stop()
        socket.close()
    if count and seen < count:
        click.echo(f"mlx-inspect-tick: saw {seen} of {count} ticks before the timeout", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
