"""Write stories260K (the repository's mlx-lm copy, or any such llama2.c checkpoint) as a GGUF file.

    .venv/bin/python scripts/write_stories_gguf.py models/stories260K out/stories260K.gguf

Contract: ``write_gguf(checkpoint, out)`` writes the checkpoint's float32 tensors under llama.cpp's names
with MLX's ``mx.save_gguf`` and the architecture and tokenizer as llama.cpp's GGUF keys, so that mlxd's
own GGUF import (``mlxd_engine.load("x.gguf")``) serves the same model: llama2.c checkpoints rotate
consecutive feature pairs (``rope_traditional``), which is llama.cpp's q/k row layout, so q/k are
written unpermuted and the import's un-permutation gives the Hugging Face layout. The tokenizer is
written as a SentencePiece vocabulary (``tokenizer.ggml.model`` "llama") with scores that rank its pieces
as the checkpoint's merges do (the import rebuilds the merges from them; ``write_gguf`` checks that it
gets the checkpoint's merges back, else raises ``ValueError``). Written to a temporary sibling and
renamed, so a reader never sees half a file. The llama-server launcher (``llama_server_compat.py``)
serves stories260K as such a copy, written once into mlxd's cache.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import mlx.core as mx

from mlxd_engine.loading import gguf_import
from mlxd_engine.loading.gguf_tokenizer import spm_merges

NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6  # llama.cpp's token types
# mlx-lm's module names -> llama.cpp's tensor stems: the inverse of what the import reads
GLOBAL_TENSORS = {module: stem for stem, module in gguf_import.GLOBAL_TENSORS.items()}
BLOCK_TENSORS = {module: stem for stem, module in gguf_import.BLOCK_TENSORS.items()}


def gguf_name(name: str) -> str:
    """llama.cpp's name of an mlx-lm tensor (``model.layers.3.self_attn.q_proj.weight`` -> ``blk.3.attn_q.weight``)."""
    stem, _, suffix = name.rpartition(".")
    if stem in GLOBAL_TENSORS:
        return f"{GLOBAL_TENSORS[stem]}.{suffix}"
    parts = stem.split(".")
    module = ".".join(parts[3:])
    if parts[:2] != ["model", "layers"] or len(parts) < 4 or module not in BLOCK_TENSORS:
        raise ValueError(f"tensor {name!r} has no llama.cpp name")
    return f"blk.{parts[2]}.{BLOCK_TENSORS[module]}.{suffix}"


def vocabulary(tokenizer: dict) -> tuple[list[str], list[float], list[int]]:
    """(pieces in id order, scores, token types) of a SentencePiece-style BPE ``tokenizer.json``.

    A piece made by the n-th merge (the first that makes it) scores -n, so ranking pieces by score ranks
    them as the merges do; pieces no merge makes score below all of them, in id order."""
    model = tokenizer["model"]
    if model.get("type") != "BPE" or not model.get("byte_fallback"):
        raise ValueError("only a SentencePiece-style BPE tokenizer (byte fallback) can be written")
    pieces = [piece for piece, _ in sorted(model["vocab"].items(), key=lambda item: item[1])]
    special = {token["content"] for token in tokenizer.get("added_tokens", []) if token.get("special")}
    made: dict[str, int] = {}
    for rank, merge in enumerate(model["merges"]):
        left, right = merge.split(" ") if isinstance(merge, str) else merge
        made.setdefault(left + right, rank)
    scores = [float(-made[p]) if p in made else float(-len(model["merges"]) - i) for i, p in enumerate(pieces)]
    types = [
        UNKNOWN
        if p == model.get("unk_token")
        else CONTROL
        if p in special
        else BYTE
        if p.startswith("<0x") and len(p) == 6
        else NORMAL
        for p in pieces
    ]
    return pieces, scores, types


def write_gguf(checkpoint: Path, out: Path) -> Path:
    """Write ``checkpoint`` (an mlx-lm llama directory with ``rope_traditional``) as the GGUF file ``out``."""
    config = json.loads((checkpoint / "config.json").read_text())
    if config.get("model_type") != "llama" or not config.get("rope_traditional"):
        raise ValueError("only a llama checkpoint with rope_traditional (llama2.c's layout) can be written")
    tokenizer = json.loads((checkpoint / "tokenizer.json").read_text())
    pieces, scores, types = vocabulary(tokenizer)
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in tokenizer["model"]["merges"]]
    if [tuple(m) for m in spm_merges(pieces, scores)] != merges:
        raise ValueError("the scores written would not give the tokenizer's merges back")
    token_config = json.loads((checkpoint / "tokenizer_config.json").read_text())
    ids = {piece: i for i, piece in enumerate(pieces)}
    weights = mx.load(str(checkpoint / "model.safetensors"))
    tensors = {gguf_name(name): array for name, array in weights.items()}
    heads, hidden = config["num_attention_heads"], config["hidden_size"]
    metadata: dict = {
        "general.architecture": "llama",
        "general.name": checkpoint.name,
        "llama.context_length": mx.array(config["max_position_embeddings"], dtype=mx.uint32),
        "llama.embedding_length": mx.array(hidden, dtype=mx.uint32),
        "llama.block_count": mx.array(config["num_hidden_layers"], dtype=mx.uint32),
        "llama.feed_forward_length": mx.array(config["intermediate_size"], dtype=mx.uint32),
        "llama.attention.head_count": mx.array(heads, dtype=mx.uint32),
        "llama.attention.head_count_kv": mx.array(config.get("num_key_value_heads", heads), dtype=mx.uint32),
        "llama.rope.dimension_count": mx.array(config.get("head_dim", hidden // heads), dtype=mx.uint32),
        "llama.attention.layer_norm_rms_epsilon": mx.array(config["rms_norm_eps"], dtype=mx.float32),
        "llama.rope.freq_base": mx.array(config.get("rope_theta", 10000.0), dtype=mx.float32),
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": pieces,
        "tokenizer.ggml.scores": mx.array(scores, dtype=mx.float32),
        "tokenizer.ggml.token_type": mx.array(types, dtype=mx.int32),
    }
    for key, field in (("bos_token_id", "bos_token"), ("eos_token_id", "eos_token"), ("unknown_token_id", "unk_token")):
        if token_config.get(field) in ids:
            metadata[f"tokenizer.ggml.{key}"] = mx.array(ids[token_config[field]], dtype=mx.uint32)
    out.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=out.parent, suffix=".gguf")
    os.close(descriptor)
    try:
        mx.save_gguf(temporary, tensors, metadata)
        os.chmod(temporary, 0o644)  # mkstemp's 0600 would keep the file from other users (a llama-server run as one)
        os.replace(temporary, out)
    finally:
        Path(temporary).unlink(missing_ok=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    try:
        print(write_gguf(args.checkpoint, args.out))
    except (OSError, ValueError, KeyError) as error:
        print(f"write_stories_gguf: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
