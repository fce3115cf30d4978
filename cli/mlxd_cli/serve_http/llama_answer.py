"""llama-server's answer to a completion: its fields, ``generation_settings``, ``completion_probabilities``, the
prefill's timings, ``response_fields``, and the native answer the OpenAI routes add as ``__verbose``.

Contract: functions of a finished generation (its ``Done``, tokens and the request body); they ask the
daemon only to turn tokens into text (the prompt as text, a stopping word, each alternative's piece). The
fields are described in ``llama_completion``.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import Request

from mlxd_protocol import Done, Progress

from .context import GatewayContext, gateway
from .daemon_pool import DaemonHandle, DaemonPool, GenerationStream, call_daemon
from .schemas import normalize_stop
from .schemas.llama import LlamaCompletionBody

# llama.cpp's defaults for the samplers mlxd does not implement: reported, they say "off"
NEUTRAL_SAMPLERS = {
    "mirostat": 0,
    "typical_p": 1.0,
    "xtc_probability": 0.0,
    "dry_multiplier": 0.0,
    "dynatemp_range": 0.0,
    "top_n_sigma": -1.0,
    "adaptive_target": -1.0,
    "adaptive_decay": 0.9,
}


async def stop_reason(pool: DaemonPool, done: Done, tokens: list[int], stop: list[str]) -> tuple[str, str]:
    """llama-server's (stop_type, stopping_word) for a finished generation.

    The daemon says "stop" for both an end-of-sequence token and a stop string; which one it was is
    read off the raw output: the output text is cut before the first stop string, so if the
    detokenized tokens contain a stop string, the earliest one is what matched.
    """
    if done.finish_reason == "length":
        return "limit", ""
    if done.finish_reason == "cancelled":
        return "none", ""
    if not stop or not tokens:
        return "eos", ""
    raw = await call_daemon(pool, lambda client: client.detokenize(tokens))
    found = [(raw.find(word), word) for word in stop if word in raw]
    return ("word", min(found)[1]) if found else ("eos", "")


def generation_settings(body: LlamaCompletionBody, handle: DaemonHandle, n_predict: int) -> dict:
    """llama-server's ``generation_settings``: what this request ran with (its fields over the daemon's defaults)."""
    return settings_of(
        handle,
        body.sampling_overrides(),
        n_predict=n_predict,
        stop=normalize_stop(body.stop),
        ignore_eos=body.ignore_eos,
        stream=body.stream,
        cache_prompt=body.cache_prompt,
        n_probs=body.n_probs,
        token_bias=body.token_bias(),
        n_keep=body.n_keep,
        n_discard=body.n_discard,
    )


def settings_of(
    handle: DaemonHandle,
    overrides: dict,
    *,
    n_predict: int,
    stop: list[str],
    ignore_eos: bool,
    stream: bool,
    cache_prompt: bool,
    n_probs: int,
    token_bias: dict[int, float],
    n_keep: int = 0,
    n_discard: int = 0,
) -> dict:
    """``generation_settings`` of any generation: the request's sampling ``overrides`` (protocol names)
    over the daemon's defaults, and the other settings it ran with."""
    sampling = {**handle.sampling_defaults, **overrides}
    eos = handle.status.options.get("eos_token_ids", []) if handle.status else []
    biases = [*token_bias.items(), *((token, -math.inf) for token in eos if ignore_eos)]
    # null: -inf, as llama-server writes it
    bias = [{"token": token, "bias": value if math.isfinite(value) else None} for token, value in biases]
    return {
        "n_predict": n_predict,
        "seed": sampling.get("seed") if sampling.get("seed") is not None else -1,
        "temperature": sampling.get("temperature", 0.0),
        "top_k": sampling.get("top_k", 0),
        "top_p": sampling.get("top_p", 1.0),
        "min_p": sampling.get("min_p", 0.0),
        "repeat_penalty": sampling.get("repetition_penalty") or 1.0,  # mlxd's off is 0, llama-server's 1
        "presence_penalty": sampling.get("presence_penalty", 0.0),
        "frequency_penalty": sampling.get("frequency_penalty", 0.0),
        "stop": stop,
        "ignore_eos": ignore_eos,
        "stream": stream,
        "cache_prompt": cache_prompt,
        "n_probs": n_probs,
        "logit_bias": bias,
        "n_keep": n_keep,
        "n_discard": n_discard,
        **NEUTRAL_SAMPLERS,
    }


async def probabilities(context: GatewayContext, entries: list[dict], post_sampling: bool = False) -> list[dict]:
    """llama-server's ``completion_probabilities`` from the daemon's logprob entries: ``logprob`` and
    ``top_logprobs``, or with ``post_sampling`` ``prob`` and ``top_probs`` (the tokens the sampler filtered
    out, of probability 0, are left out, as llama-server leaves them)."""
    texts = await context.token_texts(entries)
    value_name, list_name = ("prob", "top_probs") if post_sampling else ("logprob", "top_logprobs")

    def item(token: int, logprob: float) -> dict:
        text = texts[token]
        value = math.exp(logprob) if post_sampling else logprob
        return {"id": token, "token": text, value_name: value, "bytes": list(text.encode())}

    return [
        {
            **item(entry["token"], entry["logprob"]),
            list_name: [
                item(token, logprob)
                for token, logprob in entry.get("top") or ()
                if not (post_sampling and logprob == -math.inf)
            ],
        }
        for entry in entries
    ]


