"""With HOROVOD_TF_OVERLAP_BYTES, DistributedGradientTape inside tf.function starts each large gradient's
allreduce as soon as that gradient exists (``horovod.tensorflow.overlap``): one start node per large gradient (one
for all the small ones) that depends on nothing but its gradients (and the collective chained before), one finish
node that waits. The reduced gradients are right, the buffers are released after every step and after a failed
one, collectives around the tape in the same function still run, and the paths that need a grouped allreduce
(the default, groups, Adasum, a recording outer tape) keep it.
"""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import horovod.tensorflow as hvd  # noqa: E402
from horovod.tensorflow import overlap  # noqa: E402

START, FINISH = "HorovodAllreduceStart", "HorovodAllreduceFinish"


@pytest.fixture(autouse=True)
def early_starts(request):
    """Every gradient starts alone (``HOROVOD_TF_OVERLAP_BYTES=0``) unless a test sets its own value."""
    previous = overlap.ALONE_BYTES
    overlap.ALONE_BYTES = getattr(request, "param", 0)
    yield
    overlap.ALONE_BYTES = previous


def needs_peers():
    if hvd.size() == 1:
        pytest.skip("a set of one rank exchanges nothing: no allreduce node is built")


def nodes(concrete, prefix):
    return [op for op in concrete.graph.get_operations() if op.name.split("/")[-1].startswith(prefix)]


def model(rank):
    init = np.random.default_rng(3)
    w = tf.Variable(init.normal(size=(4, 3)).astype(np.float32))
    b = tf.Variable(np.zeros(3, np.float32))
    v = tf.Variable(init.normal(size=(3, 1)).astype(np.float32))
    rng = np.random.default_rng(50 + rank)
    x, y = rng.normal(size=(5, 4)).astype(np.float32), rng.normal(size=(5, 1)).astype(np.float32)
    return [w, b, v], x, y


def loss_fn(variables, x, y):
    w, b, v = variables
    return tf.reduce_mean((tf.matmul(tf.tanh(tf.matmul(x, w) + b), v) - y) ** 2)


def tape_step(variables, **options):
    """A tf.function: this rank's loss, its gradients through DistributedGradientTape(**options)."""
    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(variables, x, y)
        return hvd.DistributedGradientTape(tape, **options).gradient(loss, variables)
    return step


def whole_batch(variables):
    xs, ys = zip(*[model(r)[1:] for r in range(hvd.size())])
    with tf.GradientTape() as tape:
        loss = loss_fn(variables, np.concatenate(xs), np.concatenate(ys))
    return tape.gradient(loss, variables)


@pytest.mark.parametrize("compression", ["none", "fp16"])
def test_each_gradient_starts_alone_and_the_result_is_the_whole_batch_gradient(compression):
    needs_peers()
    variables, x, y = model(hvd.rank())
    step = tape_step(variables, compression=getattr(hvd.Compression, compression))
    concrete = step.get_concrete_function(x, y)
    starts, finish = nodes(concrete, START), nodes(concrete, FINISH)
    assert len(starts) == len(variables) and len(finish) == 1, [op.name for op in starts + finish]
    for op in starts:
        # Nothing but its own gradient: the executor may run it as soon as that gradient exists.
        assert len(op.inputs) == 1 and not op.control_inputs, (op.name, list(op.inputs), op.control_inputs)
    assert {t.op for t in finish[0].inputs} == set(starts)
    expected = whole_batch(variables)
    for _ in range(3):
        grads = step(x, y)
        assert overlap.in_flight() == 0
        for got, exp in zip(grads, expected):
            tol = 2e-3 if compression == "fp16" else 1e-5
            np.testing.assert_allclose(got.numpy(), exp.numpy(), rtol=tol, atol=tol)


