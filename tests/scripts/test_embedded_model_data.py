"""The embedded model's training data: the held-out split, copy samples, the plain-text check of eval_copy."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from embedded_model_data import (  # noqa: E402
    SampleMaker,
    build_corpus,
    chat_prompt,
    plausible_reply,
    train_tokenizer,
)


@pytest.fixture(scope="module")
def corpus():
    return build_corpus(max_files=60)


@pytest.fixture(scope="module")
def maker(corpus):
    return SampleMaker(train_tokenizer(corpus, 400), corpus, random.Random(0))


def test_held_out_paragraphs_never_reach_training(corpus):
    assert corpus.heldout_prose and corpus.train_prose and corpus.train_code
    assert not set(corpus.heldout_prose) & set(corpus.train_prose)
    share = len(corpus.heldout_prose) / (len(corpus.heldout_prose) + len(corpus.train_prose))
    assert 0.02 < share < 0.10  # one paragraph in 20, by a hash of its text


def test_text_copy_reply_is_the_paragraph_as_it_stands_in_the_prompt(maker):
    for _ in range(30):
        tokens, mask = maker.text_copy()
        start = mask.index(1)
        assert all(mask[start:]) and not any(mask[:start])
        reply = tokens[start:-1]
        assert tokens[-1] in (maker.eot, maker.im_end)
        # the reply's tokens stand, in order, inside the prompt: a token-for-token copy
        prompt = tokens[:start]
        assert any(prompt[i : i + len(reply)] == reply for i in range(len(prompt) - len(reply) + 1))


@pytest.mark.parametrize("zipf", [False, True])
def test_synthetic_copy_puts_loss_on_the_copy_only(maker, zipf):
    for _ in range(20):
        tokens, mask = maker.synthetic_copy(40, framed=0.5, zipf=zipf)
        start = mask.index(1)
        assert sum(mask) == 41 and all(mask[start:])
        body = tokens[start:-1]
        assert any(tokens[i : i + 40] == body for i in range(start - 40 + 1))  # the copied ids stand in the prompt


VOCABULARY = {
    "the",
    "function",
    "returns",
    "a",
    "list",
    "of",
    "items",
    "in",
    "order",
    "and",
    "each",
    "item",
    "is",
    "an",
    "object",
    "with",
    "name",
}


@pytest.mark.parametrize(
    "reply, why",
    [
        ("The function returns a list.", "5 words"),
        ("Sure. Tell me about dictionaries, the function returns a list of items", "echo"),
        ("The fnord returns a blorp of zork in qux and each item is an object", "known words"),
        ("the list of the list of the list of the list of the list of the list", "loop"),
        ("The function returns aaaaaaaaaa list of items in order and each item", "loop"),
    ],
)
def test_plausible_reply_rejects(reply, why):
    ok, reason = plausible_reply("Tell me about dictionaries.", reply, VOCABULARY)
    assert not ok and why in reason


def test_plausible_reply_accepts_text():
    reply = "The function returns a list of items in order, and each item is an object with a name."
    assert plausible_reply("Tell me about dictionaries.", reply, VOCABULARY) == (True, "")


def test_chat_prompt_matches_the_template_layout():
    assert chat_prompt("hi") == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
