"""The measuring loop of mlx-bench: warm-up, interleaved rounds, concurrency, sample collection.

Contract:
    * ``run_benchmark(targets, config, prompts, hooks)`` opens every target, sends ``config.warmup``
      requests of every prompt style to each (one at a time, not measured: the first measured batch of a
      style meets a server as warm for that style as the later ones, caches and shared drafts
      included), then for each round, for each concurrency level,
      for each prompt style, runs one *batch* on each target in turn (targets interleaved A B A B, so
      slow drift of the machine hits every target alike). ``RunRecord.order`` lists the batches in
      the order they ran. Targets are closed at the end, also on failure.
    * A batch keeps ``concurrency`` requests in flight (``concurrency`` workers, each sending its next
      request when the previous one finished) until either ``config.requests_for(concurrency)``
      requests were sent (default 2 x concurrency) or, with ``config.duration_s``, that many seconds
      passed (requests in flight then finish). Request ``i`` of a batch gets ``prompts.prompt(style,
      round, concurrency, i)``: every target sees the same prompts. The batch's wall time runs from the
      first request sent to the last one finished.
    * Chat style (``--prompt-style chat``): a batch's unit of work is a *session* of ``config.turns``
      turns that one worker runs one after the other; ``requests`` / ``duration_s`` count sessions (a
      session that has started runs to its end). Turn 1 sends ``prompts.chat_opening(round, concurrency,
      i)``; turn t > 1 sends the previous turn's messages, the previous reply (``RequestSample.text``, what
      this target streamed) and ``prompts.follow_up(round, concurrency, i, t)`` (``continue_chat``). Each
      turn is one ``RequestSample`` with its ``turn``; a failed turn ends its session (the later turns are
      not sent). Warm-up in the chat style runs whole sessions.
    * Failed requests are samples with ``ok=False`` (targets never raise from ``run_request``), so
      errors are counted and the run goes on.
    * ``BenchRequest`` is what every target receives, ``RequestSample`` what one request measured (the
      targets fill it in); both are defined here so that targets depend on the runner, not the reverse.
    * ``hooks`` (a ``ProgressHooks``) hears about batches and requests, for a live display; the
      default does nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .prompts import continue_chat
from .stats import cached_prompt_tokens, summarize_batch


@dataclass
class BenchRequest:
    """One request as every target receives it."""

    index: int
    prompt: str
    max_tokens: int
    temperature: float = 0.0
    seed: int | None = None
    chat: bool = True
    ignore_eos: bool = False
    timeout_s: float = 600.0
    messages: list[dict] | None = None  # chat style: the whole history; None: one user message, ``prompt``
    turn: int | None = None  # chat style: 1-based turn of the session ``index``


@dataclass
class RequestSample:
    """What one request measured (times in seconds; ``token_times_s`` relative to sending)."""

    target: str
    index: int
    ok: bool = False
    error: str | None = None
    sent_at_s: float = 0.0  # relative to the batch start (set by the runner)
    latency_s: float = 0.0
    ttft_s: float | None = None
    token_times_s: list[float] = field(default_factory=list)
    completion_tokens: int = 0
    tokens_from: str = "chunks"
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    usage: dict | None = None
    timings: dict | None = None
    turn: int | None = None  # chat style: 1-based turn of session ``index``
    text: str = ""  # the reply's content as streamed (the next chat turn sends it back)
    cached_tokens: int | None = None  # prompt tokens the server took from its prompt cache, when it says

    def content_arrived(self, elapsed_s: float) -> None:
        """Record a chunk carrying content ``elapsed_s`` after sending (the first one gives the TTFT)."""
        if self.ttft_s is None:
            self.ttft_s = elapsed_s
        self.token_times_s.append(elapsed_s)

    def count_tokens(self, counted: int) -> None:
        """Set ``completion_tokens`` from ``usage`` when the server sent it, else to ``counted``."""
        usage = self.usage or {}
        if isinstance(usage.get("completion_tokens"), int):
            self.completion_tokens, self.tokens_from = usage["completion_tokens"], "usage"
            self.prompt_tokens = usage.get("prompt_tokens")
        else:
            self.completion_tokens = counted
        self.cached_tokens = cached_prompt_tokens(self.usage, self.timings)


@dataclass
class BenchConfig:
    """What to measure (the CLI's options)."""

    concurrencies: list[int]
    styles: list[str]
    rounds: int = 3
    requests: int | None = None  # per batch; None: 2 x concurrency
    duration_s: float | None = None  # per batch instead of a request count
    max_tokens: int = 128
    prompt_tokens: int = 200
    warmup: int = 1  # per target and prompt style
    seed: int = 0
    temperature: float = 0.0
    chat: bool = True
    ignore_eos: bool = False
    request_timeout_s: float = 600.0
    turns: int = 4  # chat style: turns per session

    def requests_for(self, concurrency: int) -> int | None:
        """Requests per batch at this concurrency.

        Args:
            concurrency: The level.

        Returns:
            The count, or None when batches are timed by ``duration_s``.
        """
        if self.duration_s is not None:
            return None
        return self.requests if self.requests is not None else 2 * concurrency

    def make_request(
        self, index: int, prompt: str, messages: list[dict] | None = None, turn: int | None = None
    ) -> BenchRequest:
        """A request with this configuration's settings.

        Args:
            index: The request's (or chat session's) position in its batch.
            prompt: Its prompt (chat style: the last user message).
            messages: Chat style: the whole history to send.
            turn: Chat style: the turn number.

        Returns:
            The ``BenchRequest``.
        """
        return BenchRequest(
            index=index,
            prompt=prompt,
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            seed=self.seed,
            chat=self.chat,
            ignore_eos=self.ignore_eos,
            timeout_s=self.request_timeout_s,
            messages=messages,
            turn=turn,
        )

    def turns_for(self, style: str) -> int:
        """Requests per unit of work: ``turns`` for the chat style (a session), else 1.

        Args:
            style: Prompt style.

        Returns:
            The count.
        """
        return self.turns if style == "chat" else 1


@dataclass
class BatchRecord:
    """One batch: one target at one concurrency level and prompt style in one round."""

    round: int
    concurrency: int
    style: str
    target: str
    started_at_s: float  # since the measured rounds began
    wall_s: float
    summary: dict[str, Any]
    samples: list[RequestSample]


@dataclass
class RunRecord:
    """Everything a run measured."""

    targets: list[dict[str, Any]]
    order: list[tuple[int, int, str, str]] = field(default_factory=list)  # (round, concurrency, style, target)
    batches: list[BatchRecord] = field(default_factory=list)
    warmup_samples: list[RequestSample] = field(default_factory=list)


class ProgressHooks:
    """Receives progress events; subclass it for a display. Every method does nothing here."""

    def batch_started(self, label: str, requests: int | None) -> None:
        """A batch (or a target's warm-up) begins.

        Args:
            label: e.g. ``"round 1/3 c=4 copy: on"``.
            requests: Requests it will send; None when timed by duration.
        """

    def request_finished(self, sample: RequestSample) -> None:
        """A request ended (successfully or not).

        Args:
            sample: Its sample.
        """

    def batch_finished(self, batch: BatchRecord | None) -> None:
        """A batch ended.

        Args:
            batch: Its record (None after a warm-up).
        """


async def run_batch(
    target: Any,
    config: BenchConfig,
    prompts: Any,
    round_key: str,
    concurrency: int,
    style: str,
    hooks: ProgressHooks | None = None,
) -> tuple[list[RequestSample], float]:
    """Run one batch on one target.

    Args:
        target: An opened target (``run_request`` coroutine).
        config: The run's configuration.
        prompts: A ``PromptBook`` (anything with ``prompt(style, round_key, concurrency, index)``).
        round_key: The round's key for prompts (``"0"``, ``"1"``, ... or ``"warmup"``).
        concurrency: Requests in flight at once.
        style: Prompt style.
        hooks: Progress hooks.

    Returns:
        The samples in order of request index, and the batch's wall time in seconds.
    """
    hooks = hooks or ProgressHooks()
    limit = config.requests_for(concurrency)
    indices = itertools.count()
    samples: list[RequestSample] = []
    started = time.perf_counter()

    def next_index() -> int | None:
        if config.duration_s is not None and time.perf_counter() - started >= config.duration_s:
            return None
        index = next(indices)
        return index if limit is None or index < limit else None

    async def worker() -> None:
        while (index := next_index()) is not None:
            if style == "chat":
                samples.extend(
                    await run_session(target, config, prompts, round_key, concurrency, index, started, hooks)
                )
                continue
            request = config.make_request(index, prompts.prompt(style, round_key, concurrency, index))
            sent_at = time.perf_counter() - started
            sample = await target.run_request(request)
            sample.sent_at_s = sent_at
            samples.append(sample)
            hooks.request_finished(sample)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall_s = time.perf_counter() - started
    samples.sort(key=lambda sample: (sample.index, sample.turn or 0))
    return samples, wall_s


async def run_session(
    target: Any,
    config: BenchConfig,
    prompts: Any,
    round_key: str,
    concurrency: int,
    index: int,
    started: float | None = None,
    hooks: ProgressHooks | None = None,
) -> list[RequestSample]:
    """Run one chat session: ``config.turns`` turns one after the other, each resending the history.

    Args:
        target: An opened target.
        config: The run's configuration (``turns``).
        prompts: A ``PromptBook`` (``chat_opening`` and ``follow_up``).
        round_key: The round's key for prompts.
        concurrency: The batch's concurrency level (part of the prompts' key).
        index: The session's position in the batch.
        started: ``time.perf_counter()`` at the batch start (for ``sent_at_s``); None: the session start.
        hooks: Progress hooks (one ``request_finished`` per turn).

    Returns:
        One sample per turn sent, in turn order; it stops after the first failed turn.
    """
    hooks = hooks or ProgressHooks()
    started = time.perf_counter() if started is None else started
    messages = prompts.chat_opening(round_key, concurrency, index)
    samples: list[RequestSample] = []
    for turn in range(1, config.turns + 1):
        if samples:
            question = prompts.follow_up(round_key, concurrency, index, turn)
            messages = continue_chat(messages, samples[-1].text, question)
        request = config.make_request(index, messages[-1]["content"], messages=messages, turn=turn)
        sent_at = time.perf_counter() - started
        sample = await target.run_request(request)
        sample.sent_at_s = sent_at
        samples.append(sample)
        hooks.request_finished(sample)
        if not sample.ok:
            break
    return samples


async def run_benchmark(
    targets: Sequence[Any], config: BenchConfig, prompts: Any, hooks: ProgressHooks | None = None
) -> RunRecord:
    """Warm up, then run every round with targets interleaved; see the module docstring.

    Args:
        targets: Unopened targets (``HttpTarget``, ``DaemonTarget``, started ``ServedTarget``), in order.
        config: The run's configuration.
        prompts: A ``PromptBook``.
        hooks: Progress hooks.

    Returns:
        The ``RunRecord``.

    Raises:
        TargetUnavailable: A target could not be opened.
    """
    hooks = hooks or ProgressHooks()
    opened = []
    try:
        for target in targets:
            await target.open()
            opened.append(target)
        record = RunRecord(targets=[target.describe() for target in targets])
        for target in targets:
            await _warm_up(target, config, prompts, hooks, record)
        run_started = time.perf_counter()
        for round_index in range(config.rounds):
            for concurrency in config.concurrencies:
                for style in config.styles:
                    for target in targets:
                        label = f"round {round_index + 1}/{config.rounds} c={concurrency} {style}: {target.name}"
                        limit = config.requests_for(concurrency)
                        hooks.batch_started(label, None if limit is None else limit * config.turns_for(style))
                        record.order.append((round_index, concurrency, style, target.name))
                        batch_started = time.perf_counter() - run_started
                        samples, wall_s = await run_batch(
                            target, config, prompts, str(round_index), concurrency, style, hooks
                        )
                        batch = BatchRecord(
                            round=round_index,
                            concurrency=concurrency,
                            style=style,
                            target=target.name,
                            started_at_s=batch_started,
                            wall_s=wall_s,
                            summary=summarize_batch(samples, wall_s),
                            samples=samples,
                        )
                        record.batches.append(batch)
                        hooks.batch_finished(batch)
        return record
    finally:
        for target in opened:
            await target.aclose()


async def _warm_up(target: Any, config: BenchConfig, prompts: Any, hooks: ProgressHooks, record: RunRecord) -> None:
    if config.warmup <= 0:
        return
    for style in config.styles:
        hooks.batch_started(f"warm-up {style}: {target.name}", config.warmup * config.turns_for(style))
        for index in range(config.warmup):
            if style == "chat":
                record.warmup_samples.extend(
                    await run_session(target, config, prompts, "warmup", 1, index, hooks=hooks)
                )
                continue
            prompt = prompts.prompt(style, "warmup", 1, index)
            sample = await target.run_request(config.make_request(index, prompt))
            record.warmup_samples.append(sample)
            hooks.request_finished(sample)
        hooks.batch_finished(None)
