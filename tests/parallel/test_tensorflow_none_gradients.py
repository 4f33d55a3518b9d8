"""None gradients in horovod.tensorflow (issue 28, item 5): DistributedGradientTape and the TF1 DistributedOptimizer.

- None on every rank for the same variable: skipped, as upstream (the result is None, the others are averaged).
- None on some ranks only: every rank raises an InvalidArgumentError that names the variable and the ranks on
  either side, promptly (instead of a deadlock report about internal tensor names), and the job goes on.
"""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import horovod.tensorflow as hvd  # noqa: E402
from horovod.tensorflow.none_gradients import NoneGradientError  # noqa: E402

MODES = ["eager", "function"]


def run(mode, fn):
    return fn() if mode == "eager" else tf.function(fn)()


def odd_and_even():
    ranks = range(hvd.size())
    return [r for r in ranks if r % 2 == 1], [r for r in ranks if r % 2 == 0]


def needs_two_ranks():
    if hvd.size() == 1:
        pytest.skip("needs two ranks")


def tape_step(variables, loss_of, **gradient_kwargs):
    def step():
        with tf.GradientTape() as tape:
            loss = loss_of()
        return hvd.DistributedGradientTape(tape).gradient(loss, variables, **gradient_kwargs)
    return step


@pytest.mark.parametrize("mode", MODES)
def test_none_on_every_rank_stays_none(mode):
    a, b = tf.Variable(tf.ones([3]), name="a"), tf.Variable(tf.ones([2, 2]), name="unused")
    ga, gb = run(mode, tape_step([a, b], lambda: tf.reduce_sum(a) * float(hvd.rank() + 1)))
    assert gb is None
    np.testing.assert_allclose(ga.numpy(), np.full(3, (hvd.size() + 1) / 2.0), rtol=1e-6)


def assert_names_the_branch(exc, variable="branch:0"):
    odd, even = odd_and_even()
    message = str(exc)
    assert (f"DistributedGradientTape: the gradient of variable '{variable}' is None on rank(s) {odd} but not on "
            f"rank(s) {even}.") in message, message
    assert "unconnected_gradients=tf.UnconnectedGradients.ZERO" in message, message


@pytest.mark.parametrize("mode", MODES)
def test_none_on_some_ranks_raises_on_every_rank_and_the_job_goes_on(mode):
    needs_two_ranks()
    a, b = tf.Variable(tf.ones([3]), name="shared"), tf.Variable(tf.ones([2, 2]), name="branch")
    skip_branch = hvd.rank() % 2 == 1
    step = tape_step([a, b], lambda: tf.reduce_sum(a) + (0.0 if skip_branch else tf.reduce_sum(b)))
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        run(mode, step)
    assert_names_the_branch(info.value)
    if mode == "eager":
        assert isinstance(info.value, NoneGradientError) and isinstance(info.value, ValueError)
    # Nothing was left half-negotiated: a matching step works right after.
    ga, gb = run(mode, tape_step([a, b], lambda: tf.reduce_sum(a) + tf.reduce_sum(b)))
    np.testing.assert_allclose(ga.numpy(), np.ones(3))
    np.testing.assert_allclose(gb.numpy(), np.ones([2, 2]))


@pytest.mark.parametrize("mode", MODES)
def test_unconnected_gradients_zero_averages_zeros_in(mode):
    a, b = tf.Variable(tf.ones([3]), name="shared"), tf.Variable(tf.ones([2, 2]), name="branch")
    skip_branch = hvd.rank() % 2 == 1
    ga, gb = run(mode, tape_step([a, b], lambda: tf.reduce_sum(a) + (0.0 if skip_branch else tf.reduce_sum(b)),
                                 unconnected_gradients=tf.UnconnectedGradients.ZERO))
    _, even = odd_and_even()
    np.testing.assert_allclose(gb.numpy(), np.full([2, 2], len(even) / hvd.size()), rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_several_partial_gradients_name_the_first_and_list_the_others(mode):
    needs_two_ranks()
    a = tf.Variable(tf.ones([3]), name="shared")
    b, c = tf.Variable(tf.ones([2]), name="branch"), tf.Variable(tf.ones([2]), name="branch2")
    skip = hvd.rank() % 2 == 1
    step = tape_step([a, b, c], lambda: tf.reduce_sum(a) + (0.0 if skip else tf.reduce_sum(b) + tf.reduce_sum(c)))
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        run(mode, step)
    assert_names_the_branch(info.value)
    assert "(Also None on some ranks only: 'branch2:0'.)" in str(info.value)


@pytest.mark.parametrize("mode", MODES)
def test_a_sparse_gradient_on_some_ranks_only_is_named_too(mode):
    """An embedding looked up on some ranks only: an IndexedSlices gradient there (two allgathers), None
    elsewhere; also with groups=2, where the dense gradients go as two grouped allreduces."""
    needs_two_ranks()
    a, emb = tf.Variable(tf.ones([3]), name="shared"), tf.Variable(tf.ones([5, 2]), name="embedding")
    skip = hvd.rank() % 2 == 1

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(a)
            if not skip:
                loss += tf.reduce_sum(tf.gather(emb, [0, 3]))
        return hvd.DistributedGradientTape(tape, groups=2).gradient(loss, [a, emb])

    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        run(mode, step)
    assert_names_the_branch(info.value, "embedding:0")


def test_rank_without_any_dense_gradient_still_checks():
    """One side has no dense gradient at all (the check then runs in a node of its own there)."""
    needs_two_ranks()
    a = tf.Variable(tf.ones([3]), name="branch")
    skip = hvd.rank() % 2 == 1
    step = tape_step([a], lambda: tf.constant(1.0) if skip else tf.reduce_sum(a))
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        run("function", step)
    assert_names_the_branch(info.value)


def test_tf1_optimizer_compute_gradients_names_the_variable():
    needs_two_ranks()
    a, b = tf.Variable(tf.ones([3]), name="shared"), tf.Variable(tf.ones([2]), name="branch")
    skip = hvd.rank() % 2 == 1
    opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        opt.compute_gradients(lambda: tf.reduce_sum(a) + (0.0 if skip else tf.reduce_sum(b)), var_list=[a, b])
    odd, even = odd_and_even()
    message = str(info.value)
    assert (f"DistributedGradientDescentOptimizer: the gradient of variable 'branch:0' is None on rank(s) {odd} "
            f"but not on rank(s) {even}.") in message, message
    assert "pass var_list= with only the variables it depends on" in message
