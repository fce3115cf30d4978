"""A Hugging Face ``tokenizer.json`` (and its ``tokenizer_config.json``) rebuilt from GGUF metadata.

Contract: ``build_tokenizer(meta)`` returns a ``tokenizers.Tokenizer`` that tokenizes as llama.cpp does
for that file; ``tokenizer_config(meta, context_length)`` returns the tokenizer_config.json fields
(special tokens, chat template, whether BOS is added). ``meta`` holds plain Python values
(``gguf_import.read_gguf``). Two tokenizer models:
- ``gpt2``: byte-level BPE with the file's merges; the pre-tokenizer follows ``tokenizer.ggml.pre``
  (the regexes llama.cpp applies for that name, see ``PRE_TOKENIZERS``).
- ``llama``: SentencePiece-style BPE with byte fallback; merges are generated from the vocabulary and
  its scores (every split of a piece into two pieces of the vocabulary, ranked by the piece's score).
Control tokens (type 3) become special added tokens, user-defined ones (type 4) plain added tokens.
Anything else raises ``GGUFError``.
"""

from __future__ import annotations

from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from ..errors import GGUFError

NORMAL, UNKNOWN, CONTROL, USER_DEFINED = 1, 2, 3, 4  # llama.cpp token types
SPM_SPACE = "\u2581"

LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _gpt2_regex():
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _digits_then_gpt2():
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _gpt2_regex()])


def _split_then_bytes(regex: str):
    def make():
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )

    return make


# tokenizer.ggml.pre -> the pre-tokenizer llama.cpp's regexes for that name amount to
PRE_TOKENIZERS = {
    "default": _gpt2_regex,
    "gpt2": _gpt2_regex,
    "smollm": _digits_then_gpt2,
    "starcoder": _digits_then_gpt2,
    "refact": _digits_then_gpt2,
    "llama-bpe": _split_then_bytes(LLAMA3_REGEX),
    "llama3": _split_then_bytes(LLAMA3_REGEX),
    "llama-v3": _split_then_bytes(LLAMA3_REGEX),
    "dbrx": _split_then_bytes(LLAMA3_REGEX),
    "smaug-bpe": _split_then_bytes(LLAMA3_REGEX),
    "qwen2": _split_then_bytes(QWEN2_REGEX),
    "deepseek-r1-qwen": _split_then_bytes(QWEN2_REGEX),
    "stablelm2": _split_then_bytes(QWEN2_REGEX),
}


def _tokens(meta: dict[str, Any]) -> tuple[list[str], list[int]]:
    tokens = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise GGUFError("GGUF metadata has no tokenizer.ggml.tokens")
    types = meta.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    return list(tokens), [int(t) for t in types]


def _token(meta: dict[str, Any], key: str, tokens: list[str]) -> str | None:
    index = meta.get(f"tokenizer.ggml.{key}")
    return tokens[int(index)] if index is not None and 0 <= int(index) < len(tokens) else None


def _add_tokens(tokenizer: Tokenizer, tokens: list[str], types: list[int], special_types: tuple[int, ...]) -> None:
    """Added tokens in id order: special_types as special, user-defined as plain; both matched whole."""
    for token, kind in zip(tokens, types):
        if kind in special_types:
            tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False)])
        elif kind == USER_DEFINED:
            tokenizer.add_tokens([AddedToken(token, special=False, normalized=False)])


def _post_processor(meta: dict[str, Any], tokens: list[str], add_bos: bool):
    """No specials around the text, or BOS before / EOS after it where the file says they are added."""
    single, pair, specials = "$A:0", "$A:0 $B:1", []
    bos_id, eos_id = meta.get("tokenizer.ggml.bos_token_id"), meta.get("tokenizer.ggml.eos_token_id")
    if add_bos and bos_id is not None:
        bos = tokens[int(bos_id)]
        single, pair = f"{bos}:0 {single}", f"{bos}:0 $A:0 {bos}:1 $B:1"
        specials.append((bos, int(bos_id)))
    if meta.get("tokenizer.ggml.add_eos_token") and eos_id is not None:
        eos = tokens[int(eos_id)]
        single, pair = f"{single} {eos}:0", f"{pair} {eos}:1"
        specials.append((eos, int(eos_id)))
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)


def split_merge(merge: str, vocab: dict[str, int]) -> tuple[str, str]:
    """A GGUF merge "a b" as its pair; byte-level tokens hold no spaces, but other vocabularies may."""
    left, _, right = merge.partition(" ")
    if merge.count(" ") == 1:
        return left, right
    for i, char in enumerate(merge):
        if char == " " and merge[:i] in vocab and merge[i + 1 :] in vocab:
            return merge[:i], merge[i + 1 :]
    raise GGUFError(f"GGUF merge {merge!r} does not split into two tokens of the vocabulary")


