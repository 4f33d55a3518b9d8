"""Make ``tests.support`` importable however pytest is started (``pytest`` or ``python -m pytest``); mark the
slow tier; plan the run for pytest-xdist's workers; report the launches that were tried again."""
import functools
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
    HOROVOD_FLIGHT_RECORDER_DIR itself.

    Every JAX process of this run (each rank of every JAX job, the in-process tests) shares one persistent
    compilation cache: the JAX jobs at each rank count, the Keras JAX backend and the JAX examples compile the
    same small programs, and a later job loads them instead (a 4-rank JAX job went from 35 s to 23 s on the
    reference VM). Tracing, and so every horovod.jax code path, still runs; only XLA's compile is skipped.

    The processes tests start (every rank of every job, Spark's and Ray's workers) cache bytecode as Python does
    by default, even where the environment sets PYTHONDONTWRITEBYTECODE (the reference VM does): otherwise each of
    the suite's thousands of processes compiles horovod, its test files and pytest's rewritten asserts again, and
    a 4-rank job of the parallel suite spent 10 % more CPU doing so. The caches are __pycache__ folders, which
    git ignores."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    if not os.environ.get("HOROVOD_FLIGHT_RECORDER_DIR"):
        os.environ["HOROVOD_FLIGHT_RECORDER_DIR"] = _FLIGHT_DIR[0] = tempfile.mkdtemp(prefix="horovod-flight-tests-")
    if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        os.environ["JAX_COMPILATION_CACHE_DIR"] = _JAX_CACHE[0] = tempfile.mkdtemp(prefix="horovod-jax-cache-")
        os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
        os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")


_FLIGHT_DIR = [""]      # the folder this run made, if it made one
_JAX_CACHE = [""]       # the JAX compilation cache this run made, if it made one


def pytest_unconfigure(config):
    """Remove this run's folder of flight records when no job wrote into it (records are kept for a look), and
    the JAX compilation cache this run made."""
    folder = _FLIGHT_DIR[0]
    if folder and not any(files for _, _, files in os.walk(folder)):
        shutil.rmtree(folder, ignore_errors=True)
    if _JAX_CACHE[0]:
        shutil.rmtree(_JAX_CACHE[0], ignore_errors=True)


_RETRIED_PROPERTY = "launch_tried_again"
_RETRIED_SENT = [0]     # how many of tests.support.launch.RETRIED this process has put on a report
_RETRIED = []           # the launches tried again, as the reports brought them (from every worker)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Put the launches tried again during this phase on its report: under pytest-xdist the report is how they
    reach the process that prints the summary."""
    outcome = yield
    launch = sys.modules.get("tests.support.launch")
    retried = getattr(launch, "RETRIED", [])
    report = outcome.get_result()
    for line in retried[_RETRIED_SENT[0]:]:
        report.user_properties.append((_RETRIED_PROPERTY, line))
    _RETRIED_SENT[0] = len(retried)


def pytest_runtest_logreport(report):
    _RETRIED.extend(value for name, value in report.user_properties if name == _RETRIED_PROPERTY)


def pytest_terminal_summary(terminalreporter):
    """Launches tried again (tests/support/launch.py) are counted and named, never silent."""
    if _RETRIED:
        terminalreporter.write_sep("=", f"{len(_RETRIED)} launch(es) tried again")
        for line in _RETRIED:
            terminalreporter.write_line(line)


# The quick tier, ``pytest -m "not slow"`` (docs/developing.md), runs every package at 1 and 2 ranks: a test
# parametrized with more ranks than QUICK_MAX_RANKS is slow, as are the scenarios marked ``slow`` by hand.
QUICK_MAX_RANKS = 2
RANK_PARAMETERS = ("np_", "num_proc")


# The suite runs on two pytest-xdist workers (pyproject's addopts: ``-n 2 --dist loadgroup``): on the 2-core
# reference machine one process used 1.1 cores on average, most tests of the watchdog, stall, elastic, Ray and
# Spark files being waits for a timeout or a start-up. Each test file is one unit of work, so its module-scoped
# fixtures (a Spark session, a Ray cluster) start once; the files that make namespace hosts share one unit, as
# the machine has one set of hosts at a time (tests/support/hosts.py). Units start in the order _order gives:
# the long framework suites first, the unit tests, short, last to fill the end.
HOSTS_GROUP = "namespace-hosts"


def _order(item) -> int:
    path = item.nodeid.split("::")[0]
    if path.startswith("tests/unit/"):
        return 2
    return 0 if path.endswith("_suite.py") else 1


@functools.cache      # once per test file, not once per test
def _makes_hosts(module) -> bool:
    from tests.support import hosts

    made_by = (hosts.namespace_hosts, hosts.hosts_or_skip)
    return any(value in made_by for value in vars(module).values() if callable(value))


@pytest.hookimpl(tryfirst=True)   # before pytest-xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        callspec = getattr(item, "callspec", None)
        ranks = [v for k, v in callspec.params.items() if k in RANK_PARAMETERS] if callspec else []
        if any(isinstance(v, int) and v > QUICK_MAX_RANKS for v in ranks):
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("xdist_group") is None:
            module = getattr(item, "module", None)
            group = HOSTS_GROUP if module is not None and _makes_hosts(module) else item.nodeid.split("::")[0]
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=_order)
