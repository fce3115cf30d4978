"""The prompt-lookup arm of the decode tick, on stub models: exactness, lookahead rules, gate, errors."""

from __future__ import annotations

import dataclasses
import time

import pytest

from mlxd_drafters import PromptLookupConfig
from mlxd_engine import Engine
from mlxd_scheduler import BatchScheduler, Request, SchedulerOptions, SpeculativeRequest
from mlxd_scheduler.trace import TickRecord

from .stub_model import VERIFY_PAYS, FastStepCost, StubCost, stub_loaded
from .test_batch_scheduler import Collector

REPEATING = [10, 20, 30, 40, 50, 60, 70]  # the repeat stub replies 20 30 40 50 60 70 20 30 ...
PLAIN = [5, 9, 2, 77]
DEFAULT_CONFIG = PromptLookupConfig()
RARE_PROBES_CONFIG = PromptLookupConfig(probe_interval=10_000)


def make(loaded, config=DEFAULT_CONFIG, **options):
    records = []
    engine = Engine(loaded, max_sequences=options.pop("slots", 8))
    cost = options.pop("cost", VERIFY_PAYS)
    scheduler = BatchScheduler(engine, SchedulerOptions(prompt_lookup=config, **options), records.append)
    scheduler.prompt_lookup.cost_model = cost  # the verify gate's costs pinned (stub_model.StubCost)
    return scheduler, records


def run_one(loaded, prompt, max_tokens, enabled):
    scheduler, records = make(loaded)
    out = Collector()
    scheduler.submit(
        Request("r", prompt, max_tokens=max_tokens, speculative=SpeculativeRequest(enabled)), out.sink("r")
    )
    scheduler.run_until_idle()
    return out.done("r"), records, scheduler


def test_prompt_lookup_output_equals_plain_and_counts_acceptance():
    loaded = stub_loaded(period=6)
    plain, _, _ = run_one(loaded, REPEATING, 65, enabled=False)
    speculative, records, scheduler = run_one(loaded, REPEATING, 65, enabled=True)
    assert speculative.tokens == plain.tokens and len(plain.tokens) == 65
    timings = speculative.timings
    assert timings["draft_kind"] == "prompt-lookup"
    assert timings["draft_n_accepted"] > 40 and timings["draft_n"] >= timings["draft_n_accepted"]
    assert "draft_kind" not in plain.timings
    verify_ticks = [r for r in records if any(x.action == "verify" for x in r.rows)]
    assert len(verify_ticks) < 20  # 65 tokens in far fewer ticks
    # a round always checks at least one draft (with one token left, a plain step gives it)
    assert all(x.drafted >= 1 for r in records for x in r.rows if x.action == "verify")
    assert scheduler.totals["draft_accepted"] == timings["draft_n_accepted"]


def test_plain_row_keeps_getting_a_token_every_tick_beside_a_verifying_row():
    loaded = stub_loaded(period=6)
    scheduler, records = make(loaded, prompt_lookup_max_batch=4)
    out = Collector()
    scheduler.submit(Request("pl", REPEATING, max_tokens=80), out.sink("pl"))
    scheduler.submit(Request("plain", PLAIN, max_tokens=30, speculative=SpeculativeRequest(False)), out.sink("plain"))
    scheduler.run_until_idle()
    both = [
        r
        for r in records
        if any(x.action == "verify" for x in r.rows)
        and not any(x.request_id == "plain" and x.action in ("first-token", "finished") for x in r.rows)
        and any(x.request_id == "plain" for x in r.rows)
    ]
    assert both, "the two rows never decoded side by side"
    for record in both:
        assert any(x.request_id == "plain" and x.action == "decode" for x in record.rows)
    solo, _, _ = run_one(loaded, PLAIN, 30, enabled=False)
    assert out.done("plain").tokens == solo.tokens


