"""``mlx-generate``: generate text with the model held by mlxd (started in the background if needed).

    mlx-generate [-m MODEL] [--endpoint E] [--max-tokens N] [--temp T] [--top-p P] [--seed S]
                 [--system TEXT] [--chat/--no-chat] [--stop S] [--ignore-eos] [--json] [--no-autostart | --local] PROMPT

PROMPT ``-`` reads standard input. Text streams to stdout; statistics go to stderr.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time

import click

from mlxd_protocol import (
    Client,
    Constraint,
    DaemonError,
    DaemonTimeout,
    Done,
    Generate,
    ProtocolError,
    Sampling,
    Speculative,
    new_request_id,
)
from mlxd_protocol.autostart import AutostartError, ensure_daemon
from mlxd_protocol.endpoints import default_endpoint
from mlxd_protocol.messages import check_prompt

from .local import open_local_client

# a Generate's field defaults (the wire's): --max-tokens reads its default from here
REQUEST_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Generate)}


def build_request(
    prompt: str,
    max_tokens: int,
    temp,
    top_p,
    seed,
    system,
    chat,
    stop,
    prompt_lookup: bool | None = None,
    draft_block_size: int | None = None,
    stream: bool = True,
    ignore_eos: bool = False,
    constraint: Constraint | None = None,
) -> Generate:
    sampling = None
    if temp is not None or top_p is not None or seed is not None:
        sampling = Sampling(temperature=temp or 0.0, top_p=top_p if top_p is not None else 1.0, seed=seed)
    speculative = None
    if prompt_lookup is not None or draft_block_size is not None:
        kind = None if prompt_lookup is None else ("prompt-lookup" if prompt_lookup else "none")
        speculative = Speculative(kind=kind, max_draft=draft_block_size)
    return Generate(
        id=new_request_id(),
        prompt=prompt,
        chat=chat,
        system=system,
        max_tokens=max_tokens,
        stop=list(stop),
        stream=stream,
        sampling=sampling,
        speculative=speculative,
        ignore_eos=ignore_eos,
        constraint=constraint,
    )


def read_constraint(json_schema_file, grammar_file) -> Constraint | None:
    """The Constraint of --json-schema FILE (a JSON schema) or --grammar FILE (GBNF), or None."""
    if json_schema_file and grammar_file:
        raise click.UsageError("give --json-schema or --grammar, not both")
    if json_schema_file:
        text = json_schema_file.read()
        try:
            json.loads(text)
        except json.JSONDecodeError as error:
            raise click.BadParameter(f"not valid JSON: {error}", param_hint="--json-schema") from error
        return Constraint(kind="json_schema", text=text)
    if grammar_file:
        return Constraint(kind="gbnf", text=grammar_file.read())
    return None


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("prompt")
@click.option(
    "-m",
    "--model",
    default=None,
    help="model for a daemon started by this call (or for --local): checkpoint directory, .gguf file, hub id or "
    "'embedded' (default: SmolLM2-135M-Instruct)",
)
@click.option("--endpoint", default=None, help="daemon endpoint (default: the private ipc socket)")
@click.option("--max-tokens", default=REQUEST_DEFAULTS["max_tokens"], show_default=True, type=click.IntRange(1))
@click.option("--temp", default=None, type=click.FloatRange(0), help="temperature (default: the daemon's)")
@click.option("--top-p", default=None, type=click.FloatRange(0, 1, min_open=True))
@click.option("--seed", default=None, type=click.IntRange(0))
@click.option("--system", default=None, help="system prompt")
@click.option("--chat/--no-chat", default=None, help="apply the chat template (default: when the model has one)")
@click.option("--stop", multiple=True, help="stop string (repeatable)")
@click.option(
    "--prompt-lookup/--no-prompt-lookup",
    default=None,
    help="ask for prompt-lookup speculative decoding, or refuse it (default: the daemon's)",
)
@click.option("--draft-block-size", default=None, type=click.IntRange(1), help="lower the most draft tokens per round")
@click.option("--ignore-eos", is_flag=True, help="generate until --max-tokens or a stop string, past end-of-sequence")
@click.option(
    "--json-schema",
    "json_schema_file",
    type=click.File("r"),
    default=None,
    help="structured output: the reply follows the JSON schema in this file",
)
@click.option(
    "--grammar",
    "grammar_file",
    type=click.File("r"),
    default=None,
    help="structured output: the reply follows the GBNF grammar in this file (llama.cpp's format)",
)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of streaming text")
@click.option("--autostart/--no-autostart", default=True, show_default=True, help="start mlxd if none answers")
@click.option("--local", is_flag=True, help="run the scheduler in this process instead of talking to mlxd")
def main(
    prompt,
    model,
    endpoint,
    max_tokens,
    temp,
    top_p,
    seed,
    system,
    chat,
    stop,
    prompt_lookup,
    draft_block_size,
    ignore_eos,
    json_schema_file,
    grammar_file,
    as_json,
    autostart,
    local,
):
    """Generate a reply to PROMPT."""
    if local:
        from mlxd_fast_blas import ensure_fast_blas

        ensure_fast_blas()  # re-execs with OpenBLAS preloaded where that applies: before reading stdin
    if prompt == "-":
        prompt = sys.stdin.read()
    try:
        check_prompt(prompt.strip(), "prompt")  # the protocol's prompt check; blank counts as empty here
    except ValueError as error:
        raise click.UsageError(str(error)) from None
    # --json prints one object at the end: no chunks are asked for (the daemon then sends one reply)
    request = build_request(
        prompt,
        max_tokens,
        temp,
        top_p,
        seed,
        system,
        chat,
        stop,
        prompt_lookup,
        draft_block_size,
        stream=not as_json,
        ignore_eos=ignore_eos,
        constraint=read_constraint(json_schema_file, grammar_file),
    )
    started = time.perf_counter()
    try:
        if local:
            client = open_local_client(model)  # the same client interface, the daemon's core in this process
        else:
            endpoint = endpoint or default_endpoint()
            if autostart:
                ensure_daemon(endpoint, model)
            else:
                with Client(endpoint, timeout_s=2.0) as probe:
                    if not probe.ping(2.0):
                        click.echo(
                            f"mlx-generate: no daemon answers at {endpoint} (start one with mlxd, "
                            "or drop --no-autostart)",
                            err=True,
                        )
                        sys.exit(1)
            client = Client(endpoint, timeout_s=300.0)
        with client:
            done = _render(client.generate(request), as_json)
    except (AutostartError, DaemonError, DaemonTimeout, ProtocolError) as error:
        click.echo(f"mlx-generate: {error}", err=True)
        sys.exit(1)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "text": done.text,
                    "tokens": done.tokens,
                    "finish_reason": done.finish_reason,
                    "usage": done.usage,
                    "timings": done.timings,
                }
            )
        )
    else:
        _print_stats(done, time.perf_counter() - started)


def _render(replies, as_json: bool) -> Done:
    done = None
    for reply in replies:
        if isinstance(reply, Done):
            done = reply
        elif not as_json:
            sys.stdout.write(reply.text)
            sys.stdout.flush()
    if not as_json:
        sys.stdout.write("\n")
    return done  # type: ignore[return-value]  # a stream ends with its Done (an Error raises)


def _print_stats(done: Done, wall_s: float) -> None:
    t = done.timings
    line = (
        f"{t.get('predicted_n', 0)} tokens, {t.get('predicted_per_second', 0):.1f} tok/s; "
        f"prompt {t.get('prompt_n', 0)} tokens, {t.get('prompt_per_second', 0):.1f} tok/s; "
        f"finish {done.finish_reason}; {wall_s:.2f}s"
    )
    if "draft_kind" in t:
        line += f"; {t['draft_kind']}: {t['draft_n_accepted']}/{t['draft_n']} drafts accepted"
    click.echo(line, err=True)


if __name__ == "__main__":
    main()
