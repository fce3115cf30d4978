"""Training data for the embedded model: an offline corpus, a BPE tokenizer, copy tasks.

Contract: everything here is deterministic for a given Python installation and seed. The corpus is
Python's own documentation (``pydoc_data.topics``) and the docstrings and sources of the standard
library, so it is on every machine that runs Python, with no download. Paragraphs are split into a
training set and a held-out set by a stable hash; held-out paragraphs never reach the trainer.

Samples are ``(tokens, loss_mask)`` pairs. Copy samples put loss only on the reply (the copied part),
which is what makes induction heads form quickly in a small model; plain text has loss everywhere.
"""

from __future__ import annotations

import ast
import hashlib
import random
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

COPY_INSTRUCTIONS = [
    "Repeat the following paragraph exactly:",
    "Repeat the following paragraph exactly:",
    "Repeat the following text exactly:",
    "Copy this text:",
    "Please repeat this exactly:",
    "Quote the following back to me:",
]


def chat_prompt(user: str, system: str | None = None) -> str:
    """The text the chat template renders for one user turn with a generation prompt."""
    text = f"{IM_START}system\n{system}{IM_END}\n" if system else ""
    return text + f"{IM_START}user\n{user}{IM_END}\n{IM_START}assistant\n"


def _stable_bucket(text: str, buckets: int) -> int:
    return int(hashlib.sha1(text.encode()).hexdigest()[:8], 16) % buckets


def _clean(paragraph: str) -> str:
    lines = [line.rstrip() for line in paragraph.strip("\n").splitlines()]
    return "\n".join(lines).strip()


