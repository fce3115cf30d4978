"""Synthetic prompts for mlx-bench: deterministic English paragraphs and the prompt styles.

Contract:
    * ``make_paragraph(seed, key, prompt_tokens)`` builds a paragraph of plain English sentences from the
      word lists and sentence templates embedded below (no download). The same ``(seed, key)`` always
      gives the same paragraph, on any machine and Python run (``random.Random`` seeded with a string
      hashes it with SHA-512, independent of ``PYTHONHASHSEED``). Its length is about ``prompt_tokens``
      tokens, estimated as ``TOKENS_PER_WORD`` (1.3) tokens per word; real tokenizers differ a little.
    * ``PromptBook(seed, prompt_tokens).prompt(style, round_key, concurrency, index)`` is what the runner
      asks for: request ``index`` of a batch (one round, one concurrency level) gets its own paragraph,
      keyed by ``(round, concurrency, index)`` and sized so that the copy prompt (wrapper included) is
      about ``prompt_tokens`` tokens. Every target gets the same prompts in a batch; prompts do
      not repeat across rounds or concurrency levels, so a server's prompt cache cannot make one target
      look faster in later rounds.
    * Styles (``PROMPT_STYLES``):
        - ``copy``: ``"Repeat the following paragraph exactly: " + paragraph``. The reply copies about
          ``prompt_tokens`` tokens from the prompt: the case prompt lookup speeds up.
        - ``plain``: ``"Write about the following topic: " + the paragraph's first sentence``. Only one
          short sentence is given, so the reply is mostly new text with little to copy (plain decode).
          The plain prompt is therefore short (one sentence), whatever ``--prompt-tokens`` says.
        - ``chat``: a multi-turn session (the runner's chat mode). Turn 1 is ``[system, user]``: the fixed
          ``CHAT_SYSTEM`` message, then ``CHAT_WRAPPER + paragraph + " " + question 1``, sized so that turn 1
          is about ``prompt_tokens`` tokens; the paragraph is keyed ``chat/r../c../i..`` so it never shares a
          prefix with a plain or copy prompt of the same run. Each later turn appends the previous reply
          (the text the target returned) as an ``assistant`` message and a short follow-up ``user``
          question, deterministic per ``(seed, round, concurrency, index, turn)``
          (``PromptBook.follow_up``). The history at turn N is therefore about ``prompt_tokens + (N - 1) x
          (max_tokens + FOLLOW_UP_TOKENS + 2 x MESSAGE_OVERHEAD_TOKENS)`` tokens when every reply runs to
          ``max_tokens`` (``chat_history_tokens``); e.g. ``--prompt-tokens 1000 --max-tokens 150 --turns 4
          --ignore-eos`` reaches about 1.5K estimated tokens at turn 4 (SmolLM2's tokenizer counts about
          15% fewer than the estimate for these words: 1200 gives ~1.5K real tokens there).
        - ``extract`` and ``agent`` (``task_prompts.py``): many requests that fill the same shape, where
          a draft source shared across requests pays: ``extract`` asks for a person's or product's record as
          JSON (the shape is named, never shown); ``agent`` is one step of a coding agent's loop (request
          ``index`` is step ``index % AGENT_STEPS`` of session ``index // AGENT_STEPS``), whose tool calls
          repeat earlier sessions' and are not in its prompt. Both are short whatever ``prompt_tokens`` says.
"""

from __future__ import annotations

import random

from .task_prompts import AGENT_STEPS, agent_prompt, extract_prompt

TOKENS_PER_WORD = 1.3
COPY_WRAPPER = "Repeat the following paragraph exactly: "
PLAIN_WRAPPER = "Write about the following topic: "
PROMPT_STYLES = ("plain", "copy", "chat", "extract", "agent")
CHAT_SYSTEM = "You are a helpful assistant. Answer questions about the user's notes in plain English."
CHAT_WRAPPER = "Here are my notes. "
FOLLOW_UP_TOKENS = 10  # a follow-up question's length, estimated (the templates below are 6 to 10 words)
MESSAGE_OVERHEAD_TOKENS = 5  # chat-template tokens around one message (ChatML: <|im_start|>role ... <|im_end|>)

