"""One home per default: mlxd's command-line defaults are DaemonOptions' defaults, and the scheduler's own
defaults are the daemon's, so a library user, mlx-generate --local and mlxd run alike."""

from __future__ import annotations

import dataclasses

import click

from mlxd_daemon.main import cli
from mlxd_daemon.options import DaemonOptions
from mlxd_protocol import Sampling
from mlxd_scheduler import SchedulerOptions

# mlxd option name -> (DaemonOptions field, how the option's value becomes the field's)
RENAMED = {
    "drain_timeout": ("drain_timeout_s", float),
    "stream_interval_ms": ("stream_interval_s", lambda ms: ms / 1000.0),
}
SAMPLING = {"temp": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "seed": "seed"}
NOT_OPTIONS = {"auth_token_file", "chat_template_file"}  # read into auth_token, chat_template
LIMITS = {
    "max_messages",
    "max_tokenize_chars",
    "max_grammar_bytes",
    "max_grammar_rules",
    "max_grammar_depth",
    "max_grammar_repeat",
}  # fields of DaemonOptions.limits (HostLimits)


def test_mlxd_command_line_defaults_are_the_daemon_options_defaults():
    options, sampling = DaemonOptions(), Sampling()
    context = click.Context(cli)
    checked = set()
    for param in cli.params:
        if param.name in NOT_OPTIONS:
            continue
        default = param.get_default(context)
        if param.name in SAMPLING:
            assert default == getattr(sampling, SAMPLING[param.name]), param.name
        elif param.name in LIMITS:
            assert default == getattr(options.limits, param.name), param.name
        else:
            name, convert = RENAMED.get(param.name, (param.name, lambda value: value))
            default = default if default is None else convert(default)
            assert default == getattr(options, name), (param.name, default, getattr(options, name))
        checked.add(param.name)
    assert {"decode_steps", "max_batch", "prefill_chunk", "lookahead", "temp"} <= checked


def test_the_host_limits_grammar_defaults_are_the_engines():
    from mlxd_engine import GrammarLimits

    assert DaemonOptions().limits.grammar() == GrammarLimits()


def test_the_scheduler_defaults_are_the_daemons():
    daemon, scheduler = DaemonOptions(), SchedulerOptions()
    pairs = {
        "max_batch": "max_batch",
        "prefill_chunk": "prefill_chunk",
        "lookahead": "lookahead",
        "max_queue": "max_queue",
        "decode_steps": "max_decode_steps",
    }
    assert {name: getattr(daemon, name) for name in pairs} == {
        name: getattr(scheduler, field) for name, field in pairs.items()
    }
    assert {f.name for f in dataclasses.fields(DaemonOptions)} >= set(pairs)


def test_the_shared_draft_store_defaults_are_the_schedulers():
    daemon, scheduler = DaemonOptions(), SchedulerOptions()
    assert daemon.shared_drafts is (scheduler.shared_drafts is not None)
    assert scheduler.shared_drafts is not None
    assert daemon.shared_draft_tokens == scheduler.shared_drafts.max_tokens
    assert daemon.shared_draft_prompts == scheduler.shared_drafts.include_prompts


def test_the_shared_draft_options_reach_the_scheduler(embedded_model):
    from mlxd_daemon.core import build_scheduler

    _, _, on = build_scheduler(embedded_model, DaemonOptions(shared_draft_tokens=1000, shared_draft_prompts=True))
    assert on.options.shared_drafts is not None
    assert (on.options.shared_drafts.max_tokens, on.options.shared_drafts.include_prompts) == (1000, True)
    _, _, off = build_scheduler(embedded_model, DaemonOptions(shared_drafts=False))
    assert off.options.shared_drafts is None and off.shared_drafts is None