def test_lookahead_rules_with_the_flag_on():
    loaded = stub_loaded()  # the sum stub: its replies rarely repeat a 3-gram
    no_match = PromptLookupConfig(min_ngram=3, max_ngram=4)
    scheduler, records = make(loaded, no_match)
    scheduler.submit(Request("a", PLAIN, max_tokens=30), Collector().sink("a"))
    scheduler.run_until_idle()
    decode_ticks = [r for r in records if any(x.action == "decode" for x in r.rows)]
    assert decode_ticks and all(r.pipelined for r in decode_ticks)  # rule 3: nobody proposes, pipelined

    loaded = stub_loaded(period=6)
    scheduler, records = make(loaded)
    scheduler.submit(Request("b", REPEATING, max_tokens=40), Collector().sink("b"))
    in_flight_after = []
    while scheduler.has_work:
        record = scheduler.tick()
        in_flight_after.append((record, scheduler.decode_loop.pipelined))
    verify = [(r, f) for r, f in in_flight_after if r and any(x.action == "verify" for x in r.rows)]
    assert verify
    for _record, in_flight in verify:
        assert not in_flight  # rule 4: no prime was submitted behind a verify tick


def test_reprime_after_proposals_stop():
    loaded = stub_loaded(period=6)
    scheduler, records = make(loaded, PromptLookupConfig(policy="always"))
    scheduler.submit(Request("c", REPEATING, max_tokens=120), Collector().sink("c"))  # still decoding after 6 ticks
    for _ in range(6):
        scheduler.tick()
    state = scheduler.decoding[0]
    assert state.drafter.stats.verify_rounds > 0
    loaded.model.period = None  # the reply stops repeating: proposals stop matching, then stop coming
    ticks = []
    while scheduler.has_work:
        record = scheduler.tick()
        if record is not None:
            ticks.append((record, scheduler.decode_loop.pipelined, state.drafter.pipelines_plain_rounds()))
    # once the drafter says pipelining is safe, a prime is submitted and later ticks are pipelined again
    assert any(in_flight for _, in_flight, _ in ticks)
    assert any(r.pipelined for r, _, _ in ticks)


def test_gate_declines_above_max_batch_without_misses():
    loaded = stub_loaded(period=6)
    scheduler, records = make(loaded, prompt_lookup_max_batch=1, max_decode_steps=1)  # many ticks to watch
    out = Collector()
    scheduler.submit(Request("a", REPEATING, max_tokens=30), out.sink("a"))
    scheduler.submit(Request("b", REPEATING, max_tokens=30), out.sink("b"))
    ticks_with_both = 0
    while scheduler.has_work:
        pair = [s for s in scheduler.decoding if s.drafter is not None]
        before = [(s.drafter.stats.verify_rounds, s.drafter.stats.misses, s.drafter.stats.proposals) for s in pair]
        scheduler.tick()
        if len(pair) == 2:
            ticks_with_both += 1
            after = [(s.drafter.stats.verify_rounds, s.drafter.stats.misses, s.drafter.stats.proposals) for s in pair]
            assert after == before  # above the gate: no round, no miss, no proposal
    assert ticks_with_both > 5
    gate = [x for r in records for x in r.rows if x.detail == "declined-gate"]
    assert gate and scheduler.prompt_lookup.counters["declined_gate"] > 0
    assert out.done("a").tokens == out.done("b").tokens  # same prompt, same greedy text


def test_verify_failure_fails_only_that_row():
    loaded = stub_loaded(period=6)
    scheduler, _ = make(loaded, prompt_lookup_max_batch=4)
    out = Collector()
    scheduler.submit(Request("bad", REPEATING, max_tokens=40), out.sink("bad"))
    scheduler.submit(Request("good", PLAIN, max_tokens=40, speculative=SpeculativeRequest(False)), out.sink("good"))
    real_verify = scheduler.engine.verify_rows

    def failing_verify(rows, token_lists):
        if any(seq is scheduler.by_id["bad"].seq for seq in rows):
            raise RuntimeError("injected verify failure")
        return real_verify(rows, token_lists)

    scheduler.engine.verify_rows = failing_verify
    scheduler.run_until_idle()
    assert out.done("bad").finish_reason == "error" and "injected" in out.done("bad").error
    solo, _, _ = run_one(loaded, PLAIN, 40, enabled=False)
    assert out.done("good").tokens == solo.tokens
    assert scheduler.engine.storage.free_slots == 8