def _source_lines(source: str) -> list[str]:
    """The source's lines with their endings, split at \\r\\n, \\r and \\n only (as ast.get_source_segment splits)."""
    return re.findall(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z", source)


def _node_source(lines: list[str], node: ast.AST) -> str:
    """``ast.get_source_segment(source, node)`` from the source's lines, split once per file (that function
    splits the whole source again on every call: minutes over the standard library)."""
    first, last = node.lineno - 1, node.end_lineno - 1
    if first == last:
        return lines[first].encode()[node.col_offset : node.end_col_offset].decode()
    head = lines[first].encode()[node.col_offset :].decode()
    tail = lines[last].encode()[: node.end_col_offset].decode()
    return "".join([head, *lines[first + 1 : last], tail])


def _docstrings_and_code(path: Path) -> tuple[list[str], list[str]]:
    try:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return [], []
    docs, code = [], []
    lines = _source_lines(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc:
                docs.append(doc)
        if isinstance(node, ast.FunctionDef) and node.end_lineno - node.lineno < 25:
            segment = _node_source(lines, node)
            if segment and 120 < len(segment) < 900:
                code.append(segment)
    return docs, code


@dataclass
class Corpus:
    """Paragraphs of prose and short functions of code, split into train and held-out."""

    train_prose: list[str]
    heldout_prose: list[str]
    train_code: list[str]


def build_corpus(max_files: int = 700) -> Corpus:
    """Collect prose paragraphs and code snippets from the running Python's documentation and stdlib.

    Args:
        max_files: how many standard-library modules to read (sorted by path, so deterministic).
    Returns:
        The corpus; 1 paragraph in 20 goes to the held-out set by a hash of its text.
    """
    import pydoc_data.topics as topics

    texts = [topics.topics[key] for key in sorted(topics.topics)]
    code: list[str] = []
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.rglob("*.py") if not re.search(r"/(test|tests|idle_test|site-packages)/", str(p)))
    for path in files[:max_files]:
        docs, snippets = _docstrings_and_code(path)
        texts.extend(docs)
        code.extend(snippets)
    paragraphs = set()
    for text in texts:
        for paragraph in re.split(r"\n\s*\n", text):
            paragraph = _clean(paragraph)
            if 80 <= len(paragraph) <= 1100 and sum(c.isalpha() for c in paragraph) > 0.6 * len(paragraph):
                paragraphs.add(paragraph)
    ordered = sorted(paragraphs)
    heldout = [p for p in ordered if _stable_bucket(p, 20) == 0]
    train = [p for p in ordered if _stable_bucket(p, 20) != 0]
    return Corpus(train_prose=train, heldout_prose=heldout, train_code=sorted(set(code)))


def train_tokenizer(corpus: Corpus, vocab_size: int) -> Tokenizer:
    """A byte-level BPE tokenizer (so any text encodes) with the three chat special tokens first."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus.train_prose + corpus.train_code, trainer=trainer)
    return tokenizer


class SampleMaker:
    """Makes token-level training samples; all randomness comes from the given ``random.Random``."""

    def __init__(self, tokenizer: Tokenizer, corpus: Corpus, rng: random.Random):
        self.tok = tokenizer
        self.rng = rng
        self.eot = tokenizer.token_to_id(ENDOFTEXT)
        self.im_end = tokenizer.token_to_id(IM_END)
        self.prose = corpus.train_prose
        self.code = corpus.train_code
        self.vocab_size = tokenizer.get_vocab_size()
        self.sep = self.encode("\n\n")[0]

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text).ids

    def _framed(self, prompt_text: str, reply_ids: list[int], chat: bool) -> tuple[list[int], list[int]]:
        end = self.im_end if chat else self.eot
        prompt_ids = self.encode(prompt_text)
        tokens = prompt_ids + reply_ids + [end]
        mask = [0] * len(prompt_ids) + [1] * (len(reply_ids) + 1)
        return tokens, mask

    def copy_prompt(self, paragraph: str, chat: bool) -> tuple[str, list[int]]:
        """A copy prompt and its reply's tokens: the paragraph's tokens exactly as they stand in the
        prompt (after a space the first word carries it), so the reply is a token-for-token copy."""
        instruction = self.rng.choice(COPY_INSTRUCTIONS)
        separator = self.rng.choice([" ", " ", "\n", "\n\n"])
        user = f"{instruction}{separator}{paragraph}"
        reply = self.encode(" " + paragraph) if separator == " " else self.encode(paragraph)
        return (chat_prompt(user) if chat else user + "\n\n"), reply

    def synthetic_copy(self, length: int, framed: float = 0.25, zipf: bool = False) -> tuple[list[int], list[int]]:
        """Random token ids from the whole vocabulary, copied: teaches copying before any language.

        Measured here (2 layers x 128, 64 rows x 128, masked loss): copy loss falls from 7.0 to 2.2 in
        250 steps with ids from the whole vocabulary, while a pool of 64 ids learned more slowly and its
        copy circuit did not carry over to other tokens. A ``framed`` share of the samples sit in the
        copy-task frame (raw or chat); the rest are bare ``body SEP body END``.
        """
        if zipf:
            # a few ids repeated with Zipf weights, as words repeat in text: the copy cannot place itself
            # by the previous token alone and has to look further back
            ids = self.rng.sample(range(3, self.vocab_size), self.rng.randint(8, 40))
            body = self.rng.choices(ids, weights=[1.0 / (rank + 1) for rank in range(len(ids))], k=length)
        else:
            body = [self.rng.randrange(3, self.vocab_size) for _ in range(length)]
        if self.rng.random() >= framed:
            return body + [self.sep] + body + [self.eot], [0] * (length + 1) + [1] * (length + 1)
        chat = self.rng.random() < 0.5
        instruction = self.rng.choice(COPY_INSTRUCTIONS)
        prefix = chat_prompt(instruction + "\n") if chat else instruction + "\n"
        # The random body goes where the paragraph would be, then the frame closes as in real prompts.
        head = self.encode(prefix[: prefix.rindex(IM_END)] if chat else prefix)
        tail = self.encode(f"{IM_END}\n{IM_START}assistant\n" if chat else "\n\n")
        prompt = head + body + tail
        end = self.im_end if chat else self.eot
        return prompt + body + [end], [0] * len(prompt) + [1] * (len(body) + 1)

    def transfer_mix(self) -> tuple[list[int], list[int]]:
        """Phase two: longer random copies and copies of short real paragraphs."""
        roll = self.rng.random()
        if roll < 0.25:
            return self.synthetic_copy(self.rng.randint(16, 100), framed=0.5)
        if roll < 0.5:
            return self.synthetic_copy(self.rng.randint(16, 100), framed=0.5, zipf=True)
        return self.text_copy(max_tokens=110)

    def text_copy(self, max_tokens: int | None = None) -> tuple[list[int], list[int]]:
        paragraph = self.rng.choice(self.prose)
        while max_tokens is not None and len(paragraph) > 4 * max_tokens:
            paragraph = self.rng.choice(self.prose)
        chat = self.rng.random() < 0.6
        prompt, reply = self.copy_prompt(paragraph, chat)
        return self._framed(prompt, reply, chat)

    def chat_quote(self) -> tuple[list[int], list[int]]:
        paragraph = self.rng.choice(self.prose)
        question = self.rng.choice(["What did I just write?", "Say that back to me.", "Echo my message."])
        reply = f'You wrote: "{paragraph}"'
        return self._framed(chat_prompt(f"{paragraph}\n\n{question}"), self.encode(reply), True)

    def code_edit(self) -> tuple[list[int], list[int]]:
        """Rename one identifier in a short function: copying with a small, local change."""
        snippet = self.rng.choice(self.code)
        names = sorted(set(re.findall(r"\b[a-z_][a-z0-9_]{2,}\b", snippet)) - {"def", "return", "self", "None"})
        if not names:
            return self.text_copy()
        old = self.rng.choice(names)
        new = old + self.rng.choice(["_value", "2", "_new", "_x"])
        edited = re.sub(rf"\b{re.escape(old)}\b", new, snippet)
        chat = self.rng.random() < 0.6
        user = f"Rename `{old}` to `{new}` in this code:\n\n{snippet}"
        prompt = chat_prompt(user) if chat else user + "\n\n"
        return self._framed(prompt, self.encode(edited), chat)

    def plain_text(self) -> tuple[list[int], list[int]]:
        source = self.code if self.rng.random() < 0.15 else self.prose
        tokens = self.encode(self.rng.choice(source)) + [self.eot]
        return tokens, [1] * len(tokens)

    def text_mix(self) -> tuple[list[int], list[int]]:
        """The text phase's mixture: copies in both frames, chat quotes, code edits, repeated-id copies, plain text."""
        roll = self.rng.random()
        if roll < 0.55:
            return self.text_copy()
        if roll < 0.63:
            return self.chat_quote()
        if roll < 0.70:
            return self.code_edit()
        if roll < 0.80:
            # Ids repeated as words repeat in text: the copy must place itself by more than the last token
            # (the errors left after training without these were all jumps to another occurrence of a word).
            return self.synthetic_copy(self.rng.randint(30, 150), framed=0.5, zipf=True)
        return self.plain_text()


# Plain prompts (no copy asked, none from the corpus) for the plausible-text check of a trained model.
PLAIN_PROMPTS = [
    "Explain how a bicycle works.",
    "What is a list comprehension?",
    "Tell me about dictionaries.",
    "How do I read a file line by line?",
    "Write a paragraph about exceptions.",
    "What does the return statement do?",
    "Describe how a class is defined.",
    "How does sorting work?",
    "What is a generator?",
    "Tell me something about strings.",
    "Why would I use a tuple?",
    "How are modules imported?",
]


def known_words(corpus: Corpus) -> set[str]:
    """Every lower-cased word of the training text (what a plausible reply is made of)."""
    words: set[str] = set()
    for text in corpus.train_prose + corpus.train_code:
        words.update(w.lower() for w in re.findall(r"[A-Za-z]+", text))
    return words


def plausible_reply(prompt: str, reply: str, vocabulary: set[str]) -> tuple[bool, str]:
    """Whether a reply to a plain prompt reads as text: at least 8 words, not an echo of the prompt, at
    least 90% of its words known, and not stuck in a loop (at least 40% of its words distinct, no
    character repeated 8 times in a row). Returns (ok, why not)."""
    words = [w.lower() for w in re.findall(r"[A-Za-z]+", reply)]
    if len(words) < 8:
        return False, f"{len(words)} words"
    asked = " ".join(w.lower() for w in re.findall(r"[A-Za-z]+", prompt))
    if asked in " ".join(words):
        return False, "echo"
    known = sum(w in vocabulary for w in words) / len(words)
    if known < 0.9:
        return False, f"{known:.0%} known words"
    if len(set(words)) < 0.4 * len(words) or re.search(r"(.)\1{7}", reply):
        return False, "loop"
    return True, ""


def pack_rows(make_sample, rows: int, length: int, pad_id: int) -> tuple[list[list[int]], list[list[int]]]:
    """Fill ``rows`` rows of ``length`` tokens with whole samples (too-long ones are skipped)."""
    token_rows, mask_rows = [], []
    for _ in range(rows):
        tokens: list[int] = []
        mask: list[int] = []
        while True:
            sample_tokens, sample_mask = make_sample()
            if len(sample_tokens) > length:
                continue
            if len(tokens) + len(sample_tokens) > length:
                break
            tokens += sample_tokens
            mask += sample_mask
        fill = length - len(tokens)
        token_rows.append(tokens + [pad_id] * fill)
        mask_rows.append(mask + [0] * fill)
    return token_rows, mask_rows
