"""Short CI variant of scripts/soak.py: ~20 s at concurrency 8 on stories260K (completion routes only)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.daemon.conftest import ROOT, STORIES

pytestmark = pytest.mark.skipif(not STORIES.is_dir(), reason=f"{STORIES} is not present")


@pytest.mark.slow
def test_soak_short(tmp_path):
    if not STORIES.is_dir():
        pytest.skip("stories260K is not present")
    spec = importlib.util.spec_from_file_location("soak", ROOT / "scripts" / "soak.py")
    soak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(soak)
    out = tmp_path / "soak.json"
    code = soak.main(
        [
            "-m",
            str(STORIES),
            "--no-chat",
            "--duration",
            "20",
            "--concurrency",
            "8",
            "--timeout",
            "30",
            "--out",
            str(out),
        ]
    )
    summary = json.loads(out.read_text())
    print(json.dumps(summary, indent=2))
    assert code == 0, summary["failures"]
    assert summary["errors"] == 0 and summary["hung"] == 0
    assert summary["completed"] + summary["cancelled_on_purpose"] == summary["requests_sent"] > 0
    assert summary["cancelled_on_purpose"] > 0
    assert summary["fds_end"] <= summary["fds_start"] + 8
