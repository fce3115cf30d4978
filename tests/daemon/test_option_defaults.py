"""One home per default. mlxd's command line reads every default from ``DaemonOptions`` (its ``DEFAULTS``
instance) and writes none itself; ``--help`` shows those values. ``DaemonOptions`` and the scheduler's
``SchedulerOptions`` take their shared batching defaults from one module, ``mlxd_protocol.serving_defaults``,
so a library user, ``mlx-generate --local`` and ``mlxd`` run alike."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import click

from mlxd_daemon.main import cli
from mlxd_daemon.options import DaemonOptions
from mlxd_protocol import Sampling, serving_defaults
from mlxd_scheduler import SchedulerOptions

ROOT = Path(__file__).resolve().parents[2]
# mlxd option name -> (DaemonOptions field, how the option's value becomes the field's)
RENAMED = {
    "drain_timeout": ("drain_timeout_s", float),
    "stream_interval_ms": ("stream_interval_s", lambda ms: ms / 1000.0),
}
SAMPLING = {
    "temp": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "seed": "seed",
    "sampler_rng": "rng",
}
NOT_OPTIONS = {"--auth-token-file", "--chat-template-file"}  # files read into auth_token, chat_template
LIMITS = {
    "max_messages",
    "max_tokenize_chars",
    "max_grammar_bytes",
    "max_grammar_rules",
    "max_grammar_depth",
    "max_grammar_repeat",
}  # fields of DaemonOptions.limits (HostLimits)
# DaemonOptions field -> SchedulerOptions field, each defaulting to serving_defaults.<NAME>
SHARED = {
    "max_batch": ("max_batch", "MAX_BATCH"),
    "prefill_chunk": ("prefill_chunk", "PREFILL_CHUNK"),
    "lookahead": ("lookahead", "LOOKAHEAD"),
    "max_queue": ("max_queue", "MAX_QUEUE"),
    "decode_steps": ("max_decode_steps", "DECODE_STEPS"),
}


def _option_calls(tree: ast.Module) -> list[ast.Call]:
    """The ``click.option(...)`` calls that make mlxd's own options: the decorators of ``cli`` (main.py) and
    the ``--endpoint`` option ``endpoint_option`` (control_commands.py) adds to it."""
    calls = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "cli":
            calls += [d for d in node.decorator_list if isinstance(d, ast.Call)]
        if isinstance(node, ast.FunctionDef) and node.name == "endpoint_option":
            calls += [n for n in ast.walk(node) if isinstance(n, ast.Call)]
    return [
        call
        for call in calls
        if isinstance(call.func, ast.Attribute)
        and call.func.attr == "option"
        and ast.unparse(call.func.value) == "click"
    ]


def test_no_mlxd_option_writes_its_own_default():
    options = [
        call
        for module in ("main.py", "control_commands.py")
        for call in _option_calls(ast.parse((ROOT / "daemon/mlxd_daemon" / module).read_text()))
    ]
    wrong, names = [], []
    for call in options:
        name = next(a.value for a in call.args if isinstance(a, ast.Constant) and str(a.value).startswith("--"))
        name = name.split("/")[0]
        names.append(name)
        default = next((k.value for k in call.keywords if k.arg == "default"), None)
        if name in NOT_OPTIONS:
            if default is None or ast.unparse(default) != "None":
                wrong.append(f"{name}: a file option defaults to None")
        elif default is None or not any(isinstance(n, ast.Name) and n.id == "DEFAULTS" for n in ast.walk(default)):
            wrong.append(f"{name}: default={ast.unparse(default) if default else '(none)'}, not read from DEFAULTS")
    assert not wrong, wrong
    assert len(names) == len([p for p in cli.params if isinstance(p, click.Option)]) > 30  # every option was seen


def _expected(param: click.Parameter, options: DaemonOptions, sampling: Sampling):
    """The value of ``param`` that DaemonOptions' default means, in the option's own unit."""
    if param.name in SAMPLING:
        return getattr(sampling, SAMPLING[param.name])
    if param.name in LIMITS:
        return getattr(options.limits, param.name)
    if param.name == "stream_interval_ms":
        return options.stream_interval_s * 1000.0
    return getattr(options, RENAMED.get(param.name, (param.name,))[0])


def test_mlxd_defaults_and_what_help_shows_are_the_daemon_options_defaults():
    options, sampling = DaemonOptions(), Sampling()
    context = click.Context(cli)
    checked = set()
    for param in cli.params:
        if "--" + param.name.replace("_", "-") in NOT_OPTIONS:
            continue
        default = param.get_default(context)
        expected = _expected(param, options, sampling)
        assert default == expected and type(default) is type(expected), (param.name, default, expected)
        name, convert = RENAMED.get(param.name, (param.name, lambda value: value))
        assert default is None or convert(default) == getattr(options, name, convert(default)), param.name
        if isinstance(param, click.Option) and param.show_default and not isinstance(expected, bool):
            record = param.get_help_record(context)
            shown = re.search(r"\[default: ([^;\]]*)", record[1] if record else "")  # what --help prints
            assert shown and shown.group(1) == str(expected), (param.name, record)
        checked.add(param.name)
    assert {"decode_steps", "max_batch", "prefill_chunk", "lookahead", "temp", "max_grammar_depth"} <= checked


def _default_sources(path: str, class_name: str) -> dict[str, str]:
    """Each field of the dataclass ``class_name`` in ``path`` -> its default expression as written."""
    tree = ast.parse((ROOT / path).read_text())
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name).body
    return {
        n.target.id: ast.unparse(n.value)
        for n in body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.value is not None
    }


def test_the_daemon_and_the_scheduler_read_their_shared_defaults_from_one_home():
    daemon = _default_sources("daemon/mlxd_daemon/options.py", "DaemonOptions")
    scheduler = _default_sources("packages/mlxd_scheduler/scheduler.py", "SchedulerOptions")
    for daemon_field, (scheduler_field, constant) in SHARED.items():
        home = f"serving_defaults.{constant}"
        assert (daemon[daemon_field], scheduler[scheduler_field]) == (home, home), daemon_field
    daemon_options, scheduler_options = DaemonOptions(), SchedulerOptions()  # and they are what they read
    for daemon_field, (scheduler_field, constant) in SHARED.items():
        value = getattr(serving_defaults, constant)
        assert getattr(daemon_options, daemon_field) == getattr(scheduler_options, scheduler_field) == value
    assert {f.name for f in dataclasses.fields(DaemonOptions)} >= set(SHARED)


def test_the_host_limits_and_the_engine_read_their_grammar_defaults_from_one_home():
    from mlxd_engine import GrammarLimits

    host = _default_sources("daemon/mlxd_daemon/host_limits.py", "HostLimits")
    engine = _default_sources("packages/mlxd_engine/sampling/grammar_limits.py", "GrammarLimits")
    for name in ("bytes", "rules", "depth", "repeat"):
        home = f"serving_defaults.MAX_GRAMMAR_{name.upper()}"
        assert (host[f"max_grammar_{name}"], engine[f"max_{name}"]) == (home, home), name
    assert DaemonOptions().limits.grammar() == GrammarLimits()


def test_mlx_generate_max_tokens_is_a_requests_default():
    from mlxd_cli import generate
    from mlxd_protocol import Generate

    (param,) = [p for p in generate.main.params if p.name == "max_tokens"]
    wire = next(f.default for f in dataclasses.fields(Generate) if f.name == "max_tokens")
    assert param.get_default(click.Context(generate.main)) == wire == generate.REQUEST_DEFAULTS["max_tokens"]


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
