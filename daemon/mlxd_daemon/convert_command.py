"""``mlxd convert-gguf FILE OUT``: write the mlx-lm checkpoint directory of a GGUF file.

Contract: on success prints ``wrote OUT (N tensors, architecture A)`` and exits 0; a file that cannot be
converted (``GGUFError``) prints ``mlxd: <reason>`` on stderr, one line, and exits 2. The conversion is
``mlxd_engine.loading.gguf_import.convert_gguf``; ``mlxd -m FILE.gguf`` does the same once into the cache.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import click


@click.command("convert-gguf")
@click.argument("gguf_file", type=click.Path(dir_okay=False))
@click.argument("out_dir", type=click.Path(file_okay=False))
def convert_gguf_command(gguf_file: str, out_dir: str) -> None:
    """Convert GGUF_FILE (llama or qwen2) into the mlx-lm checkpoint directory OUT_DIR."""
    from mlxd_engine import GGUFError, convert_gguf

    try:
        out = convert_gguf(gguf_file, out_dir)
    except GGUFError as error:
        click.echo(f"mlxd: {error}", err=True)
        sys.exit(2)
    architecture = json.loads((out / "config.json").read_text())["model_type"]
    click.echo(f"wrote {out} ({_tensor_count(out / 'model.safetensors')} tensors, architecture {architecture})")


def _tensor_count(safetensors_path: Path) -> int:
    """Tensors listed in a safetensors header (8-byte little-endian length, then JSON), without reading them."""
    with open(safetensors_path, "rb") as stream:
        (header_bytes,) = struct.unpack("<Q", stream.read(8))
        header = json.loads(stream.read(header_bytes))
    return sum(1 for name in header if name != "__metadata__")
