"""llama.cpp's sampler reproduced for seeded rows (``sampling/llama_cpp_draw.py``, ``SamplingParams.rng``)."""

from __future__ import annotations

import re

import mlx.core as mx
import numpy as np

from mlxd_engine import Engine, SamplingParams
from mlxd_engine.sampling.llama_cpp_draw import LlamaCppDraw
from mlxd_scheduler import BatchScheduler, Request, SchedulerOptions, TextStream

from ..scheduler.test_batch_scheduler import Collector


def test_the_generator_is_std_mt19937():
    # the C++ standard's check of std::mt19937: default seed 5489, the 10000th output is 4123659995
    generator = LlamaCppDraw(5489).generator
    outputs = [generator.getrandbits(32) for _ in range(10000)]
    assert outputs[-1] == 4123659995


def test_a_uniform_draw_is_libstdcpp_generate_canonical_of_two_outputs():
    draw, raw = LlamaCppDraw(42), LlamaCppDraw(42).generator
    for _ in range(5):
        low, high = raw.getrandbits(32), raw.getrandbits(32)
        assert draw.uniform() == (low + high * 2.0**32) / 2.0**64


def test_the_draw_walks_the_filtered_candidates_in_logit_order():
    logits = mx.array([[0.0, 3.0, 1.0, 2.0, -9.0]])
    # top-k 3 keeps ids 1, 3, 2 (min-p 0.05 keeps all three): the draw lands by their cumulative sum
    expected_order = [1, 3, 2]
    values = np.array([3.0, 2.0, 1.0], dtype=np.float32) / np.float32(0.8)
    probs = np.exp(values - values[0]).tolist()
    target = LlamaCppDraw(7).uniform() * sum(probs)
    running, expected = 0.0, None
    for token, p in zip(expected_order, probs):
        running += p
        if running >= target:
            expected = token
            break
    assert LlamaCppDraw(7).draw(logits, 0.8, 3, 1.0, 0.05).tolist() == [expected]
    # one candidate left (top-k 1): still one draw from the generator, as llama.cpp keeps it aligned
    one = LlamaCppDraw(7)
    assert one.draw(logits, 0.8, 1, 1.0, 0.0).tolist() == [1]
    assert one.generator.getstate() != LlamaCppDraw(7).generator.getstate()


def test_stories260k_samples_the_text_llama_server_does(stories_model):
    """llama.cpp's server tests expect "(going|bed)+" from stories260K at temperature 0.8, seed 42, top-k 40,
    top-p 0.95, min-p 0.05 after "I believe the meaning of life is" (8 tokens, test_completion.py)."""
    texts = {}
    for rng in ("mlx", "llama.cpp"):
        params = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=42, rng=rng)
        scheduler = BatchScheduler(Engine(stories_model, max_sequences=2), SchedulerOptions())
        out = Collector()
        prompt = list(stories_model.tokenizer.encode("I believe the meaning of life is"))
        text = TextStream(stories_model.new_detokenizer(), [])
        scheduler.submit(Request("a", prompt, params, 8, text), out.sink("a"))
        scheduler.run_until_idle()
        texts[rng] = out.done("a").text
    assert re.search("(going|bed)+", texts["llama.cpp"]), texts
    assert texts["mlx"] != texts["llama.cpp"]  # the default generator is MLX's own