def test_max_tokens_truncation_and_per_request_max_draft():
    loaded = stub_loaded(period=6)
    for max_tokens in (1, 2, 5, 13):
        speculative, _, _ = run_one(loaded, REPEATING, max_tokens, enabled=True)
        assert len(speculative.tokens) == max_tokens and speculative.finish_reason == "length"
    scheduler, records = make(loaded, PromptLookupConfig(max_draft=8))
    scheduler.submit(
        Request("d", REPEATING, max_tokens=40, speculative=SpeculativeRequest(True, max_draft=2)), Collector().sink("d")
    )
    scheduler.run_until_idle()
    drafted = [x.drafted for r in records for x in r.rows if x.action == "verify"]
    assert drafted and max(drafted) <= 2


def test_ineligible_request_decodes_plainly():
    from mlxd_engine import SamplingParams

    loaded = stub_loaded(period=6)
    scheduler, records = make(loaded)
    out = Collector()
    scheduler.submit(Request("lp", REPEATING, SamplingParams(logprobs=2), max_tokens=20), out.sink("lp"))
    scheduler.run_until_idle()
    assert "draft_kind" not in out.done("lp").timings
    assert not any(x.action == "verify" for r in records for x in r.rows)


def test_rows_still_in_prefill_count_toward_the_gate():
    # a burst of admissions: the first row decodes while the second's long prompt is still prefilling
    loaded = stub_loaded(period=6)
    scheduler, records = make(loaded, prompt_lookup_max_batch=1, prefill_chunk=4)
    out = Collector()
    scheduler.submit(Request("a", REPEATING, max_tokens=30), out.sink("a"))
    scheduler.submit(Request("b", REPEATING * 6, max_tokens=30), out.sink("b"))
    gated_while_b_prefills = 0
    while scheduler.has_work:
        b_prefilling = any(s.request_id == "b" for s in scheduler.prefilling)
        record = scheduler.tick()
        a_rows = [x for x in (record.rows if record else []) if x.request_id == "a"]
        if b_prefilling and any(x.action == "decode" for x in a_rows):
            assert not any(x.action == "verify" for x in a_rows)
            assert any(x.detail == "declined-gate" for x in a_rows)
            gated_while_b_prefills += 1
    assert gated_while_b_prefills >= 3
    assert [x for r in records for x in r.rows if x.action == "verify"]  # alone, each row verifies


def run_with_cost(loaded, cost, config=RARE_PROBES_CONFIG, prompts=None, max_tokens=40):
    scheduler, records = make(loaded, config)
    scheduler.prompt_lookup.cost_model = cost
    out = Collector()
    prompts = prompts or {"a": (REPEATING, True), "b": (REPEATING[2:] + REPEATING, True), "plain": (PLAIN, False)}
    for name, (prompt, speculative) in prompts.items():
        scheduler.submit(
            Request(name, prompt, max_tokens=max_tokens, speculative=SpeculativeRequest(speculative)), out.sink(name)
        )
    scheduler.run_until_idle()
    return scheduler, records, out


def test_the_cost_gate_verifies_nothing_where_the_gain_does_not_pay_and_records_no_miss():
    """Every query token costs as much as a whole step: a verify round of 1 + 8 tokens costs 9 steps and is
    expected to gain far fewer, so no round runs, no miss is recorded, and output equals plain decode."""
    loaded = stub_loaded(period=6)
    scheduler, records, out = run_with_cost(loaded, StubCost(fixed=0.0, per_token=1.0))
    assert not [x for r in records for x in r.rows if x.action == "verify"]
    counters = scheduler.prompt_lookup.counters
    assert counters["verify_rounds"] == 0 and counters["declined_cost"] > 0
    assert any(x.detail == "declined-cost" for r in records for x in r.rows)
    for name, prompt in (("a", REPEATING), ("b", REPEATING[2:] + REPEATING), ("plain", PLAIN)):
        alone, _, _ = run_one(loaded, prompt, 40, enabled=False)
        assert out.done(name).tokens == alone.tokens
        assert out.done(name).timings.get("draft_n", 0) == 0


