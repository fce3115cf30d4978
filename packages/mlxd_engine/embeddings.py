"""Embeddings: the model's last hidden state (after its final norm, before the output head), pooled per input.

Contract:
- ``hidden_state_source(loaded)`` finds the module of an mlx-lm model that gives the final hidden state:
  the ``model`` / ``transformer`` / ``backbone`` whose output the model's own ``__call__`` hands to its head
  (through a multimodal wrapper's ``language_model``), called as ``module(inputs [B, T], cache=...)``. A
  probe forward checks what it returns: ``[1, T, H]`` with H the model's hidden size, not its vocabulary
  (some models' inner module already applies the head). Where the state cannot be had (no such module, a
  distributed group holding a part of the model) ``EmbeddingUnavailable`` says why.
- ``EmbeddingRun(source, inputs, pooling, normalize, tokens_per_forward)`` computes one request's
  embeddings one bounded forward at a time (``advance()``; ``done``; ``results()``). Inputs sorted by
  length are packed into batches of at most ``tokens_per_forward`` padded tokens; an input longer than that
  is a batch of its own, forwarded in pieces of that size through mlx-lm's own prompt cache (never the
  engine's KV storage). Rows are padded on the right: the model is causal, so a real token never attends
  to the padding after it and every real position's state is the unpadded one.
- Pooling: "mean" (over the input's tokens), "last" (the last token's state), "cls" (the first token's),
  "none" (every token's vector, ``[T, H]``; "cls" forwards the first token only). ``normalize`` scales each
  pooled vector to unit L2 norm (per-token vectors stay as they are, as llama-server returns them). Vectors
  are float32.
"""

from __future__ import annotations

import inspect
from collections import deque
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

from .loading.loader import LoadedModel
from .loading.model_config import config_value

POOLINGS = ("mean", "last", "cls", "none")
HIDDEN_STATE_MODULES = ("model", "transformer", "backbone")  # the names mlx-lm's models give their body
HIDDEN_SIZE_NAMES = ("hidden_size", "d_model", "n_embd", "dim")
PAD_TOKEN = 0  # any id in the vocabulary: padded positions are never read
NORM_FLOOR = 1e-12  # a zero vector stays zero when normalized


class EmbeddingUnavailable(ValueError):
    """This model gives no final hidden state mlxd can read; the message says why."""


@dataclass(frozen=True)
class HiddenStateSource:
    model: Any  # the whole model: its caches come from mlx-lm's make_prompt_cache
    body: Any  # body(inputs [B, T], cache=...) -> hidden [B, T, H]
    hidden_size: int


def hidden_state_source(loaded: LoadedModel) -> HiddenStateSource:
    """The module giving ``loaded``'s final hidden state, checked by a probe forward.

    Raises:
        EmbeddingUnavailable: the model has no such module, or it returns something else.
    """
    what = f"model type {loaded.model_type!r}"
    if loaded.group is not None:
        raise EmbeddingUnavailable("embeddings are not served by a model split over a distributed group")
    model = loaded.model
    wrapped = getattr(model, "language_model", None)
    owner = wrapped if isinstance(wrapped, nn.Module) else model
    body = next(
        (getattr(owner, name) for name in HIDDEN_STATE_MODULES if isinstance(getattr(owner, name, None), nn.Module)),
        None,
    )
    if body is None:
        raise EmbeddingUnavailable(
            f"{what}: no module gives its final hidden state apart from the output head "
            f"(looked for {', '.join(HIDDEN_STATE_MODULES)})"
        )
    if "cache" not in inspect.signature(body.__call__).parameters:
        raise EmbeddingUnavailable(f"{what}: its {type(body).__name__} takes no cache")
    expected = next(
        (
            int(value)
            for value in (config_value(None, getattr(owner, "args", None), name) for name in HIDDEN_SIZE_NAMES)
            if isinstance(value, int)
        ),
        None,
    )
    probe = mx.array([[PAD_TOKEN, min(1, loaded.vocab_size - 1)]])  # [1, 2]
    hidden = body(probe, cache=make_prompt_cache(model))
    if not isinstance(hidden, mx.array) or hidden.ndim != 3 or tuple(hidden.shape[:2]) != (1, 2):
        raise EmbeddingUnavailable(f"{what}: its {type(body).__name__} does not return one state per token")
    width = int(hidden.shape[-1])
    if (expected is not None and width != expected) or (expected is None and width == loaded.vocab_size):
        raise EmbeddingUnavailable(
            f"{what}: its {type(body).__name__} returns {width} values per token, "
            f"not the hidden state (the output head is applied inside it)"
        )
    return HiddenStateSource(model=model, body=body, hidden_size=width)


def pack_by_length(lengths: list[int], tokens_per_forward: int) -> list[list[int]]:
    """Input indices in batches of at most ``tokens_per_forward`` padded tokens, shortest inputs first.

    Example: lengths [3, 100, 4, 2] with 16 tokens per forward -> [[3, 0, 2], [1]] (3 rows x 4 tokens,
    then the long input alone).
    """
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for index in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if current and (len(current) + 1) * max(longest, lengths[index]) > tokens_per_forward:
            batches.append(current)
            current, longest = [], 0
        current.append(index)
        longest = max(longest, lengths[index])
    if current:
        batches.append(current)
    return batches


