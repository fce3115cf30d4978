"""The in-process client drives the real scheduler from the caller's thread."""

from __future__ import annotations

from mlxd_engine import Engine
from mlxd_scheduler import BatchScheduler, FinishEvent, InProcessClient, Request, SchedulerOptions, TokenEvent

from .stub_model import stub_loaded
from .test_batch_scheduler import PROMPTS, reference


def test_run_batches_requests_and_matches_solo_runs():
    loaded = stub_loaded()
    records = []
    client = InProcessClient(BatchScheduler(Engine(loaded, max_sequences=4), SchedulerOptions(), records.append))
    results = client.run([Request(str(i), p, max_tokens=12) for i, p in enumerate(PROMPTS)])
    for i, prompt in enumerate(PROMPTS):
        finish = results[str(i)][-1]
        assert isinstance(finish, FinishEvent) and finish.tokens == reference(loaded, prompt, 12)
    assert max(r.batch for r in records) == len(PROMPTS)  # they really ran together


def test_interleaved_iterators_and_early_exit_cancels():
    loaded = stub_loaded()
    scheduler = BatchScheduler(Engine(loaded, max_sequences=2))
    client = InProcessClient(scheduler)
    long_stream = client.generate(Request("long", PROMPTS[0], max_tokens=1000))
    short_stream = client.generate(Request("short", PROMPTS[1], max_tokens=6))
    first = next(long_stream)
    assert isinstance(first, TokenEvent)
    short_events = list(short_stream)
    assert short_events[-1].tokens == reference(loaded, PROMPTS[1], 6)
    long_stream.close()  # the consumer walks away: the request is cancelled and its slot freed
    assert not scheduler.has_work or scheduler.active == 0
    assert scheduler.engine.storage.free_slots == 2