def test_the_cost_gate_verifies_where_the_gain_pays_padding_the_plain_row_into_one_forward():
    """A forward's cost is nearly all fixed (as on a GPU): verifying pays, and the plain row rides in the
    verify forward (padded layout: one forward per tick for every row). Output equals plain decode."""
    loaded = stub_loaded(period=6)
    forwards = []
    scheduler, records = make(loaded, PromptLookupConfig(probe_interval=10_000))
    scheduler.prompt_lookup.cost_model = StubCost(fixed=10.0, per_token=0.01)
    out = Collector()
    prompts = {"a": REPEATING, "b": REPEATING[2:] + REPEATING, "plain": PLAIN}
    for name, prompt in prompts.items():
        scheduler.submit(
            Request(name, prompt, max_tokens=40, speculative=SpeculativeRequest(name != "plain")), out.sink(name)
        )
    while scheduler.has_work:
        before = loaded.model.forward_calls
        record = scheduler.tick()
        if record is not None:
            forwards.append((record, loaded.model.forward_calls - before))
    counters = scheduler.prompt_lookup.counters
    assert counters["verify_rounds"] > 0 and counters["padded_forwards"] > 0
    padded = [
        n
        for record, n in forwards
        if any(x.action == "verify" for x in record.rows)
        and any(x.request_id == "plain" and x.action == "decode" for x in record.rows)
        and not any(x.action in ("prefill", "first-token") for x in record.rows)
    ]
    assert padded and min(padded) == 1  # a tick where the plain row decoded beside a verify in one forward
    for name, prompt in prompts.items():
        alone, _, _ = run_one(loaded, prompt, 40, enabled=False)
        assert out.done(name).tokens == alone.tokens


def test_the_cost_gate_at_one_row_decides_whether_a_round_is_worth_a_forward():
    loaded = stub_loaded(period=6)
    alone = {"a": (REPEATING, True)}
    _, costly, _ = run_with_cost(loaded, StubCost(fixed=0.0, per_token=1.0), prompts=alone)
    _, cheap, _ = run_with_cost(loaded, StubCost(fixed=10.0, per_token=0.01), prompts=alone)
    assert not [x for r in costly for x in r.rows if x.action == "verify"]
    assert [x for r in cheap for x in r.rows if x.action == "verify"]


def test_rows_whose_drafts_the_cost_gate_declines_keep_pipelining():
    loaded = stub_loaded(period=6)
    scheduler, records, out = run_with_cost(loaded, StubCost(fixed=0.0, per_token=1.0), max_tokens=60)
    both = [r for r in records if {x.request_id for x in r.rows if x.action == "decode"} >= {"a", "b"}]
    assert len(both) > 5 and sum(r.pipelined for r in both) >= len(both) - 2


