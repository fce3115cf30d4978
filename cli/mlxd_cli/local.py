"""``mlx-generate --local``: the daemon's edge and scheduler in this process, no socket (imports mlx)."""

from __future__ import annotations

from typing import Iterator

from mlxd_protocol import DaemonError, Error, Generate


def generate_local(model: str | None, request: Generate) -> Iterator:
    from mlxd_daemon.edge import to_reply, to_request
    from mlxd_daemon.options import DaemonOptions, SamplingDefaults
    from mlxd_engine import Engine, load
    from mlxd_scheduler import BatchScheduler, InProcessClient, SchedulerOptions

    loaded = load(model)
    options = SchedulerOptions(max_decode_steps=DaemonOptions().decode_steps)  # as the daemon runs it
    client = InProcessClient(BatchScheduler(Engine(loaded, max_sequences=1), options))
    for event in client.generate(to_request(loaded, request, request.id, SamplingDefaults())):
        reply = to_reply(event, request.id, stream=True)
        if isinstance(reply, Error):
            raise DaemonError(reply.code, reply.message)
        if reply is not None:
            yield reply
