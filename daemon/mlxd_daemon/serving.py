"""Running the daemon: join a distributed group if asked, load the model, bind the sockets, tune the CPU
steps, say ``mlxd ready ...`` and serve until stopped.

Contract: ``serve(options)`` returns the process's exit status (0 stopped cleanly, 1 a daemon already
answers or the group was lost, 2 the model or the endpoint was refused, with one line on stderr). The
engine, the scheduler and mlx load here, only to serve: ``mlxd status`` / ``stop`` never load them.
"""

from __future__ import annotations

import logging
import sys

import click

from mlxd_fast_blas import blas_in_use, ensure_fast_blas
from mlxd_protocol import Client
from mlxd_protocol.endpoints import default_endpoint

from .options import DaemonOptions


def serve(options: DaemonOptions) -> int:
    """Run mlxd with these options until it is stopped.

    Returns:
        The exit status: 0 stopped, 1 another daemon answers or the group was lost, 2 refused at start.
    """
    ensure_fast_blas()
    logging.basicConfig(
        level=options.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    log = logging.getLogger("mlxd")
    endpoint = options.endpoint or default_endpoint()
    group = None
    if options.distributed:
        from .distributed import join_group  # lazy: mlx loads only to serve (mlxd status / stop never load it)

        try:
            group, info = join_group(options.distributed, options.distributed_backend)
        except ValueError as error:
            click.echo(f"mlxd: {error}", err=True)
            return 2
        from .group_watch import GroupWatch  # lazy: psutil and the group's watch load only with --distributed

        watch = GroupWatch()  # now, while the group's connections are the only ones
        watch.start()  # a rank lost while loading ends this one
        log.info(
            "rank %d of %d (%s parallel, %s backend), watching %s",
            info.rank,
            info.size,
            info.mode,
            info.backend,
            watch.describe(),
        )
    if group is None or group.rank() == 0:
        with Client(endpoint, timeout_s=1.0, auth_token=options.auth_token or "") as probe:
            if probe.ping(0.5):
                click.echo(f"mlxd: a daemon already answers at {endpoint}", err=True)
                return 1
    from mlxd_engine import ModelLoadError, calibrate_forward_cost

    # lazy: the engine, the scheduler and mlx load only to serve (mlxd status / stop never load them)
    from .model_setup import load_for_serving
    from .server import DaemonServer
    from .step_tuning import tune_steps

    try:
        loaded = _load_with_progress(lambda o: load_for_serving(o, group), options)
    except ModelLoadError as error:
        if group is not None:
            watch.stop()  # every rank refuses the same model: the others leaving is no loss
        click.echo(f"mlxd: {error}", err=True)
        return 2
    if group is not None and group.rank() != 0:
        from .distributed import serve_follower  # lazy: mlx loads only to serve

        return serve_follower(loaded, options, watch)
    server = DaemonServer(loaded, options, endpoint)
    try:
        server.bind()
    except (ValueError, OSError) as error:
        click.echo(f"mlxd: cannot listen on {endpoint}: {error}", err=True)
        return 2
    server.install_signal_handlers()
    if group is not None:
        from .distributed import abort_serving, fixed_step_settings  # lazy: mlx loads only to serve

        steps = fixed_step_settings()
        server.engine.on_lost = lambda reason: server.request_stop("distributed group lost")
        server.engine.watch_group(watch, lambda reason: abort_serving(server, reason))
    else:
        steps = tune_steps(server.engine)
        calibrate_forward_cost(server.engine)  # the verify gate's cost model, with the tuned settings
    log.info(
        "model=%s type=%s layers=%d max_batch=%d max_kv_size=%d lookahead=%s %s prompt_lookup_max_batch=%s "
        "storage=%s blas=%s blas_threads=%s compiled_steps=%s fused_cpu_layers=%d",
        loaded.path,
        loaded.model_type,
        loaded.n_layers,
        options.max_batch,
        server.engine.max_kv_size,
        options.lookahead,
        server.speculative.summary(),
        server.scheduler.options.prompt_lookup_max_batch,
        server.engine.storage.usage(),
        blas_in_use(),
        steps.blas_detail,
        steps.compiled_detail,
        server.engine.fused_layers,
    )
    click.echo(f"mlxd ready endpoint={endpoint} model={loaded.path} pid={__import__('os').getpid()}", nl=True)
    sys.stdout.flush()
    reason = "error"
    lost = None
    try:
        reason = server.serve_forever()
    finally:
        if group is None:
            server.close()
        elif server.engine.abort_lock.acquire(blocking=False):  # else the watch thread is answering them
            lost = server.engine.lost
            if lost is not None:
                server.scheduler.fail_all(lost)  # every waiting client gets the error now
            server.close()
            server.engine.close()  # the other ranks exit too
            server.engine.settled.set()
        log.info("stopped (%s)", reason)
    if lost is not None:
        click.echo(f"mlxd: {lost}", err=True)
        return 1
    return 0


def _load_with_progress(load, options):
    if not sys.stderr.isatty():
        return load(options)
    from rich.console import Console

    with Console(stderr=True).status(f"loading {options.model or 'the default model'} ..."):
        return load(options)
