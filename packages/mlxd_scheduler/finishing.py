"""The finish step: every emitted token of every row goes through here, whatever produced it.

Contract: ``Finisher.accept(state, token)`` records one output token of a request (``accept_run`` the
tokens a row got in one tick, with one event for them): timings, EOS, the
stop strings (through the request's TextStream), max_tokens and the KV bound; it streams a TokenEvent
unless the token ended the output (EOS, or a stop string with nothing before it). It returns the
finish reason when the row must stop. ``Finisher.finish(state, reason)`` releases the row's sequence
and reports the FinishEvent. Plain steps, first tokens from prefill and verify rounds all use these two
calls, so a token is judged the same way however it was produced.
"""

from __future__ import annotations

import logging
import time

from mlxd_engine import Engine, ends_on, reaches_length

from .request import FinishEvent, RequestState, TokenEvent

log = logging.getLogger("mlxd.scheduler")


class Finisher:
    def __init__(self, engine: Engine):
        self.engine = engine
        self.eos = engine.loaded.eos_token_ids

    def accept(self, state: RequestState, token: int, logprobs: dict | None = None) -> str | None:
        """Record one emitted token. Returns a finish reason ("stop", "length") or None."""
        return self.accept_run(state, [token], [logprobs] if logprobs else None)[2]

    def accept_run(
        self, state: RequestState, tokens: list[int], logprobs: list | None = None
    ) -> tuple[int, int, str | None]:
        """``accept`` for a row's tokens of one tick, in order, with one TokenEvent for them all.

        Judges every token exactly as ``accept`` would and stops at the first that ends the row. Returns
        (tokens judged, tokens taken as output: an EOS that ends the row is judged but not taken, the
        finish reason or None)."""
        now = time.perf_counter()
        timings = state.timings
        if timings.first_token is None:
            timings.first_token = now
        timings.last_token = now
        request, seq, text_stream = state.request, state.seq, state.request.text
        eos = () if request.ignore_eos else self.eos
        judged, taken, parts, reason = 0, 0, [], None
        for index, token in enumerate(tokens):
            judged += 1
            if ends_on(eos, token):
                reason = "stop"
                break
            taken += 1
            state.emitted += 1
            if text_stream is not None:
                text, stopped = text_stream.push(token)
                parts.append(text)
                if stopped:
                    reason = "stop"
                    break
            # the run's tokens were read at once: storage held fewer tokens when this one was emitted
            if reaches_length(seq, state.emitted, request.max_tokens, later=len(tokens) - 1 - index):
                reason = "length"
                break
        if taken:
            kept = logprobs[:taken] if logprobs else None
            state.sink(TokenEvent(state.request_id, list(tokens[:taken]), "".join(parts), kept))
        return judged, taken, reason

    def finish(self, state: RequestState, reason: str, error: str | None = None) -> None:
        """End a request: release its sequence, flush its text and report the FinishEvent. The scheduler
        calls it once per request (its ``_finish`` moves the request to "finished" first)."""
        seq = state.seq
        tokens = state.output_tokens()  # across context shifts (context_shift.py)
        if seq is not None:
            self.engine.release(seq, keep_prefix=reason != "error")  # a failed row's storage is not trusted
        tail = state.request.text.finish() if state.request.text is not None and reason != "error" else ""
        if tail:
            state.sink(TokenEvent(state.request_id, [], tail))
        text = state.request.text.text if state.request.text is not None else ""
        prompt_n = len(state.request.prompt)
        cached = seq.cached_tokens if seq is not None else 0  # prompt tokens the prefix cache gave
        usage = {
            "prompt_tokens": prompt_n,
            "completion_tokens": len(tokens),
            "total_tokens": prompt_n + len(tokens),
            "cached_tokens": cached,
        }
        prediction = state.drafter.prediction if state.drafter is not None else None
        if state.request.prediction:  # OpenAI's names; with no drafter (speculation refused) nothing was accepted
            accepted = prediction.accepted if prediction is not None else 0
            usage["accepted_prediction_tokens"] = accepted
            usage["rejected_prediction_tokens"] = len(state.request.prediction) - accepted
        timings = state.timings.report(prompt_n - cached, len(tokens), cached)
        if reason == "error":
            log.warning("request %s failed: %s", state.request_id, error)
        truncated = state.context_shifts > 0
        state.sink(FinishEvent(state.request_id, reason, tokens, text, usage, timings, error, truncated))