@pytest.mark.parametrize("long_match", [False, True], ids=["short-match", "long-match"])
def test_a_row_the_cost_gate_keeps_declining_pauses_its_drafter_and_is_looked_at_now_and_then(long_match, monkeypatch):
    """Declines record nothing, so a row the gate turns down could never show it copies: once the gate has
    declined it for ``EXPLORE_AFTER_DECLINED_TOKENS`` tokens running its next proposal is checked anyway (by
    the steps in flight or a verify round: either way its governor learns). Between declines the row's
    drafter pauses for ``DECLINE_PAUSE_TOKENS`` tokens, or, where its draft continued a long match, is
    asked again at the next token (copying rows then meet in one verify). Output equals plain decode."""
    from mlxd_drafters import PromptLookupDrafter
    from mlxd_drafters.pacing import DECLINE_PAUSE_TOKENS, EXPLORE_AFTER_DECLINED_TOKENS

    monkeypatch.setattr(PromptLookupDrafter, "last_match_is_long", property(lambda self: long_match))
    loaded = stub_loaded(period=6)
    scheduler, records, out = run_with_cost(
        loaded,
        StubCost(fixed=0.0, per_token=1.0),
        config=PromptLookupConfig(probe_interval=10_000),
        prompts={"a": (REPEATING, True)},
        max_tokens=400,
    )
    assert scheduler.prompt_lookup.counters["declined_cost"] >= 4
    declined_at, looked_at = [], []  # looks: the row's ticks that left the pipeline after its first decline
    emitted = 0
    for record in records:
        for x in record.rows:
            if x.request_id == "a" and x.action in ("decode", "verify"):
                if x.detail == "declined-cost":
                    declined_at.append(emitted)
                elif declined_at and not record.pipelined:
                    looked_at.append(emitted)
                emitted += (x.tokens or 1) if x.action == "decode" else x.accepted + 1
    gaps = [b - a for a, b in zip(declined_at, declined_at[1:])]
    if long_match:
        assert gaps and min(gaps) <= 2  # asked again at once (a pipelined tick may chain a second step)
    else:
        assert gaps and min(gaps) >= DECLINE_PAUSE_TOKENS[0]  # a paused drafter proposes nothing in between
    # the look at a loss once the row has been declined long enough (less a tick's chained steps), not before
    assert looked_at and looked_at[0] - declined_at[0] >= EXPLORE_AFTER_DECLINED_TOKENS - 8
    assert out.done("a").tokens == run_one(loaded, REPEATING, 400, enabled=False)[0].tokens


def test_a_logprobs_row_keeps_its_logprobs_beside_a_verifying_row():
    """Ticks the arm runs (verify rounds, teardowns, synchronous steps) still report every token's logprobs."""
    from mlxd_engine import SamplingParams
    from mlxd_scheduler.request import TokenEvent

    loaded = stub_loaded(period=6)
    for steps in (1, 8):
        scheduler, records = make(loaded, prompt_lookup_max_batch=4, max_decode_steps=steps)
        out = Collector()
        scheduler.submit(Request("pl", REPEATING, max_tokens=60), out.sink("pl"))
        scheduler.submit(Request("lp", REPEATING, SamplingParams(logprobs=2), max_tokens=40), out.sink("lp"))
        scheduler.run_until_idle()
        assert any(x.action == "verify" for r in records for x in r.rows)
        events = [e for e in out.events["lp"] if isinstance(e, TokenEvent)]
        assert all(e.logprobs is not None and len(e.logprobs) == len(e.tokens) for e in events)
        assert len(out.streamed_tokens("lp")) == 40


@pytest.mark.parametrize(
    "cost, turns_off",
    [(StubCost(fixed=10.0, per_token=0.01), True), (StubCost(fixed=1.0, per_token=0.3), False)],
    ids=["governor-off-probes", "gate-declines-explores"],
)
def test_a_row_whose_drafts_failed_recovers_when_it_starts_copying(cost, turns_off):
    """In the batched scheduler, beside a plain row: the stub first answers with the sum rule (drafts fail),
    then from context position ``copy_from`` on it copies. Where verifying is cheap the governor turns off
    and its probes (verified whatever the gate estimates) turn it back on; where it is dearer the gate
    declines the failing row and its now-and-then verify sees the copying. Either way full-size drafts are
    accepted again, and output equals plain decode."""
    prompt = REPEATING * 3
    copy_from = len(prompt) + 70
    loaded = stub_loaded(period=6, copy_from=copy_from, sum_mod=13)  # the sum rule's tokens recur: drafts, failing
    config = PromptLookupConfig(probe_interval=4)
    # one step a tick: how many steps a tick chains follows the measured step time, and with it where the
    # drafter looks; pinned, the run is the same on a loaded machine
    scheduler, records = make(loaded, config, max_decode_steps=1)
    scheduler.prompt_lookup.cost_model = cost
    out = Collector()
    scheduler.submit(Request("pl", prompt, max_tokens=200, speculative=SpeculativeRequest(True)), out.sink("pl"))
    scheduler.submit(Request("plain", PLAIN, max_tokens=200, speculative=SpeculativeRequest(False)), out.sink("plain"))
    scheduler.run_until_idle()
    plain, _, _ = run_one(loaded, prompt, 200, enabled=False)
    assert out.done("pl").tokens == plain.tokens
    rows = [x for r in records for x in r.rows if x.request_id == "pl"]
    held = "declined-governor" if turns_off else "declined-cost"
    failing = [i for i, x in enumerate(rows) if x.detail == held]
    assert len(failing) >= 4, f"the row was never {held} while it did not copy"
    verifies = [x for x in rows[failing[0] :] if x.action == "verify"]
    if turns_off:
        assert [x for x in verifies if x.drafted == config.probe_budget], "no probe after the governor turned off"
    recovered = [x for x in rows[failing[0] :] if x.action == "verify" and x.accepted >= 5]
    assert recovered, "no long accepted run after the failures: the row never drafted again"