def test_collectives_before_and_after_the_tape_in_one_function():
    """The tape's starts wait for the collective chained before them, and the next one waits for the finish."""
    needs_peers()
    rank, size = hvd.rank(), hvd.size()
    variables, x, y = model(rank)
    scale = tf.Variable(float(rank + 1))

    @tf.function
    def step(x, y):
        total = hvd.allreduce(scale, op=hvd.Sum, name="overlap.before")
        with tf.GradientTape() as tape:
            loss = loss_fn(variables, x, y) * total
        grads = hvd.DistributedGradientTape(tape).gradient(loss, variables)
        after = hvd.allreduce(tf.reduce_sum(grads[0]), op=hvd.Sum, name="overlap.after")
        return grads, after

    concrete = step.get_concrete_function(x, y)
    before = [op for op in concrete.graph.get_operations() if op.type == "HorovodCollective"
              and op.name.startswith("HorovodAllreduce") and not op.name.startswith(START)][0]
    assert all(op.control_inputs == [before] for op in nodes(concrete, START))
    expected = [g * size * (size + 1) / 2 for g in whole_batch(variables)]
    for _ in range(3):
        grads, after = step(x, y)
        for got, exp in zip(grads, expected):
            np.testing.assert_allclose(got.numpy(), exp.numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(after.numpy(), size * np.sum(expected[0].numpy()), rtol=1e-4)
    assert overlap.in_flight() == 0


@pytest.mark.parametrize("kind", ["groups", "adasum"])
def test_groups_and_adasum_keep_the_grouped_allreduce(kind):
    needs_peers()
    if kind == "adasum" and hvd.size() & (hvd.size() - 1):
        pytest.skip("Adasum needs a power-of-two number of ranks")
    variables, x, y = model(hvd.rank())
    step = tape_step(variables, **({"groups": 2} if kind == "groups" else {"op": hvd.Adasum}))
    concrete = step.get_concrete_function(x, y)
    assert not nodes(concrete, START) and nodes(concrete, "HorovodGroupedAllreduce")
    step(x, y)


def test_a_recording_outer_tape_can_differentiate_the_reduced_gradient():
    """Under an outer tape the split nodes (which have no gradient) are not used: second order still works."""
    needs_peers()
    rank = hvd.rank()
    v = tf.Variable([1.0, 2.0])

    @tf.function
    def second_order():
        with tf.GradientTape() as outer:
            with tf.GradientTape() as inner:
                loss = tf.reduce_sum(v ** 3) * float(hvd.rank() + 1)
            grad = hvd.DistributedGradientTape(inner).gradient(loss, v)   # mean over ranks of 3 v^2 (r + 1)
            total = tf.reduce_sum(grad)
        return outer.gradient(total, v)   # None if the reduction had no gradient

    # Upstream's allreduce gradient is the allreduce (Average) of the incoming gradient, the same on every rank:
    # what is left is this rank's own d(3 v^2 (r + 1))/dv.
    expected = 6.0 * np.array([1.0, 2.0]) * (rank + 1)
    np.testing.assert_allclose(second_order().numpy(), expected, rtol=1e-5)


def test_a_failed_allreduce_fails_the_step_and_releases_every_buffer():
    needs_peers()
    rank = hvd.rank()
    fine = tf.Variable(tf.ones([3]))
    odd = tf.Variable(tf.ones([2 + rank % 2]))     # a shape that differs between ranks: negotiation fails

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(fine * 2.0) + tf.reduce_sum(odd)
        return hvd.DistributedGradientTape(tape).gradient(loss, [fine, odd])

    with pytest.raises(tf.errors.OpError, match="Mismatched"):
        step()
    assert overlap.in_flight() == 0
    # The job still works afterwards.
    out = hvd.allreduce(tf.fill([2], float(rank)), op=hvd.Sum, name="overlap.health")
    np.testing.assert_allclose(out.numpy(), np.full(2, hvd.size() * (hvd.size() - 1) / 2))


@pytest.mark.parametrize("early_starts", [None], indirect=True)
def test_off_by_default_one_grouped_allreduce():
    needs_peers()
    variables, x, y = model(hvd.rank())
    step = tape_step(variables)
    concrete = step.get_concrete_function(x, y)
    assert not nodes(concrete, START) and len(nodes(concrete, "HorovodGroupedAllreduce")) == 1


@pytest.mark.parametrize("early_starts", [32], indirect=True)
def test_small_gradients_start_together():
    """With 32 bytes: w (48 bytes) starts alone, b (12) and v (12) in one start node."""
    needs_peers()
    variables, x, y = model(hvd.rank())
    step = tape_step(variables)
    concrete = step.get_concrete_function(x, y)
    sizes = sorted(len(op.inputs) for op in nodes(concrete, START))
    assert sizes == [1, 2], sizes
    expected = whole_batch(variables)
    for got, exp in zip(step(x, y), expected):
        np.testing.assert_allclose(got.numpy(), exp.numpy(), rtol=1e-5, atol=1e-6)
    assert overlap.in_flight() == 0


def test_plan_and_the_setting():
    assert overlap.plan([100, 5, 2000, 7], 100) == [[0], [2], [1, 3]]
    assert overlap.plan([1, 2], 0) == [[0], [1]]
    assert overlap.plan([1, 2], 1 << 30) == [[0, 1]]
    env = overlap.ENV
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(env, "1048576")
        assert overlap._alone_bytes() == 1 << 20
        mp.setenv(env, "")
        assert overlap._alone_bytes() is None
        mp.setenv(env, "lots")
        with pytest.raises(ValueError, match=env):
            overlap._alone_bytes()
