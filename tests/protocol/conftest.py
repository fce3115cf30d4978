"""protocol tests: unit (tests/markers.py)."""

from ..markers import mark_directory


def pytest_collection_modifyitems(items):
    mark_directory(items, __file__, "unit")
