"""A ``llama-server`` command line in front of mlxd + mlx-serve-http (for llama.cpp's server test suite).

    llama_server_compat.py --host 127.0.0.1 --port 8080 --hf-repo ggml-org/test-model-stories260K \\
        --ctx-size 512 --parallel 2 --n-predict 64 --temp 0.8 --seed 42 --alias tinyllama-2 --no-slots ...

Contract: the llama-server flags are mapped onto an ``mlxd`` daemon (a child on a private ipc socket in
a temporary directory) and an ``mlx-serve-http`` gateway run in this process against it; the process
stays in the foreground like llama-server and, on SIGTERM or SIGINT, stops the gateway, then the daemon
(which also dies with this process, should it be killed). Both start at once: the gateway answers
``/health`` with 503 until the daemon has loaded, as llama-server does while loading.

Models: ``--model PATH`` is served as given (a checkpoint directory or a ``.gguf`` file). The hub names
the suite downloads are mapped to local copies (``HUB_MODELS``), served as GGUF files written once from
them (``gguf_copy``), as llama-server serves the GGUF it downloaded; any other hub model is refused with
a message, since nothing is downloaded here. A model without a chat template gets llama-server's chatml
fallback (``--chat-template chatml``), unless ``--chat-template(-file)`` is given.

Mapped flags: --host (comma-separated: several addresses), --port, --model/-m, --hf-repo/-hfr,
--hf-file/-hff, --ctx-size/-c and --parallel/-np (each slot gets ctx/np tokens: mlxd --max-batch np
--max-kv-size ctx/np; with --kv-unified the np slots share one pool of ctx tokens: paged storage),
--batch-size/-b (mlxd --prefill-chunk), --n-predict/-n, --temp, --top-k, --top-p, --min-p (llama-server's
0.8, 40, 0.95, 0.05 when not given, ``LLAMA_SAMPLING``; seeded requests draw as llama-server's do: mlxd
--sampler-rng llama.cpp), --seed/-s, --alias/-a (comma-separated: sorted,
the first names the model), --tags, --api-key, --cors-origins / --cors-methods / --cors-headers /
--(no-)cors-credentials (with llama-server's defaults, ``LLAMA_CORS``: any origin, echoed back,
credentials allowed), --chat-template, --chat-template-file, --metrics, --slots/--no-slots, --ui/--no-ui
(and --webui/--no-webui: mlx-serve-http's web UI, a chat page at /), --ui-mcp-proxy
(mlx-serve-http's /cors-proxy), --pooling, --reasoning on|off|auto, --spec-type ngram-* (prompt
lookup), --context-shift / --no-context-shift (mlxd's; off by default, as in llama-server), --cache-ram
MiB (mlxd --prefix-cache-bytes; llama-server's 8192 MiB when not given), --verbose
(debug logs, and mlx-serve-http --verbose-replies: llama-server's ``__verbose`` object on every
OpenAI-style reply).

Ignored, because they mean nothing on an MLX server (``IGNORED_FLAGS``): --n-gpu-layers/-ngl and
--threads/-t (MLX uses one device, and mlxd measures its own thread count), --ubatch-size/-ub (no
physical batch split), --flash-attn/-fa (MLX picks its attention kernel), --cont-batching (mlxd always
batches continuously), --jinja/--no-jinja (chat templates are always Jinja), --embedding (embeddings are
always served), --offline (nothing is ever downloaded), --no-mmproj (no multimodal projector is loaded),
--no-cache-idle-slots (finished requests go to the prefix cache, not to idle slots), --backend-sampling
(also spelt --backend_sampling: mlxd's sampler always runs in MLX on the model's device). Any other flag, or
an ignored one given a value it cannot honour, ends this command with status 2 and a message naming it.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STORIES_260K = Path(os.environ.get("MLXD_STORIES260K", ROOT / "models" / "stories260K"))
# (hub repository, file or None) -> the local copy of that model
HUB_MODELS = {
    ("ggml-org/test-model-stories260K", None): STORIES_260K,
    ("ggml-org/models", "tinyllamas/stories260K.gguf"): STORIES_260K,
}
GGUF_SOURCE_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
# flag -> takes a value (True) or is a switch (False)
IGNORED_FLAGS = {
    "--n-gpu-layers": True,
    "-ngl": True,
    "--gpu-layers": True,
    "--threads": True,
    "-t": True,
    "--threads-batch": True,
    "-tb": True,
    "--ubatch-size": True,
    "-ub": True,
    "--flash-attn": True,
    "-fa": True,
    "--cont-batching": False,
    "-cb": False,
    "--jinja": False,
    "--no-jinja": False,
    "--embedding": False,
    "--embeddings": False,
    "--offline": False,
    "--no-mmproj": False,
    "--no-cache-idle-slots": False,
    "--backend-sampling": False,
    "--backend_sampling": False,
}
ALIASES = {
    "-m": "--model",
    "-hfr": "--hf-repo",
    "-hf": "--hf-repo",
    "-hff": "--hf-file",
    "-c": "--ctx-size",
    "-np": "--parallel",
    "-b": "--batch-size",
    "-n": "--n-predict",
    "--predict": "--n-predict",
    "-s": "--seed",
    "-a": "--alias",
    "-v": "--verbose",
    "--embeddings": "--embedding",
    "--webui": "--ui",
    "--no-webui": "--no-ui",
}
VALUE_FLAGS = {
    "--host",
    "--port",
    "--model",
    "--hf-repo",
    "--hf-file",
    "--ctx-size",
    "--parallel",
    "--batch-size",
    "--n-predict",
    "--temp",
    "--top-k",
    "--top-p",
    "--min-p",
    "--seed",
    "--alias",
    "--tags",
    "--api-key",
    "--cors-origins",
    "--cors-methods",
    "--cors-headers",
    "--chat-template",
    "--chat-template-file",
    "--pooling",
    "--spec-type",
    "--cache-ram",
    "--reasoning",
}
SWITCH_FLAGS = {
    "--metrics",
    "--slots",
    "--no-slots",
    "--kv-unified",
    "--verbose",
    "--cors-credentials",
    "--no-cors-credentials",
    "--ui",
    "--no-ui",
    "--ui-mcp-proxy",
    "--context-shift",
    "--no-context-shift",
}
# llama-server's CORS defaults (its common_params): mlx-serve-http's own are stricter (no CORS at all).
LLAMA_CORS = {"--cors-origins": "*", "--cors-methods": "GET, POST, DELETE, OPTIONS", "--cors-headers": "*"}
# llama-server's default sampler settings (common_params_sampling): mlxd's own sample the whole distribution
LLAMA_SAMPLING = {"--temp": "0.8", "--top-k": "40", "--top-p": "0.95", "--min-p": "0.05"}
LLAMA_DEFAULT_PARALLEL = 4  # llama-server's slot count when -np is not given
LLAMA_DEFAULT_CACHE_RAM_MIB = 8192  # llama-server's --cache-ram default (its prompt cache's bound)


class UsageError(Exception):
    """A flag this launcher cannot honour; the message names it."""


@dataclass
class LlamaArgs:
    """The llama-server command line, parsed (flag -> value; switches -> True)."""

    values: dict[str, str] = field(default_factory=dict)
    switches: set[str] = field(default_factory=set)


def parse_llama_args(argv: list[str]) -> LlamaArgs:
    """Parse llama-server flags (``--flag value`` or ``--flag=value``).

    Raises:
        UsageError: an unknown flag, a missing value, or an ignored flag with a value it cannot honour.
    """
    parsed = LlamaArgs()
    index = 0
    while index < len(argv):
        flag, value = argv[index], None
        if flag.startswith("--") and "=" in flag:
            flag, value = flag.split("=", 1)
        index += 1
        if flag in IGNORED_FLAGS:
            if IGNORED_FLAGS[flag] and value is None:
                index += 1  # its value means nothing here either
            if flag in ("--flash-attn", "-fa") and value not in (None,) and value not in ("on", "off", "auto"):
                raise UsageError(f"{flag}: expected on, off or auto")
            continue
        flag = ALIASES.get(flag, flag)
        if flag in SWITCH_FLAGS:
            parsed.switches.add(flag)
        elif flag in VALUE_FLAGS:
            if value is None:
                if index >= len(argv):
                    raise UsageError(f"{flag} needs a value")
                value, index = argv[index], index + 1
            parsed.values[flag] = value
        else:
            raise UsageError(
                f"{flag} is not supported by mlxd's llama-server launcher (see its docstring for the "
                "flags it maps and the ones it ignores)"
            )
    return parsed


def resolve_model(args: LlamaArgs) -> tuple[Path, Path]:
    """(the model to serve, the checkpoint it comes from): ``--model`` as given, or the GGUF copy of a known
    hub model's local checkpoint (``gguf_copy``), as llama-server serves (and reports) a GGUF file."""
    if "--model" in args.values:
        return Path(args.values["--model"]), Path(args.values["--model"])
    repo = args.values.get("--hf-repo")
    if repo is None:
        raise UsageError("no model: give --model PATH or --hf-repo (router mode is not supported)")
    key = (repo, args.values.get("--hf-file"))
    if key not in HUB_MODELS:
        raise UsageError(
            f"--hf-repo {repo} --hf-file {key[1]}: not available offline (known: "
            f"{sorted(f'{r}/{f}' if f else r for r, f in HUB_MODELS)})"
        )
    path = HUB_MODELS[key]
    if not path.exists():
        raise UsageError(f"{repo}: its local copy {path} is not present")
    return gguf_copy(path), path


