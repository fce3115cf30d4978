"""Several chained decode steps per tick (``max_decode_steps``): same tokens, bounded, only in steady decode."""

from __future__ import annotations

from mlxd_engine import Engine, SamplingParams
from mlxd_scheduler import BatchScheduler, Request, SchedulerOptions, TextStream

from .stub_model import VERIFY_PAYS, ByteDetokenizer, as_text, stub_loaded
from .test_batch_scheduler import PROMPTS, Collector, assert_poisoned_row_fails_alone, reference

NO_TIME_CAP = 1e9  # the step-time budget would cap steps by wall time; these tests count steps exactly


def make(loaded, steps: int, **options):
    records = []
    options.setdefault("tick_budget_ms", NO_TIME_CAP)
    scheduler = BatchScheduler(
        Engine(loaded, max_sequences=8), SchedulerOptions(max_decode_steps=steps, **options), records.append
    )
    scheduler.prompt_lookup.cost_model = VERIFY_PAYS  # the verify gate's costs pinned (stub_model.StubCost)
    return scheduler, records


def run_alone(loaded, steps: int, params: SamplingParams, max_tokens: int):
    """One request on PROMPTS[1]: its tokens and the scheduler's tick records."""
    scheduler, records = make(loaded, steps)
    out = Collector()
    scheduler.submit(Request("p", PROMPTS[1], params=params, max_tokens=max_tokens), out.sink("p"))
    scheduler.run_until_idle()
    return out.done("p").tokens, records


def count_submitted_steps(scheduler) -> list[int]:
    submitted = [0]
    real = scheduler.engine.submit_step

    def counting(rows, lookahead=None):
        submitted[0] += 1
        return real(rows, lookahead=lookahead)

    scheduler.engine.submit_step = counting
    return submitted


def run_mixed(steps: int):
    loaded = stub_loaded()
    full = reference(loaded, PROMPTS[3], 40)
    stop = as_text(full[10:13])  # a stop string over three output tokens
    eos_at = reference(loaded, PROMPTS[1], 9)[8]
    eos_loaded = stub_loaded(eos=eos_at)
    out = Collector()
    scheduler, records = make(eos_loaded, steps)
    scheduler.submit(Request("long", PROMPTS[0], max_tokens=45), out.sink("long"))
    scheduler.submit(Request("eos", PROMPTS[1], max_tokens=50), out.sink("eos"))
    scheduler.submit(Request("short", PROMPTS[2], max_tokens=7), out.sink("short"))
    scheduler.submit(
        Request("stop", PROMPTS[3], max_tokens=40, text=TextStream(ByteDetokenizer(), [stop])), out.sink("stop")
    )
    scheduler.run_until_idle()
    finishes = {k: (out.done(k).tokens, out.done(k).finish_reason, out.done(k).text) for k in out.events}
    streamed = {k: out.streamed_tokens(k) for k in out.events}
    return finishes, streamed, records, scheduler


def test_many_steps_per_tick_give_the_same_tokens_as_one():
    one, one_streamed, one_records, _ = run_mixed(1)
    many, many_streamed, many_records, scheduler = run_mixed(8)
    assert many == one and many_streamed == one_streamed
    assert {k: many[k][1] for k in ("eos", "short", "stop")} == {"eos": "stop", "short": "length", "stop": "stop"}
    assert len(many["eos"][0]) == 8 and len(many["short"][0]) == 7
    assert max(r.steps for r in many_records) == 8 and all(r.steps == 1 for r in one_records)
    assert len(many_records) < len(one_records)  # fewer ticks for the same tokens
    # a row's decode action counts the tokens the tick read for it (those of the steps the previous tick
    # submitted): with the first token from prefill they add up to the row's output (and its EOS)
    for request_id, (tokens, reason, _) in many.items():
        counted = sum(
            row.tokens or 1
            for r in many_records
            for row in r.rows
            if row.request_id == request_id and row.action == "decode"
        )
        assert counted + 1 - len(tokens) in ((0, 1) if reason == "stop" else (0,))  # an EOS is read, not output
    assert scheduler.engine.storage.free_slots == 8