def test_proposing_rows_verify_together_in_one_forward():
    """Two copying rows at different positions: a tick where both verify runs one forward for both
    (verify_rows), and each row's output equals it decoded alone."""
    loaded = stub_loaded(period=6)
    scheduler, records = make(loaded, prompt_lookup_max_batch=4)
    out = Collector()
    scheduler.submit(Request("a", REPEATING, max_tokens=60), out.sink("a"))
    scheduler.submit(Request("b", REPEATING[2:] + REPEATING, max_tokens=60), out.sink("b"))
    forwards = []
    while scheduler.has_work:
        before = loaded.model.forward_calls
        record = scheduler.tick()
        if record is not None:
            forwards.append((record, loaded.model.forward_calls - before))
    both = [n for record, n in forwards if {x.request_id for x in record.rows if x.action == "verify"} == {"a", "b"}]
    assert both and all(n == 1 for n in both), both
    for name, prompt in (("a", REPEATING), ("b", REPEATING[2:] + REPEATING)):
        alone, _, _ = run_one(loaded, prompt, 60, enabled=False)
        assert out.done(name).tokens == alone.tokens


def test_long_drafts_are_cut_beside_other_rows_and_whole_for_a_lone_row():
    """Drafts of up to ``max_draft`` (15) tokens: a lone copying row verifies them whole; while another row
    decodes beside it the gate cuts them to ``MAX_BATCHED_WIDTH`` (the rest is not verified, no miss).
    Output equals plain decode either way."""
    from mlxd_scheduler.tick_plan import MAX_BATCHED_WIDTH

    loaded = stub_loaded(period=20)  # the reply repeats the prompt's last 20 tokens: matches run 19 tokens
    prompt = list(range(10, 31))
    alone, records, _ = run_one(loaded, prompt, 80, enabled=True)
    assert max(x.drafted for r in records for x in r.rows if x.action == "verify") == 15
    scheduler, records = make(loaded)
    out = Collector()
    scheduler.submit(Request("a", prompt, max_tokens=80), out.sink("a"))
    scheduler.submit(Request("b", PLAIN, max_tokens=200, speculative=SpeculativeRequest(False)), out.sink("b"))
    scheduler.run_until_idle()
    beside = [
        x.drafted
        for r in records
        if any(y.request_id == "b" and y.action == "decode" for y in r.rows)
        for x in r.rows
        if x.action == "verify"
    ]
    assert beside and max(beside) <= MAX_BATCHED_WIDTH - 1
    assert out.done("a").tokens == alone.tokens == run_one(loaded, prompt, 80, enabled=False)[0].tokens