_ADJECTIVES = """
quiet old young bright dark small large narrow wide careful patient busy tired cheerful silent
ancient modern heavy light warm cold green yellow grey wooden stone broken famous simple curious
gentle strange distant local northern southern early late hidden open crowded empty steady sudden
""".split()
_NOUNS = """
farmer teacher sailor baker doctor painter engineer student captain gardener writer merchant
child neighbour traveller driver musician clerk mechanic builder shepherd nurse pilot librarian
""".split()
_THINGS = """
lamp letter basket ladder map bicycle lantern notebook window bridge boat wagon bell clock garden
fence road river valley market harbour tower station kitchen library meadow forest village field
""".split()
_VERBS_PAST = """
carried repaired painted opened closed found watched crossed visited cleaned followed measured
described counted moved lifted checked delivered borrowed returned planted studied built drew
""".split()
_VERBS_PRESENT = """
carries repairs paints opens closes finds watches crosses visits cleans follows measures describes
counts moves lifts checks delivers borrows returns plants studies builds draws
""".split()
_PREPOSITIONS = "across near behind beside under above along past through around".split()
_TIMES = (
    "before dawn",
    "at noon",
    "in the evening",
    "after the storm",
    "during the winter",
    "on a Sunday",
    "every morning",
    "late at night",
    "in early spring",
    "before the market opened",
    "after lunch",
    "at the end of the summer",
)
_REASONS = """
because the weather was changing|so that nobody would be late|while the others were asleep|
although it had started to rain|since the old one was lost|before anyone else could ask|
as the bells rang in the square|when the light grew weak
""".replace("\n", "").split("|")
_TEMPLATES = (
    "The {adj} {noun} {past} the {thing} {prep} the {thing2} {time}.",
    "Every day the {noun} {present} {a} {adj} {thing} {reason}.",
    "{Time}, {a} {adj} {noun} {past} the {thing} and {past2} it {prep} the {thing2}.",
    "Nobody knew why the {noun} {past} the {adj} {thing} {reason}.",
    "In the {adj} {thing}, the {noun} {past} a {thing2} {time}.",
    "The {noun} and the {noun2} {past} the {adj} {thing} together {reason}.",
    "Later the {noun} said that the {thing} {prep} the {thing2} was {adj}.",
    "{A} {adj} {thing} stood {prep} the {thing2}, and the {noun} {past} it {time}.",
)

_FOLLOW_UPS = (
    "Why did the {noun} go to the {thing}?",
    "What happened to the {thing} after that?",
    "Tell me more about the {adj} {noun}.",
    "Describe the {thing} in one sentence.",
    "Who else was near the {thing}, and why?",
    "Summarize your last answer in two sentences.",
    "What would the {noun} do next with the {thing}?",
    "Was the {thing} really {adj}? Explain briefly.",
)


def estimate_tokens(text: str) -> int:
    """Estimate a text's token count the way mlx-bench sizes its prompts.

    Args:
        text: Any text.

    Returns:
        round(words x ``TOKENS_PER_WORD``).
    """
    return round(len(text.split()) * TOKENS_PER_WORD)


def _sentence(rng: random.Random) -> str:
    template = rng.choice(_TEMPLATES)
    time_phrase = rng.choice(_TIMES)
    adjective = rng.choice(_ADJECTIVES)
    article = "an" if adjective[0] in "aeiou" else "a"
    words = {
        "adj": adjective,
        "a": article,
        "A": article.capitalize(),
        "noun": rng.choice(_NOUNS),
        "noun2": rng.choice(_NOUNS),
        "thing": rng.choice(_THINGS),
        "thing2": rng.choice(_THINGS),
        "past": rng.choice(_VERBS_PAST),
        "past2": rng.choice(_VERBS_PAST),
        "present": rng.choice(_VERBS_PRESENT),
        "prep": rng.choice(_PREPOSITIONS),
        "time": time_phrase,
        "Time": time_phrase[0].upper() + time_phrase[1:],
        "reason": rng.choice(_REASONS),
    }
    return template.format(**words)


