"""Make ``tests.support`` importable however pytest is started (``pytest`` or ``python -m pytest``); mark the
slow tier; report the launches that were tried again."""
import sys
from pathlib import Path

import pytest

_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)


def pytest_terminal_summary(terminalreporter):
    """Launches tried again (tests/support/launch.py) are counted and named, never silent."""
    launch = sys.modules.get("tests.support.launch")
    retried = getattr(launch, "RETRIED", [])
    if retried:
        terminalreporter.write_sep("=", f"{len(retried)} launch(es) tried again")
        for line in retried:
            terminalreporter.write_line(line)


# The quick tier, ``pytest -m "not slow"`` (docs/developing.md), runs every package at 1 and 2 ranks: a test
# parametrized with more ranks than QUICK_MAX_RANKS is slow, as are the scenarios marked ``slow`` by hand.
QUICK_MAX_RANKS = 2
RANK_PARAMETERS = ("np_", "num_proc")


def pytest_collection_modifyitems(config, items):
    for item in items:
        callspec = getattr(item, "callspec", None)
        ranks = [v for k, v in callspec.params.items() if k in RANK_PARAMETERS] if callspec else []
        if any(isinstance(v, int) and v > QUICK_MAX_RANKS for v in ranks):
            item.add_marker(pytest.mark.slow)
