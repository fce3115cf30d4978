"""llama.cpp's CPU sampler, reproduced on the host for seeded rows (``SamplingParams.rng == "llama.cpp"``).

Contract: ``LlamaCppDraw(seed)`` draws tokens as llama-server's default sampler chain does for that seed
(``common_sampler`` with llama.cpp's default order: penalties, DRY, top-n-sigma, top-k, typical, top-p,
min-p, XTC, temperature, then ``dist``), so a server started with ``--seed`` gives the same sampled text
as llama-server on logits equal to llama.cpp's (a float difference moves a token only when it lands on a
boundary of the cumulative sums). Only top-k, top-p, min-p and the temperature are taken from the row's
``SamplingParams``; the logits given are the row's processed ones (logit bias, penalties and grammar
applied by the chain before), and the samplers llama.cpp runs beside them are off at mlxd's settings.

What is reproduced exactly:
- the generator: ``std::mt19937`` seeded with the seed's low 32 bits (``init_genrand``), one
  ``std::uniform_real_distribution<double>(0, 1)`` draw per token, which libstdc++ builds from two 32-bit
  outputs as (a + b * 2**32) / 2**64 (``generate_canonical<double, 53>``);
- the arithmetic: float32 softmaxes summed in order (top-p's), the min-p bound ``max + logf(p)``, the
  temperature as a float32 division, and ``dist``'s float32 probabilities summed in double against
  ``sum * rnd``: the first candidate whose running sum reaches it is drawn, in descending logit order.

The row's logits are read back once per token (``mx.array.tolist`` through NumPy): a chain with this
draw does not batch its draws, and a step with such a row waits for its forward before the next is built.
"""

from __future__ import annotations

import random

import mlx.core as mx
import numpy as np

MT_N = 624  # std::mt19937's state words


def mt19937_state(seed: int) -> tuple[int, ...]:
    """The state ``std::mt19937(seed)`` starts from (``init_genrand``), as Python's ``random`` takes it."""
    words = [seed & 0xFFFFFFFF]
    for i in range(1, MT_N):
        previous = words[-1]
        words.append((1812433253 * (previous ^ (previous >> 30)) + i) & 0xFFFFFFFF)
    return (*words, MT_N)  # position 624: the first output twists the state, as std::mt19937 does


class LlamaCppDraw:
    """One row's llama.cpp ``dist`` sampler: its generator, advanced once per drawn token."""

    def __init__(self, seed: int):
        self.generator = random.Random()
        self.generator.setstate((3, mt19937_state(seed), None))  # CPython's Mersenne Twister is MT19937

    def uniform(self) -> float:
        """``std::uniform_real_distribution<double>(0, 1)`` on libstdc++: two outputs, low word first."""
        low, high = self.generator.getrandbits(32), self.generator.getrandbits(32)
        value = (float(low) + float(high) * 4294967296.0) / 18446744073709551616.0
        return value if value < 1.0 else float(np.nextafter(1.0, 0.0))

    def draw(self, logits: mx.array, temperature: float, top_k: int, top_p: float, min_p: float) -> mx.array:
        """Draw one token per row of ``logits`` [N, V] (processed). Returns [N] int32."""
        rows = np.array(logits.astype(mx.float32), copy=False).reshape(logits.shape[0], -1)
        return mx.array([self._draw_row(row, temperature, top_k, top_p, min_p) for row in rows], dtype=mx.int32)

    def _draw_row(self, row: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float) -> int:
        # row: [V] float32 logits. Candidates stay in id order unless top-k or top-p sorts them (descending
        # logit), as llama.cpp's: min-p keeps the order it finds, and dist sums in the candidates' order.
        sorts = top_k > 0 or top_p < 1.0
        order = np.argsort(-row, kind="stable") if sorts else np.arange(len(row))
        if top_k > 0:
            order = order[: min(top_k, len(order))]
        values = row[order]
        if top_p < 1.0:  # sorted here: values[0] is the largest
            shifted = np.exp(values - values[0], dtype=np.float32)
            probs = shifted / _float32_sum(shifted)
            running, keep = np.float32(0.0), len(values)
            for i, p in enumerate(probs):
                running = np.float32(running + p)
                if running >= np.float32(top_p):
                    keep = i + 1
                    break
            order, values = order[:keep], values[:keep]
        if min_p > 0.0:
            bound = np.float32(np.max(values) + np.float32(np.log(np.float32(min_p))))
            kept = values >= bound  # sorted or not, the order of what is kept is unchanged
            order, values = order[kept], values[kept]
        values = (values / np.float32(temperature)).astype(np.float32)
        target = self.uniform()
        if len(order) == 1:
            return int(order[0])  # one candidate: llama.cpp still draws once, to keep its generator aligned
        probs = np.exp(values - np.max(values), dtype=np.float32).tolist()  # float32 values, summed in double
        target *= sum(probs)  # in order, as llama.cpp's loop
        reached = 0.0
        for i, p in enumerate(probs):
            reached += p
            if reached >= target:
                return int(order[i])
        return int(order[-1])


def _float32_sum(values: np.ndarray) -> np.float32:
    """A float32 sum in order, as a C loop adds (NumPy's pairwise sum rounds differently)."""
    total = np.float32(0.0)
    for value in values:
        total = np.float32(total + value)
    return total