def make_paragraph(seed: int, key: str, prompt_tokens: int) -> str:
    """A deterministic English paragraph of about ``prompt_tokens`` tokens.

    Args:
        seed: The run's ``--seed``.
        key: What distinguishes this paragraph from the others of the run (e.g. ``"r0/c4/i2"``).
        prompt_tokens: Target length in estimated tokens (at least one sentence is always produced).

    Returns:
        Sentences joined by spaces.
    """
    rng = random.Random(f"mlx-bench:{seed}:{key}")
    target_words = max(1, round(prompt_tokens / TOKENS_PER_WORD))
    sentences: list[str] = []
    words = 0
    while words < target_words:
        sentence = _sentence(rng)
        length = len(sentence.split())
        # Stop before a sentence that would overshoot by more than it would undershoot without it.
        if sentences and words + length - target_words > target_words - words:
            break
        sentences.append(sentence)
        words += length
    return " ".join(sentences)


def first_sentence(paragraph: str) -> str:
    """The paragraph's first sentence (up to and including the first period).

    Args:
        paragraph: Text made by ``make_paragraph``.

    Returns:
        The first sentence, or the whole text when it has no period.
    """
    end = paragraph.find(". ")
    return paragraph if end < 0 else paragraph[: end + 1]


def style_prompt(style: str, paragraph: str) -> str:
    """Wrap a paragraph in a prompt style.

    Args:
        style: ``"copy"`` or ``"plain"`` (see the module docstring).
        paragraph: The synthetic paragraph.

    Returns:
        The prompt text.

    Raises:
        ValueError: An unknown style.
    """
    if style == "copy":
        return COPY_WRAPPER + paragraph
    if style == "plain":
        return PLAIN_WRAPPER + first_sentence(paragraph)
    if style == "chat":
        raise ValueError("the chat style is a session of messages: use PromptBook.chat_opening / follow_up")
    if style in ("extract", "agent"):
        raise ValueError(f"the {style} style makes its own text: use PromptBook.prompt")
    raise ValueError(f"unknown prompt style {style!r}; expected one of {', '.join(PROMPT_STYLES)}")


def follow_up_question(seed: int, key: str) -> str:
    """A short deterministic question about the notes (one of ``_FOLLOW_UPS``, words filled in).

    Args:
        seed: The run's ``--seed``.
        key: Session and turn, e.g. ``"chat/r0/c4/i2/t3"``.

    Returns:
        The question.
    """
    rng = random.Random(f"mlx-bench:{seed}:{key}")
    template = rng.choice(_FOLLOW_UPS)
    return template.format(noun=rng.choice(_NOUNS), thing=rng.choice(_THINGS), adj=rng.choice(_ADJECTIVES))


def continue_chat(history: list[dict], reply: str, question: str) -> list[dict]:
    """The next turn's messages: the history, the assistant's reply, then the new question.

    Args:
        history: The messages the previous turn sent.
        reply: What the target answered to them.
        question: The new user message.

    Returns:
        A new list (``history`` is not changed).
    """
    return [*history, {"role": "assistant", "content": reply}, {"role": "user", "content": question}]


def chat_history_tokens(prompt_tokens: int, max_tokens: int, turn: int) -> int:
    """Estimated prompt length of a chat session's turn ``turn`` when every reply is ``max_tokens`` long.

    Args:
        prompt_tokens: ``--prompt-tokens`` (turn 1's size).
        max_tokens: ``--max-tokens``.
        turn: 1-based turn number.

    Returns:
        ``prompt_tokens + (turn - 1) x (max_tokens + FOLLOW_UP_TOKENS + 2 x MESSAGE_OVERHEAD_TOKENS)``.
    """
    return prompt_tokens + (turn - 1) * (max_tokens + FOLLOW_UP_TOKENS + 2 * MESSAGE_OVERHEAD_TOKENS)


