"""Run the backend-independent horovod.keras bodies (tests/parallel/test_keras_*.py) on each Keras backend that
is installed: TensorFlow at 1, 2 and 4 ranks, PyTorch at 3 and JAX at 2 (KERAS_BACKEND selects it in every rank).

Each job has a hard timeout that dumps every rank's stacks; each test inside a rank has its own pytest-timeout.
"""
import importlib.util

import pytest

from tests.support.launch import PARALLEL, run_parallel_tests

pytest.importorskip("keras")

pytestmark = pytest.mark.timeout(360)

FILES = sorted(p.name for p in PARALLEL.glob("test_keras_*.py"))
EXPECTED = {"test_keras_optimizer.py", "test_keras_callbacks.py"}
JOBS = [("tensorflow", 1), ("tensorflow", 2), ("tensorflow", 4), ("torch", 3), ("jax", 2)]


def test_every_keras_file_is_listed():
    assert EXPECTED <= set(FILES), FILES


@pytest.mark.parametrize("backend,np_", JOBS, ids=[f"{b}-np{n}" for b, n in JOBS])
def test_keras_parallel(backend, np_):
    if importlib.util.find_spec(backend) is None:
        pytest.skip(f"{backend} is not installed (pip install -e '.[{backend}]')")
    env = {"KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2"}
    run_parallel_tests(np_, FILES, env=env, timeout=300, pytest_args=["--timeout=90"])