def per_token_events(text: str, tokens: list[int], probs: list[dict]) -> list[tuple[str, list[int], list[dict]]]:
    """A chunk of several tokens as llama-server streams it with ``n_probs``: one event per token.

    The daemon may send several tokens in one chunk; each event then carries one token, its text
    and its probabilities. The pieces are the tokens' own texts, so this is done only when they make
    up the chunk's text exactly (the first token of a reply may have lost its leading space); else the
    chunk stays one event with every token's probabilities.

    Returns:
        (content, tokens, completion_probabilities) per event.
    """
    pieces = [entry["token"] for entry in probs]
    if len(tokens) > 1 and len(probs) == len(tokens):
        joined = "".join(pieces)
        if joined != text and pieces[0].startswith(" ") and joined[1:] == text:
            pieces[0] = pieces[0][1:]  # the reply's first token: the daemon's text drops its leading space
            joined = joined[1:]
        if joined == text:
            return [(piece, [token], [entry]) for piece, token, entry in zip(pieces, tokens, probs, strict=True)]
    return [(text, tokens, probs)]


def prefill_timings(progress: Progress) -> dict:
    """llama-server's timings of a prompt-progress event: the prompt tokens prefilled so far (the cached
    ones apart) in the time the prefill has taken; nothing predicted yet."""
    prompt_n, prompt_ms = progress.processed - progress.cache, progress.time_ms
    return {
        "cache_n": progress.cache,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": 1e3 / prompt_ms * prompt_n if prompt_ms > 0 else 0.0,
        "predicted_n": 0,
        "predicted_ms": 0.0,
        "predicted_per_token_ms": 0.0,
        "predicted_per_second": 0.0,
    }


def pick_fields(answer: dict, names: list[str]) -> dict:
    """llama-server's ``response_fields``: only the named fields; "a/b" is b inside a, kept as key "a/b"."""
    picked = {}
    for name in names:
        value: Any = answer
        for part in name.split("/"):
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None:
            picked[name] = value
    return picked


async def final_answer(
    request: Request,
    body: LlamaCompletionBody,
    stream: GenerationStream,
    done: Done,
    content: str,
    tokens: list[int],
    prompt_text: str,
    n_predict: int,
    index: int,
) -> dict:
    """The whole /completion answer for one prompt (the last streamed event too, with empty content)."""
    return await native_answer(
        gateway(request),
        stream.handle,
        done,
        content,
        tokens if body.return_tokens and not body.stream else [],
        prompt_text=prompt_text,
        settings=generation_settings(body, stream.handle, n_predict),
        stop=normalize_stop(body.stop),
        output_tokens=tokens,
        index=index,
    )


async def native_answer(
    context: GatewayContext,
    handle: DaemonHandle,
    done: Done,
    content: str,
    reported_tokens: list[int],
    *,
    prompt_text: str,
    settings: dict,
    stop: list[str],
    output_tokens: list[int],
    index: int = 0,
) -> dict:
    """llama-server's native answer of one generation (/completion's reply; ``__verbose`` of the OpenAI ones).

    Args:
        reported_tokens: The ``tokens`` field (the output's ids, or [] when not asked for).
        settings: Its ``generation_settings`` (``settings_of``).
        stop: The stop strings it ran with (to tell an end-of-sequence from a stop string).
        output_tokens: The output's ids (to tell which stop string matched).
    """
    stop_type, word = await stop_reason(context.pool, done, output_tokens, stop)
    prompt_n, predicted_n = int(done.usage.get("prompt_tokens", 0)), int(done.usage.get("completion_tokens", 0))
    bound = handle.context_bound
    # a context shift dropped tokens, or (a daemon that does not shift) the context bound ended the generation
    at_bound = stop_type == "limit" and bound is not None and prompt_n + predicted_n >= bound
    truncated = done.truncated or (at_bound and not handle.shifts_context)
    return {
        "index": index,
        "content": content,
        "tokens": reported_tokens,
        "id_slot": -1,
        "stop": True,
        "model": context.model_name(handle),
        "tokens_predicted": predicted_n,
        "tokens_evaluated": prompt_n,
        "tokens_cached": int(done.usage.get("cached_tokens", 0)),
        "generation_settings": settings,
        "prompt": prompt_text,
        "has_new_line": "\n" in content,
        "truncated": truncated,
        "stop_type": stop_type,
        "stopping_word": word,
        "timings": done.timings,
    }


async def prompt_as_text(pool: DaemonPool, fields: dict) -> str:
    """The prompt's tokens as text (llama-server's ``prompt``: "<s> Once upon a time")."""
    tokens = fields.get("prompt_tokens")
    if tokens is None:
        tokens = await call_daemon(pool, lambda client: client.tokenize(text=fields["prompt"]))
    return await call_daemon(pool, lambda client: client.detokenize(tokens))
