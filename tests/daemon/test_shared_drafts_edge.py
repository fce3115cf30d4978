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
