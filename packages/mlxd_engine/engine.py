"""The engine: prefill, batched step, multi-token verify, commit and unwind over slot KV storage.

Contract: the engine knows token ids only (no text, no sockets, no scheduling policy). A ``Sequence`` is
its tokens (prompt + output) of which the first ``kv.committed`` are in KV storage; in plain decode
exactly one token, the last one emitted, is not yet in storage and is the next step's input.

Operations:
- ``prefill(seq, max_tokens)``: forward up to ``max_tokens`` of the tokens not yet in storage (one
  chunk); when the last prompt token has been forwarded, sample and return the first output token.
- ``submit_step(rows, lookahead=None)`` / ``read_step(handle)``: one token per row, one batched forward,
  sampled lazily and started with ``mx.async_eval``. Passing the in-flight handle of step n as
  ``lookahead`` feeds its still-unread tokens to step n+1, so a caller can submit n+1 before reading n.
  ``step(rows)`` is both at once.
- ``verify(seq, tokens)``: k+1 tokens of one row in one forward; logits at every position.
- ``commit_appends(seq, n)`` / ``unwind_appends(seq, n)``: settle pending appends (oldest first / newest
  first). A step's append is committed by ``read_step``; a verify's by the verify round.
Forwards settle KV appends and return tokens; they never write ``seq.tokens``: the caller's update step
records them (``Sequence.record``; ``standalone.py`` for loops that are their own update step).
"""

from __future__ import annotations

import itertools
import logging
from typing import cast

import mlx.core as mx
from mlx.utils import tree_flatten

from mlxd_protocol.sampling_rules import token_outside_vocabulary

from .cache_layout import ATTENTION, check_servable
from .compiled_decode import CompiledDecode, compile_wanted
from .cpu_fusion import fuse_cpu_layers as fuse_cpu_layers_of
from .cpu_fusion import fusion_wanted
from .errors import PromptTooLong
from .forward_cost import ForwardCost
from .fused_blocks import blocks_wanted, fuse_blocks
from .last_logits import last_position_only, mark_output_heads
from .loading.kernel_layers import runs_on_kernel
from .loading.loader import LoadedModel
from .ragged import is_ragged, ragged_wanted, real_lengths
from .sampling.chain import SamplerChain, SamplingParams, post_sampling_logprobs, sample_rows, token_logprobs
from .sequence import Emitted, Sequence, StepHandle
from .storage.kv_backend import make_kv_storage
from .storage.kv_dtype import dtype_name
from .storage.kv_storage import SlotState
from .storage.paged_kv_storage import DEFAULT_BLOCK_SIZE, SharedPrefix
from .storage.prefix_cache import DEFAULT_MAX_ENTRIES, PrefixCache
from .storage.row_storage import RowStorage

log = logging.getLogger("mlxd.engine")