def test_steps_never_pass_max_tokens():
    loaded = stub_loaded()
    totals, ticks = {}, {}
    for steps in (1, 8):
        scheduler, records = make(loaded, steps)
        submitted = count_submitted_steps(scheduler)
        out = Collector()
        scheduler.submit(Request("a", PROMPTS[0], max_tokens=77), out.sink("a"))
        scheduler.run_until_idle()
        assert out.done("a").tokens == reference(loaded, PROMPTS[0], 77)
        totals[steps], ticks[steps] = submitted[0], len(records)
    # the first token comes from prefill, so 76 decode steps are needed; a pipelined run submits at most
    # one more (the step in flight when the last token is read), however many steps its ticks chain
    assert totals[1] <= 77 and totals[8] == totals[1]
    assert ticks[8] < ticks[1] / 4


def test_one_step_per_tick_while_a_prompt_waits_or_prefills():
    loaded = stub_loaded()
    scheduler, records = make(loaded, 8, prefill_chunk=2)
    out = Collector()
    scheduler.submit(Request("a", PROMPTS[0], max_tokens=300), out.sink("a"))
    for _ in range(5):
        scheduler.tick()
    assert records[-1].steps > 1
    scheduler.submit(Request("b", PROMPTS[1], max_tokens=10), out.sink("b"))  # 8 prompt tokens: 4 chunks
    while scheduler.has_work:
        record = scheduler.tick()
        if record is not None and any(
            r.request_id == "b" and r.action in ("prefill", "first-token") for r in record.rows
        ):
            assert record.steps == 1
    assert out.done("a").tokens == reference(loaded, PROMPTS[0], 300)
    assert out.done("b").tokens == reference(loaded, PROMPTS[1], 10)


def test_a_sampler_with_row_state_keeps_one_step_per_tick():
    loaded = stub_loaded()
    params = SamplingParams(repetition_penalty=1.3)
    outputs = {}
    for steps in (1, 8):
        outputs[steps], records = run_alone(loaded, steps, params, 25)
        assert all(r.steps == 1 for r in records)
    assert outputs[8] == outputs[1]


def test_a_failing_row_fails_alone_with_many_steps():
    loaded = stub_loaded()
    poison = reference(loaded, PROMPTS[2], 12)[9]  # fed to a step deep inside a tick of several steps
    scheduler, records = make(loaded, 8)
    assert_poisoned_row_fails_alone(scheduler, loaded, PROMPTS[2], poison)
    assert max(r.steps for r in records) > 1


def test_prompt_lookup_rows_with_many_steps_equal_plain_and_still_verify():
    from mlxd_drafters import PromptLookupConfig
    from mlxd_scheduler import SpeculativeRequest

    from .test_prompt_lookup_arm import PLAIN, REPEATING

    loaded = stub_loaded(period=6)
    outputs, accepted, chained = {}, {}, {}
    for enabled in (False, True):
        scheduler, records = make(loaded, 8, prompt_lookup=PromptLookupConfig())
        out = Collector()
        scheduler.submit(
            Request("copy", REPEATING, max_tokens=65, speculative=SpeculativeRequest(enabled)), out.sink("copy")
        )
        scheduler.submit(
            Request("plain", PLAIN, max_tokens=65, speculative=SpeculativeRequest(enabled)), out.sink("plain")
        )
        scheduler.run_until_idle()
        outputs[enabled] = (out.done("copy").tokens, out.done("plain").tokens)
        accepted[enabled] = out.done("copy").timings.get("draft_n_accepted", 0)
        chained[enabled] = max(r.steps for r in records)
    assert outputs[True] == outputs[False]
    assert accepted[True] > 30  # chaining where no drafter has a match leaves the copy's rounds alone
    assert chained[False] == 8


