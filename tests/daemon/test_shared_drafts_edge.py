"""A Generate's shared-draft fields reach the scheduler's request at the daemon's edge."""

from __future__ import annotations

from mlxd_daemon.edge import to_request
from mlxd_protocol import Generate, Sampling


def test_the_opt_out_and_the_key_travel_to_the_request(embedded_model):
    plain = to_request(embedded_model, Generate(id="a", prompt_tokens=[1, 2, 3]), "a", Sampling())
    assert plain.shared_drafts is True and plain.draft_key is None
    message = Generate(id="b", prompt_tokens=[1, 2, 3], shared_drafts=False, draft_key="key-7")
    request = to_request(embedded_model, message, "b", Sampling())
    assert request.shared_drafts is False and request.draft_key == "key-7"


def test_status_reports_the_store_and_the_totals_per_source():
    from mlxd_daemon.local import local_client
    from mlxd_daemon.options import DaemonOptions
    from mlxd_protocol import Speculative

    with local_client(DaemonOptions(model="embedded", max_batch=2)) as client:
        for _ in range(2):
            *_, done = list(
                client.generate(
                    Generate(
                        id="g",
                        prompt_tokens=[5, 6, 7, 8, 9] * 4,
                        max_tokens=24,
                        speculative=Speculative(kind="prompt-lookup"),
                        draft_key="k",
                    )
                )
            )
        status = client.status()
    assert status.memory["shared_drafts"]["stores"] == 1 and status.memory["shared_drafts"]["documents"] == 2
    assert {"draft_tokens_shared", "draft_accepted_shared", "draft_tokens_prompt"} <= set(status.totals)
    assert set(done.timings["draft_sources"]) <= {"prompt", "output", "prediction", "shared"}
    with local_client(DaemonOptions(model="embedded", max_batch=2, shared_drafts=False)) as client:
        assert "shared_drafts" not in client.status().memory
