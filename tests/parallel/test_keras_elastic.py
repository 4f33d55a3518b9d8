"""horovod.keras.elastic on the Keras backend named by KERAS_BACKEND (no TensorFlow needed on torch and jax), at
any number of ranks without the elastic driver: KerasState syncs the model, the optimizer and its attributes from
rank 0 and restores its last commit, ``hvd.elastic.run`` re-forms the job in place after a failed collective, and
``model.fit`` with the elastic callbacks resumes from the last commit after a failure mid-epoch."""
import numpy as np
import pytest

keras = pytest.importorskip("keras")
pytest.importorskip({"tensorflow": "tensorflow", "torch": "torch", "jax": "jax"}[keras.backend.backend()])

import horovod.keras as hvd  # noqa: E402
from horovod.numpy import allgather_object  # noqa: E402
from tests.support.elastic import run_failing_once  # noqa: E402


def make_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(1)])


def numpy_values(variables):
    return [np.array(keras.ops.convert_to_numpy(v.value)) for v in variables]


def everywhere_equal(arrays):
    """True when every rank holds the same arrays."""
    gathered = allgather_object(arrays, name="keras.elastic.equal")
    return all(len(g) == len(gathered[0]) and all(np.array_equal(a, b) for a, b in zip(g, gathered[0]))
               for g in gathered)


def test_keras_state_syncs_model_optimizer_and_attributes_from_rank_0_and_restores_its_commit():
    rank = hvd.rank()
    model = make_model(seed=rank)                      # different weights on every rank
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    state = hvd.elastic.KerasState(model, optimizer, epoch=rank, batch=0)
    assert optimizer.built                             # built by the state: a joining worker has the slots too
    for slot in optimizer.variables[2:]:               # the momentums, after iteration and learning_rate
        slot.assign(np.full(slot.shape, float(rank + 1), np.float32))
    state.sync()
    synced = numpy_values(model.variables) + numpy_values(optimizer.variables)
    assert everywhere_equal(synced)
    assert np.all(synced[-1] == 1.0) and state.epoch == 0     # rank 0's momentum and attributes
    state.commit()
    model.layers[0].kernel.assign(model.layers[0].kernel + 1.0)
    optimizer.variables[-1].assign(np.zeros(optimizer.variables[-1].shape, np.float32))
    state.epoch = 7
    state.restore()
    restored = numpy_values(model.variables) + numpy_values(optimizer.variables)
    assert all(np.array_equal(a, b) for a, b in zip(restored, synced)) and state.epoch == 0


def test_keras_state_tells_what_to_do_without_an_optimizer():
    with pytest.raises(ValueError, match="compile the model"):
        hvd.elastic.KerasState(make_model(seed=0))


def test_run_restores_the_commit_and_re_forms_the_job_after_a_failed_collective():
    model = make_model(seed=hvd.rank())
    state = hvd.elastic.KerasState(model, keras.optimizers.SGD(0.1), step=0)
    result, attempts = run_failing_once(
        hvd.elastic.run, state,
        lambda step: float(keras.ops.convert_to_numpy(
            hvd.allreduce(np.array([float(step)]), op=hvd.Sum, name="keras.elastic.after"))[0]))
    assert result == 2.0 * hvd.size() and attempts == [0, 1] and hvd.is_initialized()
    assert everywhere_equal(numpy_values(model.variables))


class FailOnce(keras.callbacks.Callback):
    """At the given epoch and batch of the first fit: note the committed kernel, change it without committing,
    and fail as a lost rank would."""

    def __init__(self, state, epoch, batch):
        super().__init__()
        self.state, self.at, self.fired, self.committed = state, (epoch, batch), False, None

    def on_train_batch_end(self, batch, logs=None):
        if not self.fired and (self.state.epoch, batch) == self.at:
            self.fired = True
            kernel = self.state.model.layers[0].kernel
            self.committed = np.array(keras.ops.convert_to_numpy(kernel.value))
            kernel.assign(kernel + 1.0)
            raise hvd.HorovodInternalError("simulated: a rank was lost")


def test_fit_with_the_elastic_callbacks_resumes_from_the_last_commit_after_a_failure():
    epochs, rank = 3, hvd.rank()
    model = make_model(seed=rank)
    model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)), "mse")
    model.build((None, 3))
    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    fail = FailOnce(state, epoch=1, batch=1)
    callbacks = [hvd.elastic.CommitStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.UpdateEpochStateCallback(state), fail]
    rng = np.random.RandomState(rank)
    x, y = rng.randn(12, 3).astype(np.float32), rng.randn(12, 1).astype(np.float32)
    starts = []

    @hvd.elastic.run
    def train(state):
        starts.append((state.epoch, np.array(keras.ops.convert_to_numpy(state.model.layers[0].kernel.value))))
        state.model.fit(x, y, batch_size=4, epochs=epochs - state.epoch, callbacks=callbacks, verbose=0)
        return state.epoch

    assert train(state) == epochs and state.batch == 0
    assert [epoch for epoch, _ in starts] == [0, 1]    # the second attempt resumed in the failed epoch
    np.testing.assert_array_equal(starts[1][1], fail.committed)    # the uncommitted change was undone
    assert everywhere_equal(numpy_values(model.variables))