def test_gate_declined_ticks_chain_steps():
    from mlxd_drafters import PromptLookupConfig

    from .test_prompt_lookup_arm import REPEATING

    loaded = stub_loaded(period=6)
    scheduler, records = make(loaded, 8, prompt_lookup=PromptLookupConfig(), prompt_lookup_max_batch=1)
    out = Collector()
    scheduler.submit(Request("a", REPEATING, max_tokens=60), out.sink("a"))
    scheduler.submit(Request("b", REPEATING, max_tokens=60), out.sink("b"))
    scheduler.run_until_idle()
    declined = [r for r in records if any(x.detail == "declined-gate" for x in r.rows)]
    assert declined and max(r.steps for r in declined) > 1
    assert out.done("a").tokens == out.done("b").tokens == reference(loaded, REPEATING, 60)


def test_a_drafting_row_without_matches_backs_off_to_many_steps():
    from mlxd_drafters import PromptLookupConfig

    loaded = stub_loaded()  # no period: the output never repeats, so the drafter never has a match
    scheduler, records = make(loaded, 8, prompt_lookup=PromptLookupConfig())
    out = Collector()
    scheduler.submit(Request("p", PROMPTS[0], max_tokens=80), out.sink("p"))
    scheduler.run_until_idle()
    steps = [r.steps for r in records if r.pipelined]
    assert steps[:4] == [1, 2, 4, 8] and max(steps) == 8
    assert out.done("p").tokens == reference(loaded, PROMPTS[0], 80)


def test_logit_bias_and_seeded_sampling_chain_steps_with_the_same_tokens():
    loaded = stub_loaded()
    banned = reference(loaded, PROMPTS[1], 6)[3]
    for params in (
        SamplingParams(logit_bias=((banned, -100.0),)),
        SamplingParams(temperature=0.8, seed=7),
        SamplingParams(temperature=0.8, seed=7, top_k=5),
    ):
        outputs = {}
        for steps in (1, 8):
            outputs[steps], records = run_alone(loaded, steps, params, 40)
            if steps == 8:
                assert max(r.steps for r in records) > 1
        assert outputs[8] == outputs[1]
        if params.logit_bias:
            assert banned not in outputs[1]  # the bias acted (the plain greedy reply has it)


def test_plain_step_by_batch_size_is_a_median_of_steady_ticks():
    """The verify gate's plain step per batch size: nothing before three steady ticks, then the lower median
    of the recent ones, so a few slow ticks after the batch changed do not price plain decode."""
    from mlxd_scheduler.decode import DecodeLoop

    loop = DecodeLoop(engine=None)
    loop._measure_batch(7, 6.0)  # a batch size's first ticks after a row left (a gap in the slots)
    loop._measure_batch(7, 5.0)
    assert 7 not in loop.step_ms_by_rows  # the gate prices 7 rows from the nearest measured size meanwhile
    for ms in (1.2, 1.1, 1.3):
        loop._measure_batch(7, ms)
    assert loop.step_ms_by_rows[7] == 1.3


def test_ticks_beside_a_prefill_do_not_measure_the_plain_step():
    """A request prefilled while others decode: the steps' time includes the prefill, so the scheduler keeps
    those ticks out of the gate's plain step by batch size."""
    loaded = stub_loaded()
    scheduler, _ = make(loaded, 1)
    out = Collector()
    scheduler.submit(Request("a", PROMPTS[0], max_tokens=30), out.sink("a"))
    measured = []
    real = scheduler.decode_loop._measure_batch
    scheduler.decode_loop._measure_batch = lambda rows, ms: (
        measured.append((rows, bool(scheduler.prefilling))),
        real(rows, ms),
    )
    for _ in range(8):
        scheduler.tick()
    scheduler.submit(Request("b", PROMPTS[1], max_tokens=30), out.sink("b"))
    scheduler.run_until_idle()
    assert measured and not any(prefilling for _, prefilling in measured)
