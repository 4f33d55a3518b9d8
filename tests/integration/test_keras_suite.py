"""Run the Keras bodies in tests/parallel through the launcher.

- Keras 3 (tests/parallel/test_keras_*.py except the tf-keras ones), backend-independent: on each installed
  backend, TensorFlow at 4 ranks, PyTorch at 3 and JAX at 2 (KERAS_BACKEND selects it in every rank). The bodies
  do not depend on the backend, so each rank count runs once; Keras 3 on TensorFlow also trains at 2 ranks in
  tests/integration/test_keras_examples.py.
- Keras 2 through tf-keras (test_keras_tf_keras_*.py), with TF_USE_LEGACY_KERAS=1 so that ``tf.keras`` is
  ``tf_keras`` while ``import keras`` stays Keras 3: eagerly at 3 ranks, and the graph-mode (TF1) file alone,
  since it switches eager execution off for its whole process, at 2.

One rank is not run here: the TensorFlow suite covers horovod.tensorflow at one rank, and the time (about 30 s a
job) goes to rank counts that can fail in more ways.

Each job has a hard timeout that dumps every rank's stacks; each test inside a rank has its own pytest-timeout.
"""
import importlib.util

import pytest

from tests.support.launch import PARALLEL, run_parallel_tests

pytest.importorskip("keras")

pytestmark = pytest.mark.timeout(360)

ALL_FILES = sorted(p.name for p in PARALLEL.glob("test_keras_*.py"))
TF_KERAS_GRAPH = "test_keras_tf_keras_graph.py"
TF_KERAS_FILES = [f for f in ALL_FILES if f.startswith("test_keras_tf_keras_") and f != TF_KERAS_GRAPH]
FILES = [f for f in ALL_FILES if not f.startswith("test_keras_tf_keras_")]
EXPECTED = {"test_keras_optimizer.py", "test_keras_callbacks.py"}
EXPECTED_TF_KERAS = {"test_keras_tf_keras_optimizer.py", "test_keras_tf_keras_callbacks.py"}
JOBS = [("tensorflow", 4), ("torch", 3), ("jax", 2)]
TF_KERAS_ENV = {"TF_USE_LEGACY_KERAS": "1", "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"}


def test_every_keras_file_is_listed():
    assert EXPECTED <= set(FILES), FILES
    assert EXPECTED_TF_KERAS <= set(TF_KERAS_FILES) and TF_KERAS_GRAPH in ALL_FILES, ALL_FILES


# The quick tier runs Keras 3 on TensorFlow at 2 ranks; JAX at 2 is slow like the jobs of 3 and 4 ranks.
@pytest.mark.parametrize("backend,np_", [pytest.param(b, n, marks=pytest.mark.slow) if b == "jax" else (b, n)
                                        for b, n in JOBS], ids=[f"{b}-np{n}" for b, n in JOBS])
def test_keras_parallel(backend, np_):
    if importlib.util.find_spec(backend) is None:
        pytest.skip(f"{backend} is not installed (pip install -e '.[{backend}]')")
    env = {"KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2"}
    run_parallel_tests(np_, FILES, env=env, timeout=300, pytest_args=["--timeout=90"])


def _require_tf_keras():
    for module in ("tensorflow", "tf_keras"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (pip install -e '.[tf-keras]')")


@pytest.mark.parametrize("np_", [3], ids=lambda n: f"np{n}")
def test_tf_keras_parallel(np_):
    _require_tf_keras()
    run_parallel_tests(np_, TF_KERAS_FILES, env=TF_KERAS_ENV, timeout=300, pytest_args=["--timeout=90"])


@pytest.mark.slow      # the quick tier runs tf-keras in test_keras_examples.py
def test_tf_keras_graph_mode():
    _require_tf_keras()
    run_parallel_tests(2, TF_KERAS_GRAPH, env=TF_KERAS_ENV, timeout=180, pytest_args=["--timeout=60"])
