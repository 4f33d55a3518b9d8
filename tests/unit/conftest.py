"""Unit tests run in one process and in well under a second each: one that takes two minutes is hung."""
import pytest

UNIT_TIMEOUT_SECONDS = 120


def pytest_collection_modifyitems(items):
    """Give every unit test without its own timeout marker the unit timeout (see pyproject's global one)."""
    for item in items:
        if item.get_closest_marker("timeout") is None and "tests/unit/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.timeout(UNIT_TIMEOUT_SECONDS))
