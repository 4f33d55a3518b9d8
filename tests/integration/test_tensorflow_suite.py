"""Run every horovod.tensorflow body in tests/parallel (test_tensorflow_*.py) at 3 ranks through the launcher (3
catches non-power-of-2 and uneven-split bugs; 2 ranks run the TF examples and the Keras suites, 4 the Keras 3
suite on TensorFlow), and at 1 rank the files whose code takes a path of its own at one rank: the ops (a
collective of one), the tape, optimizers and Keras wrappers (no allreduce at size 1 outside elastic jobs),
elastic state, gradients that are None, and the errors. The others (Adasum, graph-mode fan-out, SyncBatchNorm,
TF1 graphs, scale factors, overlap, process sets) run the same code at one rank as at three, so their 1-rank
pass (about 15 s of the suite) is not spent.

One job per rank count runs every file: most of a job's time is TensorFlow's import in every rank, which one job
per file would pay once per file. Each job has a hard timeout that dumps every rank's stacks; each test inside
a rank has its own pytest-timeout, so a hang fails that test fast with its stack.
"""
import pytest

from tests.support.launch import PARALLEL, run_parallel_tests

pytest.importorskip("tensorflow")

pytestmark = pytest.mark.timeout(660)

FILES = sorted(p.name for p in PARALLEL.glob("test_tensorflow_*.py"))
JOB_TIMEOUT = 600
PER_TEST_TIMEOUT = ["--timeout=60"]
EXPECTED = {"test_tensorflow_ops.py", "test_tensorflow_grads.py", "test_tensorflow_errors.py", "test_tensorflow_tf1.py",
            "test_tensorflow_partial_tape.py", "test_tensorflow_sync_batch_norm.py", "test_tensorflow_keras.py",
            "test_tensorflow_graph_mode.py", "test_tensorflow_scale_factors.py"}
# Quiet TF's C++ start-up logging in the ranks' output.
ENV = {"TF_CPP_MIN_LOG_LEVEL": "2"}


def test_every_tensorflow_file_is_listed():
    assert EXPECTED <= set(FILES), FILES


ONE_RANK = ["test_tensorflow_ops.py", "test_tensorflow_grads.py", "test_tensorflow_keras.py",
            "test_tensorflow_elastic.py", "test_tensorflow_keras_elastic.py", "test_tensorflow_none_gradients.py",
            "test_tensorflow_partial_tape.py", "test_tensorflow_errors.py"]


def test_the_one_rank_files_exist():
    assert set(ONE_RANK) <= set(FILES), sorted(set(ONE_RANK) - set(FILES))


@pytest.mark.parametrize("np_", [1, 3])
def test_tensorflow_parallel(np_):
    run_parallel_tests(np_, ONE_RANK if np_ == 1 else FILES, env=ENV, timeout=JOB_TIMEOUT,
                       pytest_args=PER_TEST_TIMEOUT)
