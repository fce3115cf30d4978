"""BatchScheduler on the stub model: continuous batching, finishing, cancellation, lookahead, errors."""

from __future__ import annotations

import pytest

from mlxd_engine import Engine
from mlxd_scheduler import (
    BatchScheduler,
    FinishEvent,
    Request,
    SchedulerOptions,
    TextStream,
    TokenEvent,
    generate_plain,
)

from .stub_model import ByteDetokenizer, as_text, stub_loaded

PROMPTS = [[5, 9, 2], [40, 3, 3, 3, 7, 1, 2, 8], [100], [17, 17, 4, 90, 33]]


def reference(loaded, prompt, max_tokens):
    return generate_plain(Engine(loaded, max_sequences=1), prompt, max_tokens).tokens


class Collector:
    def __init__(self):
        self.events: dict[str, list] = {}

    def sink(self, request_id):
        self.events[request_id] = []
        return self.events[request_id].append

    def done(self, request_id) -> FinishEvent:
        finish = self.events[request_id][-1]
        assert isinstance(finish, FinishEvent)
        return finish

    def streamed_tokens(self, request_id):
        return [t for e in self.events[request_id] if isinstance(e, TokenEvent) for t in e.tokens]


def make(loaded=None, **options):
    loaded = loaded or stub_loaded()
    records = []
    scheduler = BatchScheduler(
        Engine(loaded, max_sequences=options.pop("slots", 8)), SchedulerOptions(**options), records.append
    )
    return scheduler, records


@pytest.mark.parametrize("lookahead", [True, False])
def test_concurrent_rows_equal_single_sequence_runs(lookahead):
    scheduler, _ = make(lookahead=lookahead)
    out = Collector()
    for i, prompt in enumerate(PROMPTS):
        scheduler.submit(Request(str(i), prompt, max_tokens=30), out.sink(str(i)))
    scheduler.run_until_idle()
    for i, prompt in enumerate(PROMPTS):
        finish = out.done(str(i))
        assert finish.tokens == reference(scheduler.engine.loaded, prompt, 30)
        assert out.streamed_tokens(str(i)) == finish.tokens
        assert finish.finish_reason == "length" and len(finish.tokens) == 30


def test_admits_while_others_decode_and_every_row_steps_each_tick():
    scheduler, records = make(prefill_chunk=4, max_decode_steps=1)  # one token per row and tick
    out = Collector()
    scheduler.submit(Request("a", PROMPTS[0], max_tokens=40), out.sink("a"))
    for _ in range(6):
        scheduler.tick()
    assert scheduler.decoding and scheduler.decoding[0].request_id == "a"
    scheduler.submit(Request("b", PROMPTS[1], max_tokens=10), out.sink("b"))  # 8 tokens: two prefill chunks
    tick_of_b_prefill = []
    while scheduler.has_work:
        record = scheduler.tick()
        if record and any(r.request_id == "b" and r.action == "prefill" for r in record.rows):
            tick_of_b_prefill.append(record)
            assert any(r.request_id == "a" and r.action == "decode" for r in record.rows)  # a keeps decoding
    assert tick_of_b_prefill
    # in ticks where both decode, both got a token
    both = [r for r in records if {x.request_id for x in r.rows if x.action == "decode"} == {"a", "b"}]
    assert len(both) >= 8
    assert out.done("a").tokens == reference(scheduler.engine.loaded, PROMPTS[0], 40)
    assert out.done("b").tokens == reference(scheduler.engine.loaded, PROMPTS[1], 10)


def test_steady_decode_is_pipelined_and_unpipelined_is_not():
    for lookahead in (True, False):
        scheduler, records = make(lookahead=lookahead, max_decode_steps=1)
        scheduler.submit(Request("a", PROMPTS[0], max_tokens=20), Collector().sink("a"))
        scheduler.run_until_idle()
        decode_ticks = [r for r in records if any(x.action == "decode" for x in r.rows)]
        assert len(decode_ticks) >= 18
        assert all(r.pipelined for r in decode_ticks) is lookahead
        assert any(r.pipelined for r in decode_ticks) is lookahead


def test_cancellation_frees_the_slot_at_the_next_tick():
    scheduler, _ = make(slots=2, max_batch=2)
    out = Collector()
    scheduler.submit(Request("a", PROMPTS[0], max_tokens=500), out.sink("a"))
    scheduler.submit(Request("b", PROMPTS[1], max_tokens=500), out.sink("b"))
    for _ in range(8):
        scheduler.tick()
    assert scheduler.engine.storage.free_slots == 0
    scheduler.cancel("a")
    scheduler.tick()
    assert out.done("a").finish_reason == "cancelled"
    assert scheduler.engine.storage.free_slots == 1
    scheduler.submit(Request("c", PROMPTS[2], max_tokens=5), out.sink("c"))  # reuses a's slot
    scheduler.cancel("b")
    scheduler.run_until_idle()
    assert out.done("b").finish_reason == "cancelled"
    assert out.done("c").tokens == reference(scheduler.engine.loaded, PROMPTS[2], 5)
    assert scheduler.engine.storage.free_slots == 2
    assert not scheduler.cancel("nope")


