"""Conventions the project keeps that a linter does not check: no source file past ``MAX_LINES`` lines
(a file that grows past it is split into modules that each own a part)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE_FOLDERS = ("packages", "daemon", "cli")
MAX_LINES = 500


def test_no_source_file_is_longer_than_max_lines():
    files = [path for folder in SOURCE_FOLDERS for path in (ROOT / folder).rglob("*.py")]
    assert any(path.name == "engine.py" for path in files)  # the walk finds the tree
    too_long = {
        str(path.relative_to(ROOT)): count
        for path in files
        if (count := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not too_long, f"files over {MAX_LINES} lines (split them): {too_long}"
