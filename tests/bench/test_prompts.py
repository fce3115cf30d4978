"""mlx-bench prompts: the documented styles, determinism per seed, variety per request, length."""

from __future__ import annotations

import pytest

from mlxd_cli.bench.prompts import (
    COPY_WRAPPER,
    PLAIN_WRAPPER,
    PromptBook,
    estimate_tokens,
    first_sentence,
    make_paragraph,
    style_prompt,
)


def test_copy_style_wraps_the_whole_paragraph_in_the_documented_instruction():
    book = PromptBook(seed=3, prompt_tokens=120)
    prompt = book.prompt("copy", "0", 4, 2)
    assert COPY_WRAPPER == "Repeat the following paragraph exactly: "
    assert prompt.startswith("Repeat the following paragraph exactly: ")
    assert prompt == COPY_WRAPPER + book.paragraph("0", 4, 2)
    assert book.paragraph("0", 4, 2) == make_paragraph(3, "r0/c4/i2", 120 - 6)  # 5 wrapper words ~ 6 tokens


def test_plain_style_asks_for_new_text_on_one_sentence_without_the_copy_wrapper():
    book = PromptBook(seed=3, prompt_tokens=120)
    prompt = book.prompt("plain", "0", 4, 2)
    paragraph = book.paragraph("0", 4, 2)
    assert "Repeat" not in prompt and "exactly" not in prompt
    assert prompt.startswith(PLAIN_WRAPPER)
    topic = prompt[len(PLAIN_WRAPPER) :]
    assert topic == first_sentence(paragraph) and paragraph.startswith(topic)
    assert topic.endswith(".") and topic.count(". ") == 0
    assert estimate_tokens(prompt) < 40  # little to copy: one sentence, not the paragraph


def test_prompts_are_deterministic_for_a_seed_and_differ_across_seeds():
    first = [PromptBook(7, 100).prompt("copy", "1", 8, i) for i in range(8)]
    again = [PromptBook(7, 100).prompt("copy", "1", 8, i) for i in range(8)]
    other_seed = [PromptBook(8, 100).prompt("copy", "1", 8, i) for i in range(8)]
    assert first == again
    assert all(a != b for a, b in zip(first, other_seed))


def test_each_request_round_and_level_gets_its_own_paragraph():
    book = PromptBook(0, 120)
    batch = [book.prompt("copy", "0", 8, i) for i in range(8)]
    assert len(set(batch)) == 8
    assert book.prompt("copy", "0", 8, 0) != book.prompt("copy", "1", 8, 0)  # another round
    assert book.prompt("copy", "0", 8, 0) != book.prompt("copy", "0", 4, 0)  # another level
    assert book.prompt("copy", "warmup", 1, 0) not in batch


@pytest.mark.parametrize("prompt_tokens", [40, 120, 500, 2000])
def test_paragraphs_are_about_prompt_tokens_long(prompt_tokens):
    for index in range(5):
        prompt = PromptBook(1, prompt_tokens).prompt("copy", "0", 1, index)
        assert abs(estimate_tokens(prompt) - prompt_tokens) <= max(0.15 * prompt_tokens, 8), prompt


def test_a_tiny_length_still_gives_one_sentence():
    paragraph = make_paragraph(0, "x", 1)
    assert paragraph.endswith(".") and len(paragraph.split()) >= 5


def test_an_unknown_style_is_refused():
    with pytest.raises(ValueError, match="unknown prompt style"):
        style_prompt("poem", "Some text.")
