"""Resolution of the daemon's speculative options, and prompt lookup end to end on a real checkpoint."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mlxd_daemon.speculative import resolve_speculative
from mlxd_drafters import PromptLookupConfig
from mlxd_protocol import Client, Generate, Speculative, new_request_id

from .conftest import STORIES, private_endpoint, start_daemon, stop_daemon

pytestmark = pytest.mark.skipif(not STORIES.is_dir(), reason=f"{STORIES} is not present")


def test_prompt_lookup_alone_uses_documented_defaults():
    dispatch = resolve_speculative("prompt-lookup")
    assert dispatch.enabled and dispatch.kind == "prompt-lookup"
    assert dispatch.config == PromptLookupConfig()
    assert dispatch.summary() == "speculative=prompt-lookup (max_draft=15, policy=graded)"


def test_prompt_lookup_with_a_draft_model_is_an_error():
    with pytest.raises(ValueError, match="prompt-lookup takes no draft model"):
        resolve_speculative("prompt-lookup", draft_model="some/model")


def test_draft_block_size_sets_max_draft():
    assert resolve_speculative("prompt-lookup", draft_block_size=4).config.max_draft == 4
    assert resolve_speculative(None, draft_block_size=4).cap.max_draft == 4


def test_unknown_kind_lists_the_known_ones():
    with pytest.raises(ValueError, match="known kinds: prompt-lookup, none"):
        resolve_speculative("medusa")


def test_disabled_by_default():
    dispatch = resolve_speculative(None)
    assert not dispatch.enabled and dispatch.config is None


def test_mlxd_cli_reports_dispatch_errors():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlxd_daemon",
            "--draft-kind",
            "prompt-lookup",
            "--draft-model",
            "x",
            "--endpoint",
            private_endpoint(),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "prompt-lookup takes no draft model" in result.stderr
    help_text = subprocess.run([sys.executable, "-m", "mlxd_daemon", "--help"], capture_output=True, text=True).stdout
    for flag in ("--draft-kind", "--draft-block-size", "--prompt-lookup-max-batch", "--draft-model"):
        assert flag in help_text


def _generate(endpoint, prompt, speculative=None, max_tokens=200):
    with Client(endpoint, timeout_s=60) as client:
        replies = list(
            client.generate(
                Generate(id=new_request_id(), prompt=prompt, max_tokens=max_tokens, speculative=speculative)
            )
        )
    return replies[-1]


def test_stories_daemon_with_prompt_lookup_returns_the_same_text():
    endpoint = private_endpoint()
    # One step per tick: with chained steps the count per tick follows the measured step time, so where the
    # drafter looks (and whether this short story accepts a draft at all) varies from run to run; the
    # tokens do not (tests/scheduler/test_decode_steps.py holds 1 and 8 steps equal with prompt lookup).
    process = start_daemon(endpoint, "-m", str(STORIES), "--draft-kind", "prompt-lookup", "--decode-steps", "1")
    try:
        for prompt in ("Once upon a time", "Lily and Ben went to the park."):
            on = _generate(endpoint, prompt)
            off = _generate(endpoint, prompt, Speculative(kind="none"))
            assert on.tokens == off.tokens and on.text == off.text
            # whether a draft is verified is the verify gate's call (stories260K's drafts rarely pay for
            # their forward); the tokens are the same either way
            assert on.timings["draft_kind"] == "prompt-lookup"
            assert "draft_kind" not in off.timings
            print(
                f"stories260K {prompt!r}: accepted {on.timings['draft_n_accepted']} of {on.timings['draft_n']} drafted"
            )
        with Client(endpoint, timeout_s=10) as client:
            status = client.status()
        assert status.totals["verify_rounds"] + status.totals["declined_cost"] > 0  # the drafter proposed
        assert status.options["speculative"].startswith("speculative=prompt-lookup")
    finally:
        stop_daemon(process, endpoint)
