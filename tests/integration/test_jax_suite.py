"""Run every horovod.jax body in tests/parallel (test_jax_*.py) at 1 and 3 ranks through the launcher (2 ranks
run the example and the Keras suite's JAX backend), and the digits example on 2 ranks (its held-out accuracy
reported by rank 0 only). Four ranks run the core and torch suites: horovod.jax adds nothing that depends on a
power of two, and the suite's time is budgeted (a 4-rank JAX job took 26-43 s).

One job per rank count runs every file (JAX's import and jit compilations are most of a small job's time). Each
job has a hard timeout that dumps every rank's stacks; each test inside a rank has its own pytest-timeout.
"""
import sys

import pytest

from tests.support.examples import assert_digits_report
from tests.support.launch import PARALLEL, horovodrun, run_parallel_tests

pytestmark = pytest.mark.timeout(660)

# Seeded, the digits example (seed 42) reaches 97.33 % on the reference VM; seeds 0-9 reach 96.67-97.78 %.
# Other CPUs' arithmetic moves a seeded run by a point or two, so the threshold is 3 points below the lower of
# those, rounded down.
MIN_ACCURACY = 93.0

FILES = sorted(p.name for p in PARALLEL.glob("test_jax_*.py"))
JOB_TIMEOUT = 600
PER_TEST_TIMEOUT = ["--timeout=60"]
EXPECTED = {"test_jax_ops.py", "test_jax_grads.py", "test_jax_optimizer.py", "test_jax_errors.py"}


def test_every_jax_file_is_listed():
    assert EXPECTED <= set(FILES), FILES


@pytest.mark.parametrize("np_", [1, 3])
def test_jax_parallel(np_):
    run_parallel_tests(np_, FILES, timeout=JOB_TIMEOUT, pytest_args=PER_TEST_TIMEOUT)


def test_jax_digits_trains_on_two_ranks():
    result = horovodrun(2, [sys.executable, "examples/jax/jax_digits.py", "--epochs", "12"], timeout=240)
    assert result.returncode == 0, result.stdout[-5000:]
    assert_digits_report(result.stdout, ranks=2, min_accuracy=MIN_ACCURACY)