class PromptBook:
    """The prompts of one run: deterministic from the seed, one paragraph per request of a batch.

    Args:
        seed: The run's ``--seed``.
        prompt_tokens: Paragraph length in estimated tokens (``--prompt-tokens``).
    """

    def __init__(self, seed: int, prompt_tokens: int) -> None:
        self.seed = seed
        self.prompt_tokens = prompt_tokens

    def paragraph(self, round_key: str, concurrency: int, index: int) -> str:
        """The paragraph of request ``index`` in one batch, sized so the copy prompt is ~prompt_tokens.

        Args:
            round_key: The round (``"0"``, ``"1"``, ...; ``"warmup"`` for warm-up requests).
            concurrency: The batch's concurrency level.
            index: The request's position in the batch.

        Returns:
            The paragraph (both styles of that request use it).
        """
        paragraph_tokens = max(1, self.prompt_tokens - estimate_tokens(COPY_WRAPPER))
        return make_paragraph(self.seed, f"r{round_key}/c{concurrency}/i{index}", paragraph_tokens)

    def prompt(self, style: str, round_key: str, concurrency: int, index: int) -> str:
        """The prompt of request ``index`` in one batch.

        Args:
            style: Prompt style.
            round_key: The round (``"0"``, ``"1"``, ...; ``"warmup"`` for warm-up requests).
            concurrency: The batch's concurrency level.
            index: The request's position in the batch.

        Returns:
            The prompt text; the same for every target.
        """
        if style == "extract":
            return extract_prompt(self.seed, f"extract/r{round_key}/c{concurrency}/i{index}")
        if style == "agent":
            session, step = divmod(index, AGENT_STEPS)
            return agent_prompt(self.seed, f"agent/r{round_key}/c{concurrency}/s{session}", step)
        return style_prompt(style, self.paragraph(round_key, concurrency, index))

    def _chat_key(self, round_key: str, concurrency: int, index: int) -> str:
        return f"chat/r{round_key}/c{concurrency}/i{index}"

    def follow_up(self, round_key: str, concurrency: int, index: int, turn: int) -> str:
        """The user question of one turn of one chat session (turn 1's closes the opening message).

        Args:
            round_key: The round (``"warmup"`` for warm-up sessions).
            concurrency: The batch's concurrency level.
            index: The session's position in the batch.
            turn: 1-based turn number.

        Returns:
            The question; the same for every target.
        """
        return follow_up_question(self.seed, f"{self._chat_key(round_key, concurrency, index)}/t{turn}")

    def chat_opening(self, round_key: str, concurrency: int, index: int) -> list[dict]:
        """Turn 1 of a chat session: the system message and the notes with the first question.

        Args:
            round_key: The round (``"warmup"`` for warm-up sessions).
            concurrency: The batch's concurrency level.
            index: The session's position in the batch.

        Returns:
            ``[{"role": "system", ...}, {"role": "user", ...}]``, about ``prompt_tokens`` tokens in all.
        """
        question = self.follow_up(round_key, concurrency, index, 1)
        overhead = sum(estimate_tokens(text) for text in (CHAT_SYSTEM, CHAT_WRAPPER, question))
        paragraph = make_paragraph(
            self.seed,
            self._chat_key(round_key, concurrency, index),
            max(1, self.prompt_tokens - overhead - 2 * MESSAGE_OVERHEAD_TOKENS),
        )
        return [
            {"role": "system", "content": CHAT_SYSTEM},
            {"role": "user", "content": f"{CHAT_WRAPPER}{paragraph} {question}"},
        ]