def _gpt2_tokenizer(meta: dict[str, Any]) -> Tokenizer:
    tokens, types = _tokens(meta)
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise GGUFError(f"GGUF pre-tokenizer {pre!r} is not supported (supported: {', '.join(sorted(PRE_TOKENIZERS))})")
    vocab = {token: i for i, token in enumerate(tokens)}
    merges = [split_merge(m, vocab) for m in meta.get("tokenizer.ggml.merges") or []]
    tokenizer = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    tokenizer.pre_tokenizer = PRE_TOKENIZERS[pre]()
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = _post_processor(meta, tokens, bool(meta.get("tokenizer.ggml.add_bos_token", False)))
    _add_tokens(tokenizer, tokens, types, (CONTROL,))
    return tokenizer


def spm_merges(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """Merges of a SentencePiece vocabulary: every split of a piece into two pieces, best piece score first.

    Within a piece, splits are ordered by their halves' scores (higher first); the sort by the piece's
    score is stable. Example: pieces a, b, c, ab (score -1), abc (score -2) give [(a, b), (ab, c)].
    """
    score = {token: s for token, s in zip(tokens, scores)}
    merges = []
    for piece, piece_score in score.items():
        local = [
            (piece[:i], piece[i:], piece_score)
            for i in range(1, len(piece))
            if piece[:i] in score and piece[i:] in score
        ]
        local.sort(key=lambda m: (score[m[0]], score[m[1]]), reverse=True)
        merges.extend(local)
    merges.sort(key=lambda m: m[2], reverse=True)
    return [(left, right) for left, right, _ in merges]


def _spm_tokenizer(meta: dict[str, Any]) -> Tokenizer:
    tokens, types = _tokens(meta)
    scores = meta.get("tokenizer.ggml.scores")
    if not scores or len(scores) != len(tokens):
        raise GGUFError("GGUF SentencePiece vocabulary has no tokenizer.ggml.scores for its tokens")
    vocab = {token: i for i, token in enumerate(tokens)}
    tokenizer = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=spm_merges(tokens, scores),
            dropout=None,
            unk_token=_token(meta, "unknown_token_id", tokens),
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    replace = normalizers.Replace(" ", SPM_SPACE)
    add_space_prefix = meta.get("tokenizer.ggml.add_space_prefix", True)
    tokenizer.normalizer = (
        normalizers.Sequence([normalizers.Prepend(SPM_SPACE), replace]) if add_space_prefix else replace
    )
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace(SPM_SPACE, " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
        if add_space_prefix
        else [decoders.Replace(SPM_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    tokenizer.post_processor = _post_processor(meta, tokens, bool(meta.get("tokenizer.ggml.add_bos_token", True)))
    _add_tokens(tokenizer, tokens, types, (UNKNOWN, CONTROL))
    return tokenizer


def build_tokenizer(meta: dict[str, Any]) -> Tokenizer:
    """The tokenizer of a GGUF file (see the module docstring).

    Raises:
        GGUFError: a tokenizer model other than gpt2 / llama, an unknown pre-tokenizer, missing fields.
    """
    kind = meta.get("tokenizer.ggml.model")
    if kind == "gpt2":
        return _gpt2_tokenizer(meta)
    if kind == "llama":
        return _spm_tokenizer(meta)
    raise GGUFError(f"GGUF tokenizer model {kind!r} is not supported (supported: gpt2, llama)")


def tokenizer_config(meta: dict[str, Any], context_length: int) -> dict:
    """tokenizer_config.json: special tokens by id, the chat template, BOS/EOS adding, the context length."""
    tokens, types = _tokens(meta)
    spm = meta.get("tokenizer.ggml.model") == "llama"
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", spm)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
    }
    named = set()
    for field, key in (
        ("bos_token", "bos_token_id"),
        ("eos_token", "eos_token_id"),
        ("unk_token", "unknown_token_id"),
        ("pad_token", "padding_token_id"),
    ):
        token = _token(meta, key, tokens)
        if token is not None:
            config[field] = token
            named.add(token)
    additional = [t for t, kind in zip(tokens, types) if kind == CONTROL and t not in named]
    if additional:
        config["additional_special_tokens"] = additional
    config["model_max_length"] = int(context_length)
    config["clean_up_tokenization_spaces"] = False
    if meta.get("tokenizer.chat_template"):
        config["chat_template"] = meta["tokenizer.chat_template"]
    return config
