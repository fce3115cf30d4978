"""Structured output in the batch (embedded model): constrained and free rows share ticks, each equal to
its run alone, with prompt lookup on and off; constrained rows never run ahead of their read tokens."""

from __future__ import annotations

import json
from dataclasses import replace

import jsonschema
import pytest

from mlxd_drafters import PromptLookupConfig
from mlxd_engine import Engine, SamplingParams, compile_grammar
from mlxd_scheduler import BatchScheduler, Request, SchedulerOptions, SpeculativeRequest

from .test_batch_scheduler import Collector

SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["user", "tags"],
    "properties": {
        "user": {
            "type": "object",
            "additionalProperties": False,
            "required": ["name", "id"],
            "properties": {"name": {"type": "string", "maxLength": 12}, "id": {"type": "integer"}},
        },
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
    },
}
TEXTS = [
    "Return JSON: " + json.dumps(SCHEMA),
    "Copy this: the cat sat on the mat and the cat sat.",
    'Return JSON: {"user": {"name": "Ann", "id": 7}, "tags": ["red"]}',
    "Once upon a time there was a dog.",
]


def requests(loaded, speculative: bool) -> list[Request]:
    grammar = compile_grammar(loaded, "json_schema", json.dumps(SCHEMA))
    built = []
    for i, text in enumerate(TEXTS * 2):  # eight rows: even ones constrained, odd ones free
        params = SamplingParams(grammar=grammar) if i % 2 == 0 else SamplingParams()
        prompt = loaded.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        built.append(
            Request(f"r{i}", list(prompt), params, max_tokens=48, speculative=SpeculativeRequest(enabled=speculative))
        )
    return built


def run(loaded, batch: list[Request], max_batch: int) -> tuple[dict, list]:
    records = []
    options = SchedulerOptions(max_batch=max_batch, prompt_lookup=PromptLookupConfig(), prompt_lookup_max_batch=8)
    scheduler = BatchScheduler(Engine(loaded, max_sequences=8), options, records.append)
    out = Collector()
    for request in batch:
        scheduler.submit(replace(request), out.sink(request.request_id))
    scheduler.run_until_idle()
    return {request.request_id: out.done(request.request_id) for request in batch}, records


@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "prompt-lookup"])
def test_mixed_batch_rows_equal_their_runs_alone(embedded_model, speculative):
    batch = requests(embedded_model, speculative)
    together, records = run(embedded_model, batch, max_batch=8)
    assert max(record.batch for record in records) >= 4  # the rows really shared ticks
    for request in batch:
        alone, _ = run(embedded_model, [request], max_batch=1)
        assert together[request.request_id].tokens == alone[request.request_id].tokens, request.request_id
    for i, request in enumerate(batch):
        done = together[request.request_id]
        if i % 2 == 0 and done.finish_reason == "stop":
            jsonschema.validate(json.loads(embedded_model.tokenizer.decode(done.tokens)), SCHEMA)
    assert sum(together[r.request_id].finish_reason == "stop" for r in batch[::2]) >= 3


def test_prompt_lookup_output_equals_plain_for_constrained_rows(embedded_model):
    plain, _ = run(embedded_model, requests(embedded_model, False)[::2], max_batch=8)
    speculative, records = run(embedded_model, requests(embedded_model, True)[::2], max_batch=8)
    assert {key: done.tokens for key, done in plain.items()} == {key: done.tokens for key, done in speculative.items()}
    assert any(row.action == "verify" and row.accepted for record in records for row in record.rows)
    assert all(done.timings.get("draft_kind") == "prompt-lookup" for done in speculative.values())


def test_a_constrained_row_joining_pipelined_rows_tears_the_lookahead_down(embedded_model):
    free, constrained = requests(embedded_model, False)[1], requests(embedded_model, False)[0]
    free = replace(free, ignore_eos=True, max_tokens=60)  # long enough to decode beside the constrained row
    records = []
    scheduler = BatchScheduler(
        Engine(embedded_model, max_sequences=8), SchedulerOptions(max_decode_steps=1), records.append
    )
    out = Collector()
    scheduler.submit(replace(free), out.sink(free.request_id))
    for _ in range(4):
        scheduler.tick()
    assert records[-1].pipelined  # the free row pipelines alone
    scheduler.submit(replace(constrained), out.sink(constrained.request_id))
    scheduler.run_until_idle()
    both_decoding = [record for record in records if record.batch == 2]
    assert both_decoding and not any(record.pipelined for record in both_decoding)
    for request in (free, constrained):
        alone, _ = run(embedded_model, [request], max_batch=1)
        assert out.done(request.request_id).tokens == alone[request.request_id].tokens
