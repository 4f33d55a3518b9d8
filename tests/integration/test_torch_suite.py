"""Run every horovod.torch body in tests/parallel (test_torch_*.py) at 1, 2, 3 and 4 ranks through the launcher.

One job per rank count runs every file (torch's import in every rank is most of a small job's time). Each job has
a hard timeout that dumps every rank's stacks; each test inside a rank has its own pytest-timeout.
"""
import pytest

from tests.support.launch import PARALLEL, run_parallel_tests

pytest.importorskip("torch")

pytestmark = pytest.mark.timeout(660)

FILES = sorted(p.name for p in PARALLEL.glob("test_torch_*.py"))
JOB_TIMEOUT = 600
PER_TEST_TIMEOUT = ["--timeout=60"]
EXPECTED = {"test_torch_ops.py", "test_torch_autograd.py", "test_torch_optimizer.py",
            "test_torch_sync_batch_norm.py", "test_torch_join.py", "test_torch_errors.py",
            "test_torch_scaling.py", "test_torch_sparse.py"}


def test_every_torch_file_is_listed():
    assert EXPECTED <= set(FILES), FILES


@pytest.mark.parametrize("np_", [1, 2, 3, 4])
def test_torch_parallel(np_):
    run_parallel_tests(np_, FILES, timeout=JOB_TIMEOUT, pytest_args=PER_TEST_TIMEOUT)
