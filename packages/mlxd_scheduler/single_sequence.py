"""One sequence from prompt to finish: plain decode, or decode with the prompt-lookup verify round.

Contract: both loops start from the same prefill and stop on the same conditions (EOS, max_tokens,
KV bound: ``finish_rule``), so their greedy outputs are comparable token for token. The prompt-lookup loop
asks the drafter for a proposal each round; with a proposal it runs the engine's shared verify round,
without one it takes a plain step. Each loop is its own update step: it records what every forward gave
(``Sequence.record``). These loops are the reference for the batched scheduler and the engine demo.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from mlxd_drafters import PromptLookupConfig, PromptLookupDrafter
from mlxd_engine import Engine, SamplingParams, finish_reason, prefill_and_record, step_and_record, verify_round


@dataclass
class GenerationResult:
    tokens: list[int]  # output tokens (EOS excluded)
    finish_reason: str  # "stop" or "length"
    decode_seconds: float  # from the first output token to the last
    steps: int = 0  # plain decode forwards
    verify_rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    stats: dict = field(default_factory=dict)


def _start(engine: Engine, prompt: list[int], params: SamplingParams | None):
    seq = engine.add_sequence(prompt, params)
    first = prefill_and_record(engine, seq)
    assert first is not None  # the whole prompt in one call
    return seq, first.token


def _finished(engine: Engine, seq, token: int, emitted: int, max_tokens: int) -> str | None:
    return finish_reason(engine.loaded.eos_token_ids, seq, token, emitted, max_tokens)


def _output(engine: Engine, seq) -> list[int]:
    out = list(seq.output)
    if out and out[-1] in engine.loaded.eos_token_ids:
        out.pop()
    return out


def generate_plain(
    engine: Engine, prompt: list[int], max_tokens: int, params: SamplingParams | None = None
) -> GenerationResult:
    """Decode one token per forward until a finish condition."""
    seq, token = _start(engine, prompt, params)
    started, steps = time.perf_counter(), 0
    try:
        reason = _finished(engine, seq, token, 1, max_tokens)
        while reason is None:
            token = step_and_record(engine, [seq])[0].token
            steps += 1
            reason = _finished(engine, seq, token, len(seq.output), max_tokens)
        return GenerationResult(_output(engine, seq), reason, time.perf_counter() - started, steps=steps)
    finally:
        engine.release(seq)


def generate_with_prompt_lookup(
    engine: Engine,
    prompt: list[int],
    max_tokens: int,
    params: SamplingParams | None = None,
    config: PromptLookupConfig | None = None,
) -> GenerationResult:
    """Decode with prompt-lookup proposals checked by the shared verify round."""
    drafter = PromptLookupDrafter(config or PromptLookupConfig())
    seq, token = _start(engine, prompt, params)
    drafter.prime(seq.tokens)
    started = time.perf_counter()
    result = GenerationResult([], "", 0.0)
    try:
        reason = _finished(engine, seq, token, 1, max_tokens)
        while reason is None:
            remaining = max_tokens - len(seq.output)
            proposal = drafter.draft_block()
            if not proposal:
                token = step_and_record(engine, [seq])[0].token
                result.steps += 1
                drafter.observe([token])
                reason = _finished(engine, seq, token, len(seq.output), max_tokens)
                continue
            outcome = verify_round(engine, seq, proposal, remaining)
            seq.record(outcome.emitted)
            drafter.accept_verified_tokens(outcome.drafted, outcome.accepted)
            drafter.observe(outcome.emitted)
            result.verify_rounds += 1
            result.drafted += outcome.drafted
            result.accepted += outcome.accepted
            reason = outcome.finish_reason
        result.tokens = _output(engine, seq)
        result.finish_reason = reason
        result.decode_seconds = time.perf_counter() - started
        result.stats = drafter.stats.as_dict()
        return result
    finally:
        engine.release(seq)
