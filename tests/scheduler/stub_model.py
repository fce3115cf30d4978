"""A stub model with no weights and a byte tokenizer, for scheduler logic.

The stub goes through the real KV storage: each token is stored as its own key and value, and the next
token is ``(sum of every visible token) % 250 + 1``. A wrong mask, offset or unwind changes the sum, so
batched runs are compared with single-sequence runs on the same stub. Token 255 is EOS and never
produced unless ``eos_after`` forces it; ``poison`` makes a one-token step that sees it raise.
"""

from __future__ import annotations

import mlx.core as mx

from mlxd_engine import LoadedModel

VOCAB = 256
EOS = 255


class StubModel:
    """``period`` None: next token = (sum of visible tokens) % 250 + 1. ``period`` K: next token = the
    token K-1 positions back, so the reply repeats the last K tokens of the prompt over and over."""

    def __init__(self, period: int | None = None, copy_from: int = 0, sum_mod: int = 250):
        self.poison: int | None = None
        # sum_mod < 250: the sum rule also mixes in the square of the query's position and answers in 1..sum_mod,
        # so its tokens recur (n-gram matches) but never settle into a cycle (the drafts fail)
        self.sum_mod = sum_mod
        self.period = period
        self.copy_from = copy_from  # with a period: queries seeing fewer tokens than this use the sum rule
        self.forward_calls = 0

    def __call__(self, inputs: mx.array, cache=None) -> mx.array:
        # inputs: [B, T]
        self.forward_calls += 1
        batch, length = inputs.shape
        if self.poison is not None and length == 1 and self.poison in inputs.reshape(-1).tolist():
            raise RuntimeError("poisoned step")
        view = cache[0]
        x = inputs.astype(mx.float32)[:, None, :, None]  # [B, 1, T, 1]
        _, values = view.update_and_fetch(x, x)  # [B, 1, L, 1]
        total_len = values.shape[2]
        mask = view.make_mask(length)
        if mask is None:
            visible = mx.ones((batch, 1, length, total_len), dtype=mx.bool_)
        elif isinstance(mask, str):
            q = mx.arange(total_len - length, total_len)[:, None]
            visible = mx.broadcast_to((mx.arange(total_len)[None, :] <= q)[None, None], (batch, 1, length, total_len))
        else:
            visible = mx.broadcast_to(mask, (batch, 1, length, total_len))
        sums = (visible.astype(mx.float32) * values[:, :, None, :, 0]).sum(axis=-1)[:, 0]  # [B, T]
        nxt = sums.astype(mx.int32)
        if self.sum_mod < 250:
            position = visible[:, 0].astype(mx.int32).sum(axis=-1)
            nxt = nxt + position * position
        nxt = (nxt % self.sum_mod) + 1
        if self.period is not None:
            seen = visible[:, 0].astype(mx.int32).sum(axis=-1)  # [B, T]: tokens visible to each query
            back = mx.maximum(seen - self.period, 0)
            copied = mx.take_along_axis(values[:, 0, :, 0], back, axis=-1).astype(mx.int32)  # [B, T]
            nxt = mx.where((seen >= self.period) & (seen >= self.copy_from), copied, nxt)
        return mx.where(mx.arange(VOCAB)[None, None, :] == nxt[..., None], 10.0, 0.0)


class ByteDetokenizer:
    """Streaming detokenizer protocol (add_token / finalize / last_segment): token t is chr(t)."""

    def __init__(self):
        self.last_segment = ""

    def add_token(self, token: int) -> None:
        self.last_segment = chr(token)

    def finalize(self) -> None:
        self.last_segment = ""


def as_text(tokens: list[int]) -> str:
    return "".join(chr(t) for t in tokens)


def stub_loaded(eos: int = EOS, period: int | None = None, copy_from: int = 0, sum_mod: int = 250) -> LoadedModel:
    return LoadedModel(
        model=StubModel(period, copy_from, sum_mod),
        tokenizer=None,
        path="<stub>",
        model_type="stub",
        n_layers=1,
        vocab_size=VOCAB,
        eos_token_ids=frozenset({eos}),
        context_length=4096,
    )


class StubCost:
    """The verify gate's costs with fixed numbers (a prompt-lookup arm's ``cost_model``): every forward,
    a plain step included, ``fixed`` ms plus ``per_token`` ms a query token, no tick overhead, and no
    bound on what exploring may lose.
    Scheduler tests pin the gate with it, so what they check does not hang on how fast this machine runs
    the stub."""

    def __init__(self, fixed: float, per_token: float):
        self.fixed, self.per_token = fixed, per_token

    def estimate(self, rows, width, context):
        return self.fixed + self.per_token * rows * width

    def costs(self):
        from mlxd_scheduler.tick_plan import Costs

        return Costs(self.estimate)

    def observe_tick(self, *args):
        pass

    def spent_exploring(self, ms):
        pass

    def declined(self, drafts):
        pass


VERIFY_PAYS = StubCost(fixed=10.0, per_token=0.01)  # as on a GPU: a forward costs nearly the same at any width


class FastStepCost(StubCost):
    """The fast-step regime of a small model on a CPU: a pipelined plain step costs ``step`` ms (chained,
    overlapping Python), a synchronous forward ``fixed`` ms plus ``per_token`` a query token, and every
    synchronous tick ``sync_overhead`` ms more (reading the lookahead step, the finish step, re-priming);
    nothing may be lost exploring. A fresh draft's prior alone does not pay for a verify here; what the
    row really accepts does."""

    def __init__(self, step: float = 0.4, fixed: float = 0.8, per_token: float = 0.05, sync_overhead: float = 2.0):
        super().__init__(fixed, per_token)
        self.step, self.sync_overhead = step, sync_overhead

    def costs(self):
        from mlxd_scheduler.tick_plan import Costs

        return Costs(
            self.estimate,
            sync_overhead_ms=self.sync_overhead,
            plain_step_ms=lambda rows: self.step * rows,
            explore_budget_ms=0.0,
        )
