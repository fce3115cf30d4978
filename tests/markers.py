"""Test kinds, one per test, set by each test directory's conftest (``mark_directory``):

- ``unit``: runs in this process (models built or loaded in it; no other process started);
- ``integration``: starts processes (a daemon, the HTTP gateway, a CLI tool, a child Python), or runs
  parts end to end: HTTP servers and clients over sockets, every mlx-lm architecture through the engine;
- ``slow`` (beside either): end to end on real checkpoints; marked by the test itself.

A test or file that starts a process inside a unit directory says so itself (``pytest.mark.integration``);
its directory's kind then does not apply. ``make test-unit`` runs ``-m unit``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

KINDS = ("unit", "integration")


def _has_kind(item) -> bool:
    return any(item.get_closest_marker(name) for name in KINDS)


def mark_directory(items: list, conftest_file: str, kind: str) -> None:
    """Give ``kind`` to the tests of the conftest's own directory that do not carry a kind already."""
    assert kind in KINDS, kind
    directory = Path(conftest_file).resolve().parent
    for item in items:
        if Path(item.path).resolve().parent != directory:
            continue
        if not _has_kind(item):
            item.add_marker(getattr(pytest.mark, kind))


def check_every_test_has_a_kind(items: list) -> None:
    missing = sorted({str(item.path) for item in items if not _has_kind(item)})
    if missing:
        raise pytest.UsageError(
            "tests without a kind (unit or integration; a directory's conftest sets it with "
            f"tests/markers.py's mark_directory): {', '.join(missing)}"
        )
