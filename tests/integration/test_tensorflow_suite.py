"""Run every horovod.tensorflow body in tests/parallel (test_tensorflow_*.py) at 1, 2 and 3 ranks through the
launcher (3 catches non-power-of-2 and uneven-split bugs).

Each job has a hard timeout that dumps every rank's stacks; each test inside a rank has its own pytest-timeout.
"""
import pytest

from tests.support.launch import PARALLEL, run_parallel_tests

pytest.importorskip("tensorflow")

pytestmark = pytest.mark.timeout(300)

FILES = sorted(p.name for p in PARALLEL.glob("test_tensorflow_*.py"))
JOB_TIMEOUT = 240
PER_TEST_TIMEOUT = ["--timeout=60"]
EXPECTED = {"test_tensorflow_ops.py", "test_tensorflow_grads.py", "test_tensorflow_errors.py", "test_tensorflow_tf1.py",
            "test_tensorflow_partial_tape.py", "test_tensorflow_sync_batch_norm.py", "test_tensorflow_keras.py",
            "test_tensorflow_graph_mode.py", "test_tensorflow_scale_factors.py"}
# Quiet TF's C++ start-up logging in the ranks' output.
ENV = {"TF_CPP_MIN_LOG_LEVEL": "2"}


def test_every_tensorflow_file_is_listed():
    assert EXPECTED <= set(FILES), FILES


@pytest.mark.parametrize("test_file", FILES)
@pytest.mark.parametrize("np_", [1, 2, 3])
def test_tensorflow_parallel(np_, test_file):
    run_parallel_tests(np_, test_file, env=ENV, timeout=JOB_TIMEOUT, pytest_args=PER_TEST_TIMEOUT)