class _BatchRun:
    """One batch of inputs, padded to its longest, forwarded in pieces through one prompt cache."""

    def __init__(self, source: HiddenStateSource, inputs: list[list[int]], pooling: str, tokens_per_forward: int):
        self.source = source
        self.pooling = pooling
        self.lengths = [len(tokens) for tokens in inputs]
        self.longest = max(self.lengths)
        # the first token's state depends on nothing after it: "cls" forwards that token only
        self.needed = 1 if pooling == "cls" else self.longest
        self.tokens = mx.array([tokens + [PAD_TOKEN] * (self.longest - len(tokens)) for tokens in inputs])  # [B, L]
        self.piece = max(1, tokens_per_forward // len(inputs))
        self.cache = make_prompt_cache(source.model)
        self.start = 0
        self.pooled = mx.zeros((len(inputs), source.hidden_size), dtype=mx.float32)  # [B, H]
        self.states: list[mx.array] = []  # pooling "none": each piece's [B, c, H]

    @property
    def finished(self) -> bool:
        return self.start >= self.needed

    def step(self) -> None:
        end = min(self.start + self.piece, self.needed)
        hidden = self.source.body(self.tokens[:, self.start : end], cache=self.cache).astype(mx.float32)  # [B, c, H]
        positions = mx.arange(self.start, end)  # [c]
        lengths = mx.array(self.lengths)  # [B]
        if self.pooling == "mean":
            real = (positions[None, :] < lengths[:, None])[..., None]  # [B, c, 1]
            self.pooled = self.pooled + (hidden * real).sum(axis=1)
        elif self.pooling == "last":
            last = (positions[None, :] == (lengths - 1)[:, None])[..., None]  # [B, c, 1]
            self.pooled = self.pooled + (hidden * last).sum(axis=1)
        elif self.pooling == "cls" and self.start == 0:
            self.pooled = hidden[:, 0, :]
        elif self.pooling == "none":
            self.states.append(hidden)
        mx.eval(self.pooled, *self.states[-1:])  # bounds the graph; the cache's appends are computed with it
        self.start = end

    def vectors(self) -> list[mx.array]:
        """Each input's pooled vector [H] (or, for "none", its token vectors [T, H]), in the batch's order."""
        if self.pooling == "none":
            states = mx.concatenate(self.states, axis=1)  # [B, L, H]
            return [states[row, :length] for row, length in enumerate(self.lengths)]
        if self.pooling == "mean":
            pooled = self.pooled / mx.array(self.lengths, dtype=mx.float32)[:, None]
        else:
            pooled = self.pooled
        return [pooled[row] for row in range(len(self.lengths))]


def normalized(vectors: mx.array) -> mx.array:
    """``vectors`` [..., H] scaled to unit L2 norm along the last axis."""
    norms = mx.sqrt((vectors * vectors).sum(axis=-1, keepdims=True))
    return vectors / mx.maximum(norms, NORM_FLOOR)


class EmbeddingRun:
    """One request's embeddings, computed one bounded forward per ``advance()``; see the module docstring.

    Args:
        source: The model's hidden-state module (``hidden_state_source``).
        inputs: Token ids of every input (each non-empty, within the model's context).
        pooling: One of ``POOLINGS``.
        normalize: Scale each pooled vector to unit L2 norm.
        tokens_per_forward: Most padded tokens one forward takes (the daemon's prefill chunk).
    """

    def __init__(
        self, source: HiddenStateSource, inputs: list[list[int]], pooling: str, normalize: bool, tokens_per_forward: int
    ):
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        self.source = source
        self.inputs = inputs
        self.pooling = pooling
        self.normalize = normalize
        self.tokens_per_forward = max(1, tokens_per_forward)
        self._batches = deque(pack_by_length([len(tokens) for tokens in inputs], self.tokens_per_forward))
        self._current: tuple[list[int], _BatchRun] | None = None
        self._results: list[mx.array | None] = [None] * len(inputs)

    @property
    def done(self) -> bool:
        return self._current is None and not self._batches

    def advance(self) -> None:
        """Run the next forward (a piece of the current batch, or the first of the next one)."""
        if self._current is None:
            indices = self._batches.popleft()
            self._current = (
                indices,
                _BatchRun(self.source, [self.inputs[i] for i in indices], self.pooling, self.tokens_per_forward),
            )
        indices, batch = self._current
        batch.step()
        if batch.finished:
            for index, vector in zip(indices, batch.vectors()):
                self._results[index] = normalized(vector) if self.normalize and self.pooling != "none" else vector
            self._current = None

    def results(self) -> list[mx.array]:
        """Every input's vector ([H], or [T, H] for "none"), in the inputs' order; only once ``done``."""
        if not self.done:
            raise RuntimeError("the embeddings are not computed yet")
        return list(self._results)  # type: ignore[arg-type]  # every input has its vector once done
