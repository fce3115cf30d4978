"""scripts/replay_drafts.py: the one-row gate's cut and the replay of a recording through the real drafter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from replay_drafts import gate_width, replay_style  # noqa: E402


def test_the_gate_cuts_a_draft_to_its_best_width_and_declines_what_does_not_pay():
    assert gate_width(0.99, 12, 0.2, 0.0) == 12  # nearly sure: all of it
    assert 1 <= gate_width(0.7, 12, 0.2, 0.0) < 12  # the tail's expected tokens no longer pay for themselves
    assert gate_width(0.1, 12, 0.2, 0.0) == 0  # a plain step beats it
    assert gate_width(0.7, 12, 0.2, 3.0) == 0  # a round that costs four steps before its draft never pays


def _request(head: list[int], reply: list[int]) -> dict:
    return {"style": "s", "prompt": head, "output": reply}


REPLY = [(31 * i + 7) % 997 + 3 for i in range(48)]  # no n-gram repeats: the request's own lookup finds nothing


def test_the_store_drafts_an_earlier_reply_and_lookup_alone_cannot():
    requests = [_request([1, 2, 3, 4, 5, 6, 7, 8, 9], REPLY), _request([11, 12, 13, 4, 5, 6, 7, 8, 9], REPLY)]
    from mlxd_drafters import SharedStoreConfig

    alone = replay_style(requests, None, 0.2, 0.0, warmup=1)
    store = replay_style(requests, SharedStoreConfig(), 0.2, 0.0, warmup=1)
    assert alone.tokens == store.tokens == len(REPLY)  # the second request only is counted
    assert alone.accepted == 0 and alone.rate <= 1.0  # a plain step a token (and a draft or two that fail)
    assert store.accepted > len(REPLY) // 2 and store.drafted >= store.accepted
    assert store.rate > 2 * alone.rate


def test_record_and_replay_on_the_embedded_model(tmp_path):
    out = tmp_path / "replies.json"
    script = str(ROOT / "scripts" / "replay_drafts.py")
    recorded = subprocess.run(
        [sys.executable, script, "record", "--model", "embedded", "--styles", "extract", "--requests", "3"]
        + ["--max-tokens", "16", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert recorded.returncode == 0, recorded.stderr
    requests = json.loads(out.read_text())["requests"]
    assert len(requests) == 3 and all(r["prompt"] and r["output"] for r in requests)
    replayed = subprocess.run(
        [sys.executable, script, "replay", str(out), "--warmup", "1", "--store-option", "min_probability=0.5"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert replayed.returncode == 0, replayed.stderr
    rows = [line for line in replayed.stdout.splitlines() if line.startswith("| extract |")]
    assert [row.split("|")[2].strip() for row in rows] == ["store", "min_probability=0.5"]
