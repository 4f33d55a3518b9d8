"""Make ``tests.support`` importable however pytest is started (``pytest`` or ``python -m pytest``); mark the
slow tier; report the launches that were tried again."""
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)


def pytest_configure(config):
    """The jobs tests start run in the repository's root: their flight records (written when a job aborts, see
    docs/timeline.md) go to a folder of this run instead of ./horovod-flight. A test that checks the folder sets
    HOROVOD_FLIGHT_RECORDER_DIR itself."""
    if not os.environ.get("HOROVOD_FLIGHT_RECORDER_DIR"):
        os.environ["HOROVOD_FLIGHT_RECORDER_DIR"] = _FLIGHT_DIR[0] = tempfile.mkdtemp(prefix="horovod-flight-tests-")


_FLIGHT_DIR = [""]      # the folder this run made, if it made one


def pytest_unconfigure(config):
    """Remove this run's folder of flight records when no job wrote into it (records are kept for a look)."""
    folder = _FLIGHT_DIR[0]
    if folder and not any(files for _, _, files in os.walk(folder)):
        shutil.rmtree(folder, ignore_errors=True)


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