def test_a_predicted_output_drafts_first_and_never_changes_the_output(embedded_model):
    """OpenAI's predicted outputs: the row's drafter looks in the prediction first. With the exact reply as
    prediction nearly every token is an accepted draft; with one line changed the reply still equals plain
    decode, and the counts say how much of the prediction was used."""
    prompt = embedded_model.tokenizer.encode("Once upon a time, in a small village by the sea, there lived")
    scheduler, _ = make(embedded_model, config=None)
    out = Collector()
    scheduler.submit(Request("plain", prompt, max_tokens=48, ignore_eos=True), out.sink("plain"))
    scheduler.run_until_idle()
    plain = out.done("plain")
    edited = list(plain.tokens)
    edited[20] = (edited[20] + 7) % embedded_model.vocab_size
    for prediction in (list(plain.tokens), edited):
        scheduler, records = make(embedded_model, config=None)  # prompt lookup off by default: the prediction asks
        out = Collector()
        scheduler.submit(Request("p", prompt, max_tokens=48, prediction=prediction, ignore_eos=True), out.sink("p"))
        scheduler.run_until_idle()
        done = out.done("p")
        assert done.tokens == plain.tokens
        accepted = done.usage["accepted_prediction_tokens"]
        assert accepted + done.usage["rejected_prediction_tokens"] == len(prediction)
        assert accepted >= len(plain.tokens) - 12, done.usage
        verifies = [x for r in records for x in r.rows if x.action == "verify"]
        assert len(verifies) < 16


def test_in_the_fast_step_regime_a_long_exact_copy_is_verified():
    """Plain steps are cheap and chained, a verify tick pays a synchronous overhead of five of them: the
    prior a fresh draft gets does not pay for a verify, so the gate declines the first drafts. Each declined
    draft is scored against the tokens that follow it (all of them match: the reply copies), the governor's
    estimate rises to what the row accepts, and the rest of the reply is verified in long rounds. Output
    equals plain decode."""
    loaded = stub_loaded(period=6)
    scheduler, records, out = run_with_cost(loaded, FastStepCost(), prompts={"a": (REPEATING, True)}, max_tokens=120)
    verifies = [x for r in records for x in r.rows if x.action == "verify"]
    assert scheduler.prompt_lookup.counters["declined_cost"] >= 1  # the prior alone did not pay
    assert sum(x.accepted for x in verifies) >= 80, verifies  # most of the reply came from verified drafts
    assert out.done("a").tokens == run_one(loaded, REPEATING, 120, enabled=False)[0].tokens


def test_the_exploration_budget_is_a_share_of_wall_time_saved_up_to_a_bound():
    from mlxd_scheduler.prompt_lookup_arm import EXPLORE_SAVED_MS, EXPLORE_SHARE, ExplorationBudget

    budget = ExplorationBudget()
    budget.earn(100.0)
    assert budget.balance_ms == pytest.approx(EXPLORE_SHARE * 100.0)
    budget.earn(1e9)
    assert budget.balance_ms == EXPLORE_SAVED_MS  # nobody explored for a long time: a bounded burst at most
    budget.spend(EXPLORE_SAVED_MS + 30.0)
    assert budget.balance_ms == pytest.approx(-30.0)  # overdrawn: later ticks pay it back first


def test_only_the_update_step_changes_the_rows():
    """The tick is plan -> execute -> update: ``execute`` runs the engine and hands back a ``TickResult``; the
    rows' reported tokens, phase and timings, the verify outcomes their drafters learn, the forward cost
    model and the decode loop's step figures change only when ``BatchScheduler._update`` applies it (the
    forwards' times come back in the result). Output equals plain decode."""
    loaded = stub_loaded(period=6, copy_from=12)  # copies only after a while: some drafts meet a lookahead read
    scheduler, _ = make(loaded)
    out = Collector()
    scheduler.submit(Request("r", REPEATING, max_tokens=60), out.sink("r"))
    scheduler.submit(Request("s", REPEATING[2:], max_tokens=45), out.sink("s"))
    arm = scheduler.prompt_lookup
    run_plan = arm.execute
    executed = []

    def row_state(state):
        timings = dataclasses.astuple(state.timings)
        return (
            state.emitted,
            state.phase,
            timings,
            state.drafter.stats.verify_rounds,
            state.drafter.stats.accepted_tokens,
        )

    def figures():
        cost, loop = scheduler.engine.forward_cost, scheduler.decode_loop
        return (
            cost.spent_ms,
            cost.observations,
            cost.summary(),
            loop.step_ms,
            loop.last_step_ms,
            dict(loop.step_ms_by_rows),
            loop.waited_ms,
            dict(arm.counters),
        )

    def execute(plan, record):
        before = [row_state(s) for s in plan.rows], figures()
        result = run_plan(plan, record)
        after = [row_state(s) for s in plan.rows], figures()
        executed.append((before == after, bool(result.rounds), result.carried is not None, bool(result.forwards)))
        return result

    arm.execute = execute
    scheduler.run_until_idle()
    assert executed and all(unchanged for unchanged, _, _, _ in executed)
    assert any(rounds for _, rounds, _, _ in executed) and any(read for _, _, read, _ in executed)
    assert any(timed for _, _, _, timed in executed)  # verify rounds and synchronous steps were timed ...
    assert scheduler.engine.forward_cost.spent_ms > 0  # ... and the update steps gave them to the cost model
    assert out.done("r").tokens == run_one(loaded, REPEATING, 60, enabled=False)[0].tokens


