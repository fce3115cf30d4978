"""The value rules of sampler settings: the one place they are written down.

Contract: ``sampling_problem(settings, vocab_size=None)`` returns the first rule ``settings`` breaks, as a
message naming the field (``"sampling.top_p: must be in (0, 1]"``), or None. ``settings`` is anything
with the sampler fields as attributes: the wire's ``messages.Sampling`` (checked when a frame is decoded,
where the vocabulary is not known) and the engine's ``SamplingParams`` (checked again with the model's
``vocab_size``, which adds the rules that need it: ``top_k`` and ``logit_bias`` token ids inside the
vocabulary). ``token_outside_vocabulary(tokens, vocab_size)`` is the rule for token ids a request sends
(prompt tokens, embedding inputs, tokens to detokenize): the first one outside ``[0, vocab_size)``, or None.
Standard library only, so the protocol stays free of mlx and the engine can import it.

The defaults every sampler type uses mean greedy decoding with every filter off: temperature 0, top_k 0,
top_p 1, min_p 0, penalties 0; ``GREEDY`` lists them. A temperature below ``GREEDY_TEMPERATURE_FLOOR``
is greedy too: dividing the logits by it would overflow float32 (1 / 1e-40 is inf) and turn the draw into
noise, and at that scale the draw is an argmax anyway.
"""

import math
from collections.abc import Sequence
from typing import Any

MAX_LOGPROBS = 20

# The greedy defaults, shared by messages.Sampling and the engine's SamplingParams (a test holds both to it).
GREEDY: dict[str, Any] = {  # temperature and the rest are floats, top_k an int
    "temperature": 0.0,
    "top_k": 0,
    "top_p": 1.0,
    "min_p": 0.0,
    "repetition_penalty": 0.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}

GREEDY_TEMPERATURE_FLOOR = 1e-5  # vLLM's sampling epsilon
RNG_KINDS = frozenset({"mlx", "llama.cpp"})  # a seeded draw's generator (``Sampling.rng``)


def is_greedy_temperature(temperature: float) -> bool:
    """True for a temperature that means argmax: 0, or anything below ``GREEDY_TEMPERATURE_FLOOR``."""
    return temperature < GREEDY_TEMPERATURE_FLOOR


_FINITE = ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")


def token_outside_vocabulary(tokens: Sequence[int], vocab_size: int) -> int | None:
    """The first of ``tokens`` outside ``[0, vocab_size)``, or None (also for no tokens). A model's embedding
    gather reads out of bounds on such an id, so every place that takes token ids from a request asks this."""
    if not tokens or (0 <= min(tokens) and max(tokens) < vocab_size):
        return None
    return next(token for token in tokens if not 0 <= token < vocab_size)


def sampling_problem(settings: Any, vocab_size: int | None = None) -> str | None:
    """The first rule the settings break, or None.

    Args:
        settings: An object with the sampler fields (``Sampling`` or ``SamplingParams``); its
            ``logit_bias`` is a dict or a sequence of (token, bias) pairs.
        vocab_size: The model's vocabulary size, when known (adds the token-id rules).

    Returns:
        A message naming the field and the rule, or None when every rule holds.
    """
    for name in _FINITE:
        if not math.isfinite(getattr(settings, name)):
            return f"sampling.{name}: must be finite"
    bias = dict(settings.logit_bias)
    rules = (
        (settings.temperature >= 0, "temperature: must be >= 0"),
        (
            settings.top_k >= 0 and (not vocab_size or settings.top_k < vocab_size or settings.top_k == 0),
            f"top_k: must be in [0, {vocab_size}) (0 = off)" if vocab_size else "top_k: must be >= 0 (0 = off)",
        ),
        (0 < settings.top_p <= 1, "top_p: must be in (0, 1]"),
        (0 <= settings.min_p <= 1, "min_p: must be in [0, 1]"),
        (settings.repetition_penalty >= 0, "repetition_penalty: must be >= 0 (0 = off)"),
        (
            all(token >= 0 and (not vocab_size or token < vocab_size) for token in bias),
            f"logit_bias: token ids must be in [0, {vocab_size})" if vocab_size else "logit_bias: keys must be >= 0",
        ),
        (not any(math.isnan(value) for value in bias.values()), "logit_bias: values must not be NaN"),
        (settings.seed is None or settings.seed >= 0, "seed: must be >= 0"),
        (
            settings.logprobs is None or 0 <= settings.logprobs <= MAX_LOGPROBS,
            f"logprobs: must be in [0, {MAX_LOGPROBS}]",
        ),
        (
            not getattr(settings, "post_sampling", False) or settings.logprobs is not None,
            "post_sampling: describes logprobs, so it needs logprobs",
        ),
        (getattr(settings, "rng", "mlx") in RNG_KINDS, f"rng: must be one of {sorted(RNG_KINDS)}"),
    )
    for holds, message in rules:
        if not holds:
            return f"sampling.{message}"
    return None