def test_cancel_while_waiting():
    scheduler, _ = make(slots=1, max_batch=1)
    out = Collector()
    scheduler.submit(Request("a", PROMPTS[0], max_tokens=50), out.sink("a"))
    scheduler.submit(Request("b", PROMPTS[1], max_tokens=50), out.sink("b"))
    scheduler.tick()
    scheduler.cancel("b")
    scheduler.tick()
    assert out.done("b").finish_reason == "cancelled" and out.done("b").tokens == []


def test_stop_string_split_across_tokens():
    loaded = stub_loaded()
    prompt = PROMPTS[3]
    full = reference(loaded, prompt, 40)
    text = as_text(full)
    # a stop string made of output tokens 10..12: it spans three tokens
    stop = as_text(full[10:13])
    assert text.index(stop) == 10
    scheduler, _ = make(loaded)
    out = Collector()
    scheduler.submit(Request("s", prompt, max_tokens=40, text=TextStream(ByteDetokenizer(), [stop])), out.sink("s"))
    scheduler.run_until_idle()
    finish = out.done("s")
    assert finish.finish_reason == "stop"
    assert finish.text == text[: text.index(stop)]
    streamed = "".join(e.text for e in out.events["s"] if isinstance(e, TokenEvent))
    assert streamed == finish.text and stop not in streamed


def test_max_tokens_exact_and_eos():
    loaded = stub_loaded()
    scheduler, _ = make(loaded)
    out = Collector()
    for n in (1, 2, 7):
        scheduler.submit(Request(f"m{n}", PROMPTS[1], max_tokens=n), out.sink(f"m{n}"))
    scheduler.run_until_idle()
    for n in (1, 2, 7):
        assert len(out.done(f"m{n}").tokens) == n and out.done(f"m{n}").finish_reason == "length"
    # make the 5th output token an EOS: the row stops there and EOS is not reported
    fifth = reference(loaded, PROMPTS[1], 5)[4]
    eos_loaded = stub_loaded(eos=fifth)
    scheduler, _ = make(eos_loaded)
    scheduler.submit(Request("e", PROMPTS[1], max_tokens=50), out.sink("e"))
    scheduler.run_until_idle()
    assert out.done("e").finish_reason == "stop" and len(out.done("e").tokens) == 4


def test_bad_requests_are_refused_and_a_failing_row_fails_alone():
    scheduler, _ = make()
    with pytest.raises(ValueError, match="empty"):
        scheduler.submit(Request("x", [], max_tokens=5), Collector().sink("x"))
    with pytest.raises(ValueError, match="max_tokens"):
        scheduler.submit(Request("x", [1], max_tokens=0), Collector().sink("x"))
    loaded = stub_loaded()
    poisoned_prompt = PROMPTS[2]
    poison = reference(loaded, poisoned_prompt, 3)[1]  # the 2nd output token is fed to a step
    scheduler, _ = make(loaded)
    assert_poisoned_row_fails_alone(scheduler, loaded, poisoned_prompt, poison)


def assert_poisoned_row_fails_alone(scheduler, loaded, poisoned_prompt, poison) -> None:
    """A row whose step sees ``poison`` fails with an error; two rows beside it finish as if alone."""
    loaded.model.poison = poison
    out = Collector()
    scheduler.submit(Request("bad", poisoned_prompt, max_tokens=30), out.sink("bad"))
    for i, prompt in enumerate(PROMPTS[:2]):
        scheduler.submit(Request(str(i), prompt, max_tokens=30), out.sink(str(i)))
    scheduler.run_until_idle()
    loaded.model.poison = None
    assert out.done("bad").finish_reason == "error"
    for i, prompt in enumerate(PROMPTS[:2]):
        assert out.done(str(i)).tokens == reference(loaded, prompt, 30)
    assert scheduler.engine.storage.free_slots == 8


def test_timings_use_llama_server_names():
    scheduler, _ = make()
    out = Collector()
    scheduler.submit(Request("t", PROMPTS[1], max_tokens=12), out.sink("t"))
    scheduler.run_until_idle()
    timings = out.done("t").timings
    for key in (
        "prompt_n",
        "prompt_ms",
        "prompt_per_second",
        "predicted_n",
        "predicted_ms",
        "predicted_per_token_ms",
        "predicted_per_second",
    ):
        assert key in timings
    assert timings["prompt_n"] == len(PROMPTS[1]) and timings["predicted_n"] == 12
    assert "draft_kind" not in timings