def gguf_copy(checkpoint: Path) -> Path:
    """The GGUF copy of a checkpoint directory: ``<cache>/gguf-copies/<hash of its files>/<name>.gguf``
    (``<cache>``: $MLXD_CACHE_DIR, else $XDG_CACHE_HOME/mlxd, else ~/.cache/mlxd, as mlxd's), written the
    first time by ``write_stories_gguf.py`` (in a child process: this one, the gateway, stays without MLX)."""
    digest = hashlib.sha256()
    for name in GGUF_SOURCE_FILES:
        digest.update((checkpoint / name).read_bytes())
    base = os.environ.get("MLXD_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mlxd"
    out = Path(base).expanduser() / "gguf-copies" / digest.hexdigest()[:16] / f"{checkpoint.name}.gguf"
    if not out.is_file():
        writer = Path(__file__).resolve().parent / "write_stories_gguf.py"
        subprocess.run([sys.executable, str(writer), str(checkpoint), str(out)], check=True, stdout=subprocess.DEVNULL)
    return out


def has_chat_template(model: Path) -> bool:
    """True when a checkpoint directory carries a chat template (GGUF files: assumed so)."""
    if not model.is_dir():
        return True
    if (model / "chat_template.jinja").exists() or (model / "chat_template.json").exists():
        return True
    try:
        return bool(json.loads((model / "tokenizer_config.json").read_text()).get("chat_template"))
    except (OSError, ValueError):
        return False


def daemon_command(args: LlamaArgs, model: Path, endpoint: str, checkpoint: Path | None = None) -> list[str]:
    """The ``mlxd`` command line for the llama-server flags (``checkpoint``: the directory ``model`` was
    written from, whose chat template counts; default ``model`` itself)."""
    values = args.values
    parallel = int(values.get("--parallel", LLAMA_DEFAULT_PARALLEL))
    command = [
        sys.executable,
        "-m",
        "mlxd_daemon",
        "--endpoint",
        endpoint,
        "--model",
        str(model),
        "--max-batch",
        str(parallel),
        "--drain-timeout",
        "1",
        "--stream-interval-ms",
        "0",
    ]
    for flag, default in LLAMA_SAMPLING.items():
        command += [flag, values.get(flag, default)]
    command += ["--sampler-rng", "llama.cpp"]  # seeded draws as llama-server's: its sampler chain and generator
    if "--ctx-size" in values and int(values["--ctx-size"]) > 0:
        ctx = int(values["--ctx-size"])
        if "--kv-unified" in args.switches:  # every slot may use the whole pool
            command += [
                "--max-kv-size",
                str(ctx),
                "--decode-storage-backend",
                "paged",
                "--kv-pool-tokens",
                str(ctx),
                "--kv-block-size",
                "16",
            ]
        else:
            command += ["--max-kv-size", str(ctx // parallel)]
    if int(values.get("--seed", -1)) >= 0:  # -1 (llama-server's default): a random seed, i.e. no default seed
        command += ["--seed", values["--seed"]]
    for flag, option in (
        ("--batch-size", "--prefill-chunk"),
        ("--pooling", "--pooling"),
        ("--chat-template", "--chat-template"),
        ("--chat-template-file", "--chat-template-file"),
        ("--reasoning", "--reasoning"),
    ):
        if flag in values:
            command += [option, values[flag]]
    templated = "--chat-template" in values or "--chat-template-file" in values
    if not templated and not has_chat_template(checkpoint or model):
        command += ["--chat-template", "chatml"]  # llama-server's fallback for a model without one
    mib = int(values.get("--cache-ram", LLAMA_DEFAULT_CACHE_RAM_MIB))
    command += ["--prefix-cache-bytes", str(max(mib, 0) * 1024 * 1024)]  # -1 (no limit): not expressible
    spec = values.get("--spec-type")
    if spec is not None:
        if not spec.startswith("ngram"):
            raise UsageError(f"--spec-type {spec}: only the ngram kinds (prompt lookup) are supported")
        command += ["--draft-kind", "prompt-lookup"]
    if "--context-shift" in args.switches and "--no-context-shift" not in args.switches:
        command.append("--context-shift")
    if "--verbose" in args.switches:
        command += ["--log-level", "debug"]
    return command


def gateway_args(args: LlamaArgs, endpoint: str) -> list[str]:
    """The ``mlx-serve-http`` options for the llama-server flags."""
    values = args.values
    gateway = [
        "--daemon",
        endpoint,
        "--port",
        values.get("--port", "8080"),
        "--log-level",
        "debug" if "--verbose" in args.switches else "warning",
    ]
    for host in values.get("--host", "127.0.0.1").split(","):
        gateway += ["--host", host.strip()]
    if "--alias" in values:  # llama-server keeps its aliases sorted (a std::set): the first names the model
        aliases = sorted({alias.strip() for alias in values["--alias"].split(",") if alias.strip()})
        gateway += ["--alias", ",".join(aliases)]
    for flag in ("--tags", "--api-key", "--n-predict"):
        if flag in values:
            gateway += [flag, values[flag]]
    for flag, default in LLAMA_CORS.items():
        gateway += [flag, values.get(flag, default)]
    gateway.append("--no-cors-credentials" if "--no-cors-credentials" in args.switches else "--cors-credentials")
    gateway.append("--metrics" if "--metrics" in args.switches else "--no-metrics")
    gateway.append("--no-slots" if "--no-slots" in args.switches else "--slots")
    gateway.append("--no-ui" if "--no-ui" in args.switches else "--ui")
    if "--ui-mcp-proxy" in args.switches:
        gateway.append("--ui-mcp-proxy")
    if "--verbose" in args.switches:
        gateway.append("--verbose-replies")  # llama-server's --verbose: every reply carries __verbose
    return gateway


def _die_with_parent() -> None:
    """In the child: get SIGTERM when this launcher dies, however it dies (Linux only)."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def main(argv: list[str]) -> int:
    try:
        args = parse_llama_args(argv)
        model, checkpoint = resolve_model(args)
        socket_dir = Path(tempfile.mkdtemp(prefix="mlxd-llama-"))
        endpoint = f"ipc://{socket_dir}/mlxd.sock"
        command = daemon_command(args, model, endpoint, checkpoint)
        gateway = gateway_args(args, endpoint)
    except (UsageError, ValueError, OSError, subprocess.CalledProcessError) as error:
        print(f"llama_server_compat: {error}", file=sys.stderr)
        return 2
    print(f"llama_server_compat: mlxd {' '.join(command[3:])}", file=sys.stderr, flush=True)
    daemon = subprocess.Popen(command, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
    try:
        from mlxd_cli.serve_http.main import main as serve_http

        serve_http(gateway, standalone_mode=False)
        return 0
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 1
    finally:
        daemon.terminate()
        try:
            daemon.wait(timeout=3)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        for leftover in socket_dir.iterdir():
            leftover.unlink(missing_ok=True)
        socket_dir.rmdir()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