class Engine:
    """Runs one loaded model over contiguous (slot) or paged KV storage.

    On the CPU the model's RMSNorm and RoPE layers are fused first (``cpu_fusion``; bit-identical
    results), then llama-style layers on the CPU kernel become two ops each (``fused_blocks``,
    ``MLXD_FUSE_BLOCKS=0`` keeps them op by op); ``fuse_cpu_layers=False`` or ``MLXD_FUSE_CPU_LAYERS=0``
    keeps all of them stock. A lone row's decode
    steps and verify forwards over contiguous storage (up to a capacity of 2048) run as one compiled
    graph (``compiled_decode``); ``compile_decode=False`` or ``MLXD_COMPILE_DECODE=0`` builds them op by op.

    The model's cache layout (``cache_layout.py``) sizes the storage (one view per cache entry) and shapes
    the batched masks; a layout the engine does not serve raises ``ModelLoadError`` here too, for a
    ``LoadedModel`` that did not come from ``load``. ``kv_dtype`` (float16, or None: as computed) is the dtype
    float32 keys and values are kept in (``storage/kv_dtype.py``)."""

    # What the scheduler and the daemon ask of a distributed group (daemon/mlxd_daemon/distributed.py's Leader
    # overrides all three): why its ranks parted, None while they are in step; a single-process engine never loses them.
    lost: str | None = None

    def mark_lost(self, error: BaseException) -> None:
        """A forward failed in a way that may leave a group's ranks out of step (nothing to do here)."""

    def heartbeat(self) -> None:
        """Called by the daemon while it has no work: a group's rank 0 checks its ranks (nothing to do here)."""

    def __init__(
        self,
        loaded: LoadedModel,
        max_sequences: int = 8,
        max_kv_size: int | None = None,
        storage: str = "contiguous",
        kv_block_size: int = DEFAULT_BLOCK_SIZE,
        kv_pool_tokens: int | None = None,
        fuse_cpu_layers: bool | None = None,
        compile_decode: bool | None = None,
        prefix_cache_bytes: int = 0,
        prefix_cache_entries: int = DEFAULT_MAX_ENTRIES,
        kv_dtype: mx.Dtype | None = None,
    ):
        self.loaded = loaded
        self.model = loaded.model
        self.layout = loaded.layout()
        check_servable(self.layout)
        wanted = fusion_wanted() if fuse_cpu_layers is None else fuse_cpu_layers
        self.fused_layers = fuse_cpu_layers_of(self.model) if wanted else 0
        self.fused_blocks = fuse_blocks(self.model) if wanted and blocks_wanted() else 0
        self.output_heads = mark_output_heads(self.model)  # a prompt's logits at its last position only
        # verify forwards of rows of different widths compute their real tokens only, on the CPU kernel (ragged.py)
        self.ragged_verify = mx.default_device() == mx.cpu and runs_on_kernel(self.model) and ragged_wanted()
        if max_kv_size and loaded.context_source == "fallback":
            self.max_kv_size = max_kv_size  # the context length was a guess: the caller's figure stands
        else:
            self.max_kv_size = min(max_kv_size or loaded.context_length, loaded.context_length)
        leaves = self.layout.leaves()
        kv_entries = [leaf for leaf in leaves if leaf.kind == ATTENTION]
        self.storage = make_kv_storage(
            storage,
            len(kv_entries),
            max_sequences,
            self.max_kv_size,
            kv_block_size,
            kv_pool_tokens,
            mask_axes=self.layout.mask_axes,
            kv_dtype=kv_dtype,
        )
        if kv_dtype is not None:
            log.info("keys and values of float32 kept as %s", dtype_name(kv_dtype))
        if len(kv_entries) < len(leaves):  # sliding windows or recurrent state: rows beside the KV backend
            self.storage = RowStorage(self.storage, self.layout.entries, max_sequences)
            limit = self.storage.max_forward_tokens
            log.info(
                "model type %s: %s%s%s",
                loaded.model_type,
                self.layout.describe(),
                f"; sliding windows in rings, one forward appends at most {limit} tokens per row" if limit else "",
                "; recurrent state unwinds by restore and replay" if self.layout.unwinds_by_replay else "",
            )
        self._ids = itertools.count()
        # what a forward costs by rows, query tokens and context: fed by the update steps with the forwards
        # execute steps timed (forward_sample.py), calibrated at start-up by the daemon (forward_cost.py)
        self.forward_cost = ForwardCost()
        # finished sequences' prefixes, reused by later prompts that start the same way (off at 0 bytes)
        # (paged storage: entries hold block references, given back through release_prefix when they go)
        self.prefix_cache = (
            PrefixCache(
                prefix_cache_bytes,
                prefix_cache_entries,
                boundary_only=self.storage.prefix_at_boundary_only,
                on_remove=self.storage.release_prefix,
            )
            if prefix_cache_bytes > 0
            else None
        )
        compiled = compile_wanted() if compile_decode is None else compile_decode
        self.compiled_decode = (
            CompiledDecode(self.model, mask_axes=self.layout.mask_axes)
            if compiled and self.storage.compiles_forward
            else None
        )

    @property
    def can_unwind(self) -> bool:
        """Whether speculative appends can be dropped again (``storage_can_unwind`` of the eligibility
        predicate): by a counter move, or for recurrent state by a restore and replay (``storage/row_storage.py``)."""
        return self.storage.can_unwind

    @property
    def max_forward_tokens(self) -> int | None:
        """Most tokens one forward may append to a row (sliding-window rings), or None for no limit."""
        return self.storage.max_forward_tokens

    def check_request(
        self, prompt_tokens: int, max_new_tokens: int | None = None, params: SamplingParams | None = None
    ) -> None:
        """The one admissibility check: raises ValueError for a request that could never run here (an empty
        prompt, one at the context bound (``PromptTooLong``), no tokens to give, a reservation no pool could
        hold, sampling parameters this vocabulary refuses). The scheduler asks it when a request is submitted,
        ``add_sequence`` (prompt and parameters) when it is admitted."""
        if prompt_tokens < 1:
            raise ValueError("the prompt is empty")
        if prompt_tokens >= self.max_kv_size:
            raise PromptTooLong(
                f"prompt of {prompt_tokens} tokens does not fit the context bound of {self.max_kv_size}"
            )
        if max_new_tokens is not None:
            if max_new_tokens < 1:
                raise ValueError("max_tokens must be >= 1")
            if not self.fits(prompt_tokens, max_new_tokens):
                raise ValueError("the request can never fit the KV pool: lower max_tokens or raise --kv-pool-tokens")
        if params is not None:
            params.validate(self.loaded.vocab_size)

    def fits(self, prompt_tokens: int, max_new_tokens: int) -> bool:
        """Whether a request could ever run here (it may still have to wait for room)."""
        return prompt_tokens < self.max_kv_size and self.storage.fits(self._reservation(prompt_tokens, max_new_tokens))

    def can_admit(self, prompt_tokens: int, max_new_tokens: int) -> bool:
        """Whether such a request can be admitted now, counting paged blocks that only prefix cache entries
        hold as free (``add_sequence`` evicts entries for them before it would refuse). Blocks a prompt
        would share from the cache are not known here (no prompt), so this may wait where a hit fits."""
        reservation = self._reservation(prompt_tokens, max_new_tokens)
        if self.storage.can_admit(reservation):
            return True
        return self.prefix_cache is not None and self.storage.can_admit(
            reservation, extra_blocks=self.storage.evictable_blocks()
        )

    def _reservation(self, prompt_tokens: int, max_new_tokens: int) -> int:
        return min(prompt_tokens + max_new_tokens, self.max_kv_size)

    # -- sequence lifetime ---------------------------------------------------------------------
    def add_sequence(
        self,
        prompt: list[int],
        params: SamplingParams | None = None,
        max_new_tokens: int | None = None,
        cache_prompt: bool = True,
    ) -> Sequence:
        """Admit a sequence; raises KVStorageFull when there is no room for it now or the prompt cannot fit
        (``PromptTooLong``, from ``check_request``, which also refuses an empty prompt and bad parameters), and
        ValueError for a prompt token outside the vocabulary (the daemon's edge refuses those first).

        ``max_new_tokens`` sizes the reservation on paged storage (default: up to the KV bound). With a
        prefix cache and ``cache_prompt``, the longest cached prefix of the prompt is put in storage at
        once (``seq.cached_tokens``) and prefill starts after it. On paged storage the hit's whole blocks
        are shared, so the reservation is that many blocks smaller; when the pool is short, least recently
        used cache entries are evicted first (the hit's blocks pinned meanwhile, its entry evicted last).
        Only when evicting every entry would not make room does this refuse (``can_admit`` counts the
        same blocks, so a request the scheduler admits is never refused here)."""
        params = params or SamplingParams()
        self.check_request(len(prompt), params=params)
        bad = token_outside_vocabulary(prompt, self.loaded.vocab_size)
        if bad is not None:
            raise ValueError(f"prompt token {bad} is outside the vocabulary of {self.loaded.vocab_size}")
        reservation = self._reservation(len(prompt), max_new_tokens or self.max_kv_size)
        lookup = self.prefix_cache if cache_prompt else None  # the prefix cache, when this prompt uses it
        entry, reused = lookup.find(prompt) if lookup is not None else (None, 0)
        # a pin keeps the blocks the hit reuses alive through the evictions below (paged; copies: itself)
        pin = self.storage.pin_prefix(entry.snapshot, reused) if entry is not None else None
        try:
            shared = self.storage.prefix_blocks(reused) if entry is not None else 0
            if not self._make_room(reservation, shared, entry) and entry is not None:
                # with the hit pinned there is no room (a copy-on-write source block counts once more
                # while pinned): admitted as a miss, which the evictable blocks do cover when can_admit did
                self.storage.release_prefix(pin)
                entry, reused, shared, pin = None, 0, 0, None
                self._make_room(reservation, 0, None)
            kv = self.storage.allocate(reservation, shared_blocks=shared)
            seq = Sequence(
                next(self._ids),
                kv,
                list(prompt),
                len(prompt),
                SamplerChain(params),
                self.max_kv_size,
                cache_prompt=cache_prompt,
            )
            if lookup is not None:
                lookup.record(entry, reused)  # counted once admitted (a refused one looks up again)
            if entry is not None:
                self.storage.write_prefix(kv, pin, reused)
                seq.cached_tokens = reused
        finally:
            if pin is not None:
                self.storage.release_prefix(pin)
        seq.chain.follow(seq.tokens, seq.prompt_length)  # a grammar stage reads the row's output (sampling/grammar.py)
        return seq

    def _make_room(self, reservation: int, shared: int, keep) -> bool:
        """Whether the storage can admit ``reservation`` tokens with ``shared`` blocks shared, after evicting
        least recently used prefix cache entries (``keep``, the one hit, last) if that is what it takes.
        Nothing is evicted when evicting every entry would still not be enough."""
        storage, cache = self.storage, self.prefix_cache
        if storage.can_admit(reservation, shared):
            return True
        if cache is None or not storage.can_admit(reservation, shared, storage.evictable_blocks()):
            return False
        while not storage.can_admit(reservation, shared) and cache.evict_lru(keep):
            pass
        return storage.can_admit(reservation, shared)

    def release(self, seq: Sequence, keep_prefix: bool = True) -> None:
        """Give the slot back. Safe while a step for it is in flight: MLX orders that step's writes
        before any later forward's, and ``read_step`` ignores released rows.

        With a prefix cache, ``keep_prefix`` and the sequence's ``cache_prompt``, its tokens in storage
        (prompt and output) and their state go into the cache first (not after a failure:
        ``keep_prefix=False``): copied out of contiguous storage; on paged storage the cache takes
        references on the sequence's blocks, which then outlive this release."""
        if seq.released:
            return
        if self.prefix_cache is not None and keep_prefix and seq.cache_prompt:
            self._keep_prefix(seq)
        seq.released = True
        self.storage.release(seq.kv)

    def _keep_prefix(self, seq: Sequence) -> None:
        end = self.storage.prefix_end(seq.kv)
        if not end:
            return
        assert self.prefix_cache is not None  # release() calls this only with a prefix cache
        snapshot = self.storage.read_prefix(seq.kv, end)
        leaves = [leaf for _, leaf in tree_flatten(snapshot)]  # type: ignore[str-unpack]  # a list of pairs here
        arrays = [a for a in leaves if isinstance(a, mx.array)]
        if arrays:
            mx.async_eval(*arrays)  # copies out before the slot is written again
        # a paged snapshot's blocks are referenced, not copied: they count at their size in the pool
        shared = sum(leaf.nbytes for leaf in leaves if isinstance(leaf, SharedPrefix))
        self.prefix_cache.store(seq.tokens[:end], snapshot, sum(a.nbytes for a in arrays) + shared)

    # -- forwards ---------------------------------------------------------------------------
    def _forward(self, rows: list[Sequence], inputs: mx.array, compiled: bool = True, lengths=None) -> mx.array:
        # inputs: [B, T] -> logits [B, T, V] in the rows' order; appends become pending on every row.
        # compiled: a decode step or verify forward may run as the compiled graph (prompt chunks do not)
        # lengths: each row's real tokens (the rest padding); the CPU kernel computes those only (ragged.py)
        states = [r.kv for r in rows]
        self.storage.reserve(states, inputs.shape[1])
        order = self.storage.read_order(states) if len(rows) > 1 else None
        if order is not None:
            # run the rows in the order the storage reads fastest, hand the logits back in the caller's
            inverse = [0] * len(order)
            for position, row in enumerate(order):
                inverse[row] = position
            ordered = [lengths[i] for i in order] if lengths is not None else None
            return self._forward_in_order([states[i] for i in order], inputs[mx.array(order)], compiled, ordered)[
                mx.array(inverse)
            ]
        return self._forward_in_order(states, inputs, compiled, lengths)

    def _forward_in_order(self, states: list[SlotState], inputs: mx.array, compiled: bool, lengths=None) -> mx.array:
        if len(states) > 1 and self.layout.mask_axes is None:
            # no batched mask keeps this model's rows apart (cache_layout.py): one forward per row
            return mx.concatenate(
                [self._forward_in_order([state], inputs[i : i + 1], compiled) for i, state in enumerate(states)]
            )
        if compiled and self.compiled_decode is not None and lengths is None:
            logits = self.compiled_decode.forward(self.storage, states, inputs)
            if logits is not None:
                return logits
        with real_lengths(lengths, inputs.shape[1]):
            return self.model(inputs, cache=self.storage.views(states, inputs.shape[1]))

    def prefill(self, seq: Sequence, max_tokens: int | None = None) -> Emitted | None:
        """Forward one chunk of the prompt. Returns the first output token once the prompt is in (not
        recorded: the caller's update step records it)."""
        start = seq.kv.written
        remaining = seq.prompt_length - start
        if remaining <= 0:
            raise ValueError("sequence is already prefilled")
        n = remaining if max_tokens is None else min(max_tokens, remaining)
        piece = self.storage.max_forward_tokens or n
        for offset in range(0, n, piece):  # a ring bounds one forward's appends: the chunk goes in pieces
            size = min(piece, n - offset)
            chunk = mx.array([seq.tokens[start + offset : start + offset + size]])
            with last_position_only():  # only the prompt's last logits are read (last_logits.py)
                logits = self._forward([seq], chunk, compiled=False)
            self.commit_appends(seq, size)
        if n < remaining:
            mx.eval(self.storage.arrays())
            return None
        return self._sample_one(seq, logits[:, -1, :])

    def _sample_one(self, seq: Sequence, logits: mx.array) -> Emitted:
        # logits: [1, V]
        chain = seq.chain
        processed = chain.process(logits, seq.history(seq.params.penalty_context)) if chain.processors else logits
        token = chain.draw(processed).astype(mx.int32)
        return self._emitted(seq, processed, token, 0)

    def submit_step(self, rows: list[Sequence], lookahead: StepHandle | None = None) -> StepHandle:
        """Submit one decode step for ``rows`` (async). See the module docstring for ``lookahead``."""
        pending_index = {r.seq_id: i for i, r in enumerate(lookahead.rows)} if lookahead and not lookahead.read else {}
        ahead = cast(StepHandle, lookahead)  # read below only when pending_index is not empty: then it is set
        if pending_index and len(ahead.rows) == len(rows) and all(a is b for a, b in zip(ahead.rows, rows)):
            inputs = ahead.tokens[:, None]  # steady decode: the same rows in the same order
        else:
            columns = []
            for seq in rows:
                if seq.seq_id in pending_index:
                    columns.append(ahead.tokens[pending_index[seq.seq_id] : pending_index[seq.seq_id] + 1])
                else:
                    if seq.kv.written != len(seq.tokens) - 1:
                        raise ValueError(
                            f"sequence {seq.seq_id} has {len(seq.tokens) - seq.kv.written} tokens outside storage; "
                            "a step feeds exactly one"
                        )
                    columns.append(mx.array([seq.tokens[-1]], dtype=mx.int32))
            inputs = mx.concatenate(columns)[:, None] if len(columns) > 1 else columns[0][None]
        logits = self._forward(rows, inputs)[:, -1, :]
        # only rows with per-row sampler state (penalties) read their history
        histories = [
            self._history_fn(seq, pending_index, lookahead) if seq.chain.has_row_state else None for seq in rows
        ]
        tokens = sample_rows([seq.chain for seq in rows], logits, histories)
        handle = StepHandle(rows=list(rows), tokens=tokens, logits=logits)
        if any(seq.params.logprobs is not None for seq in rows):
            handle.logprob_parts = token_logprobs(logits, tokens, max(seq.params.logprobs or 0 for seq in rows))
            # a chain with post_sampling has no processors (the daemon refuses them together): raw logits
            handle.post_parts = {
                i: post_sampling_logprobs(seq.chain, logits[i : i + 1], tokens[i : i + 1], seq.params.logprobs or 0)
                for i, seq in enumerate(rows)
                if seq.params.post_sampling and seq.params.logprobs is not None
            }
            mx.async_eval(
                tokens, *handle.logprob_parts, *(part for parts in handle.post_parts.values() for part in parts)
            )
        else:
            mx.async_eval(tokens)
        return handle

    @staticmethod
    def _history_fn(seq: Sequence, pending_index: dict[int, int], lookahead: StepHandle | None):
        window = seq.params.penalty_context

        def history() -> mx.array:
            known = seq.history(window)
            if seq.seq_id not in pending_index:
                return known
            i = pending_index[seq.seq_id]
            return mx.concatenate([known, lookahead.tokens[i : i + 1]])[-window:]  # type: ignore[union-attr]

        return history

    def read_step(self, handle: StepHandle) -> list[Emitted]:
        """Wait for a submitted step and commit its append on every live row. Returns every row's token (a
        released row's too, which callers drop); the caller records them before the row's next step."""
        if handle.read:
            raise ValueError("step already read")
        handle.read = True
        tokens: list[int] = handle.tokens.tolist()  # type: ignore[assignment]  # [B] token ids
        results = []
        for i, (seq, token) in enumerate(zip(handle.rows, tokens)):
            if seq.released:
                results.append(Emitted(int(token)))
                continue
            self.commit_appends(seq, 1)
            emitted = Emitted(int(token))
            if i in handle.post_parts:
                emitted = self._logprob_record(int(token), handle.post_parts[i], 0, seq.params.logprobs or 0)
            elif handle.logprob_parts is not None and seq.params.logprobs is not None:
                emitted = self._logprob_record(int(token), handle.logprob_parts, i, seq.params.logprobs)
            results.append(emitted)
        return results

    def step(self, rows: list[Sequence]) -> list[Emitted]:
        """One synchronous decode step: a token for every row, neither recorded nor timed (``timed_step``
        times it for the caller's update step)."""
        return self.read_step(self.submit_step(rows))

    def verify(self, seq: Sequence, tokens: list[int]) -> mx.array:
        """Forward ``tokens`` (the current token + a proposal) of one row. Returns logits [k+1, V].

        The appends stay pending until the caller commits the accepted prefix and unwinds the rest.
        """
        return self.verify_rows([seq], [tokens])[0]

    def verify_rows(self, rows: list[Sequence], token_lists: list[list[int]]) -> mx.array:
        """One forward of several rows' current token + proposal, each padded to the longest after its real
        tokens (with its current token: any id would do, the causal mask hides the padding from every
        real position). Returns logits [B, T, V]; every row has T pending appends."""
        for seq, tokens in zip(rows, token_lists):
            if seq.kv.written != len(seq.tokens) - 1 or tokens[0] != seq.tokens[-1]:
                raise ValueError("verify starts at the sequence's current token, with nothing pending")
        lengths = [len(tokens) for tokens in token_lists]
        padded = [tokens + [tokens[0]] * (max(lengths) - len(tokens)) for tokens in token_lists]
        ragged = lengths if is_ragged(self.ragged_verify, lengths) else None
        return self._forward(rows, mx.array(padded), lengths=ragged)

    # -- settling appends ----------------------------------------------------------------------
    def commit_appends(self, seq: Sequence, n: int) -> None:
        self.storage.commit(seq.kv, n)

    def unwind_pending(self, seq: Sequence) -> None:
        """Drop every append not committed yet: a failed or abandoned forward's, so the row again has
        exactly its last token outside storage."""
        if seq.kv.pending:
            self.unwind_appends(seq, seq.kv.pending)

    def unwind_appends(self, seq: Sequence, n: int, kept: list[int] | None = None) -> None:
        """Drop the newest ``n`` appends. Recurrent state is put back where it last settled and the kept
        tokens after that point are forwarded again (``storage/row_storage.py``), read from ``seq.tokens``
        followed by ``kept``: the tokens the caller will record for the appends it kept (a verify round's)."""
        replay = self.storage.unwind(seq.kv, n)
        if replay:
            start = seq.kv.written
            tokens = seq.tokens + kept if kept else seq.tokens
            self._forward([seq], mx.array([tokens[start : start + replay]]), compiled=False)
            self.commit_appends(seq, replay)

    # -- log-probabilities -------------------------------------------------------------------
    def _emitted(self, seq: Sequence, logits: mx.array, token: mx.array, row: int) -> Emitted:
        if seq.params.logprobs is None:
            return Emitted(int(token.item()))  # type: ignore[arg-type]  # a token id: item() is an int
        if seq.params.post_sampling:
            parts = post_sampling_logprobs(seq.chain, logits, token.reshape(-1), seq.params.logprobs)
        else:
            parts = token_logprobs(logits, token.reshape(-1), seq.params.logprobs)
        return self._logprob_record(int(token.item()), parts, row, seq.params.logprobs)  # type: ignore[arg-type]

    @staticmethod
    def _logprob_record(token: int, parts: tuple, row: int, top_n: int) -> Emitted:
        chosen, top_ids, top_values = parts
        ids = top_ids[row, :top_n].tolist()
        values = top_values[row, :top_n].tolist()
        return Emitted(token, float(chosen[row].item()), list(zip(ids, values)))