def test_a_synchronous_step_counts_once_in_the_ticks_forward_time():
    """The verify gate's tick overhead is the tick's wall minus its forwards (``_forward_ms_so_far``): a
    synchronous step's time is in the cost model's ``spent_ms`` (its sample) and not again in the decode
    loop's ``waited_ms``, so forwards never add up to more than the wall they ran in."""
    loaded = stub_loaded(period=6)
    scheduler, _ = make(loaded)
    scheduler.submit(Request("r", REPEATING, max_tokens=40), Collector().sink("r"))
    for _ in range(3):
        scheduler.tick()
    record = TickRecord(tick=0, batch=1, pipelined=False)
    scheduler._update(scheduler.decode_loop.teardown(), record)  # nothing left in flight
    rows = list(scheduler.decoding)
    before = scheduler._forward_ms_so_far()
    started = time.perf_counter()
    result = scheduler.decode_loop.step_synchronously(rows)
    wall = (time.perf_counter() - started) * 1000.0
    scheduler._update(result, record)
    assert result.forwards and result.waited_ms < result.forwards[0].ms
    assert scheduler._forward_ms_so_far() - before <= wall + 1e-6


def test_the_plan_leaves_the_drafters_pacing_to_the_update_step():
    """The plan asks for proposals; its verdicts (declined drafts retracted, rows paused, quiet ticks) reach
    the drafters only through the update step (``DraftVerdicts``), before the row's next tokens are observed.
    The gate declines every draft here, so rows pause and retract; output equals plain decode."""
    loaded = stub_loaded(period=6)
    engine = Engine(loaded, max_sequences=8)
    scheduler = BatchScheduler(engine, SchedulerOptions(prompt_lookup=DEFAULT_CONFIG))
    scheduler.prompt_lookup.cost_model = StubCost(fixed=0.0, per_token=1.0)
    arm = scheduler.prompt_lookup
    out = Collector()
    for name, prompt in (("a", REPEATING), ("b", REPEATING[2:] + REPEATING)):
        scheduler.submit(Request(name, prompt, max_tokens=40), out.sink(name))
    planned = []

    def pacing(plan):
        return [dataclasses.astuple(s.drafter.pacing) for s in plan.rows if s.drafter is not None]

    def watch(plan_call):
        def planning(*args, **kwargs):
            rows = args[0]
            before = [dataclasses.astuple(s.drafter.pacing) for s in rows if s.drafter is not None]
            plan = plan_call(*args, **kwargs)
            planned.append((before == pacing(plan), plan.verdicts))
            return plan

        return planning

    arm.plan, arm.plan_after_read = watch(arm.plan), watch(arm.plan_after_read)
    scheduler.run_until_idle()
    assert planned and all(unchanged for unchanged, _ in planned)
    assert any(verdicts.declined for _, verdicts in planned) and any(verdicts.quiet for _, verdicts in planned)
    assert arm.counters["declined_cost"] > 0 and arm.counters["verify_rounds"] == 0
    for name, prompt in (("a", REPEATING), ("b", REPEATING[2:] + REPEATING)):
        assert out.done(name).tokens == run_one(loaded, prompt, 40, enabled=False)[0].tokens
