"""horovod.keras on the Keras backend named by KERAS_BACKEND (the suite runs this file on tensorflow, torch and
jax): DistributedOptimizer's averaged/summed/aggregated updates, model.fit equal to single-process training on
the global batch, PartialDistributedOptimizer, the value collectives, load_model and the argument errors.
"""
import os

import numpy as np
import pytest

keras = pytest.importorskip("keras")
pytest.importorskip({"tensorflow": "tensorflow", "torch": "torch", "jax": "jax"}[keras.backend.backend()])

import horovod.keras as hvd  # noqa: E402

BACKEND = keras.backend.backend()


def test_runs_on_the_requested_backend():
    assert BACKEND == os.environ.get("KERAS_BACKEND", "tensorflow")


def rank_grad(shape, rank, scale=1.0):
    """A gradient that differs per rank: (rank + 1) * scale * [1, 2, ...]."""
    return (np.arange(1, int(np.prod(shape)) + 1, dtype=np.float32).reshape(shape) * (rank + 1) * scale)


def mean_over_ranks(shape, scale=1.0):
    size = hvd.size()
    return sum(rank_grad(shape, r, scale) for r in range(size)) / size


def value(v):
    return keras.ops.convert_to_numpy(v)


def apply_once(opt, grads, variables):
    opt.apply([keras.ops.convert_to_tensor(g) for g in grads], variables)


@pytest.mark.parametrize("op_name", ["Average", "Sum"])
def test_apply_reduces_gradients(op_name):
    op, size = getattr(hvd, op_name), hvd.size()
    a, b = keras.Variable(np.zeros((2, 3), np.float32)), keras.Variable(np.zeros(4, np.float32))
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=1.0), op=op)
    assert isinstance(opt, keras.optimizers.SGD)
    apply_once(opt, [rank_grad((2, 3), hvd.rank()), rank_grad((4,), hvd.rank(), 2.0)], [a, b])
    factor = 1.0 if op == hvd.Average else size
    np.testing.assert_allclose(value(a), -mean_over_ranks((2, 3)) * factor, rtol=1e-6)
    np.testing.assert_allclose(value(b), -mean_over_ranks((4,), 2.0) * factor, rtol=1e-6)
    assert int(value(opt.iterations)) == 1


def test_adasum_combines_each_gradient_with_adasum():
    """On every backend: per variable, the update is -lr * Adasum of the ranks' gradients (the reference in
    tests/support/adasum_reference.py). The odd ranks' gradients are shifted, so that they are not parallel to
    the even ranks' (Adasum would then just weigh them)."""
    from tests.support.adasum_reference import adasum

    variables = [keras.Variable(np.zeros(s, np.float32)) for s in [(2, 3), (4,)]]
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=1.0), op=hvd.Adasum)
    skew = [np.float32(1.0), np.float32(-0.5)]
    grads = [[rank_grad(v.shape, r) + (r % 2) * skew[i] for r in range(hvd.size())] for i, v in enumerate(variables)]
    apply_once(opt, [g[hvd.rank()] for g in grads], variables)
    for v, per_rank in zip(variables, grads):
        np.testing.assert_allclose(value(v), -adasum(per_rank), rtol=1e-5, atol=1e-6)


def test_process_set_averages_over_the_set_and_scales_local_gradients_by_its_size():
    """On every backend: the even and the odd ranks each average over their own set (of unequal sizes at 3
    ranks); a local layer's gradient is divided by the set's size, not the job's."""
    from tests.support.process_sets import even_odd_sets

    for ps, _ in even_odd_sets():
        shared, local = keras.Variable(np.zeros(3, np.float32)), keras.Variable(np.zeros(2, np.float32))
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=1.0), process_set=ps)
        opt.register_local_var(local)
        apply_once(opt, [rank_grad((3,), hvd.rank()), rank_grad((2,), hvd.rank())], [shared, local])
        mean = sum(rank_grad((3,), r) for r in ps.ranks) / ps.size()
        np.testing.assert_allclose(value(shared), -mean, rtol=1e-6)
        np.testing.assert_allclose(value(local), -rank_grad((2,), hvd.rank()) / ps.size(), rtol=1e-6)


@pytest.mark.parametrize("options", [dict(gradient_predivide_factor=4.0), dict(groups=2),
                                     dict(compression=hvd.Compression.fp16), dict(num_groups=3)],
                         ids=["predivide", "int-groups", "fp16", "num_groups"])
def test_options_keep_the_average(options):
    variables = [keras.Variable(np.zeros(s, np.float32)) for s in [(3,), (2, 2), (5,), (1,)]]
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=1.0), **options)
    apply_once(opt, [rank_grad(v.shape, hvd.rank()) for v in variables], variables)
    for v in variables:
        np.testing.assert_allclose(value(v), -mean_over_ranks(v.shape), rtol=1e-3)


def test_groups_of_variables():
    variables = [keras.Variable(np.zeros(s, np.float32)) for s in [(3,), (2,), (4,)]]
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=1.0), groups=[[variables[0], variables[2]]])
    apply_once(opt, [rank_grad(v.shape, hvd.rank()) for v in variables], variables)
    for v in variables:
        np.testing.assert_allclose(value(v), -mean_over_ranks(v.shape), rtol=1e-6)


@pytest.mark.parametrize("average_aggregated", [False, True])
def test_backward_passes_per_step_aggregates_locally(average_aggregated):
    if BACKEND == "jax":
        pytest.skip("backward_passes_per_step > 1 is refused on JAX (tested below)")
    var = keras.Variable(np.zeros(3, np.float32))
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=1.0), backward_passes_per_step=2,
                                   average_aggregated_gradients=average_aggregated)
    apply_once(opt, [rank_grad((3,), hvd.rank())], [var])
    np.testing.assert_array_equal(value(var), np.zeros(3), "the first pass only aggregates")
    assert int(value(opt.iterations)) == 1
    apply_once(opt, [rank_grad((3,), hvd.rank(), 3.0)], [var])
    total = mean_over_ranks((3,)) + mean_over_ranks((3,), 3.0)
    expected = -(total / 2 if average_aggregated else total)
    np.testing.assert_allclose(value(var), expected, rtol=1e-6)
    assert int(value(opt.iterations)) == 2
    apply_once(opt, [rank_grad((3,), hvd.rank())], [var])
    np.testing.assert_allclose(value(var), expected, rtol=1e-6, err_msg="the aggregate was reset")


def test_backward_passes_per_step_refused_on_jax():
    if BACKEND != "jax":
        pytest.skip("JAX only")
    var = keras.Variable(np.zeros(3, np.float32))
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=1.0), backward_passes_per_step=2)
    with pytest.raises(NotImplementedError, match="gradient_accumulation_steps"):
        apply_once(opt, [rank_grad((3,), hvd.rank())], [var])


def test_partial_optimizer_keeps_local_layer_gradients_local():
    size = hvd.size()
    shared, local = keras.layers.Dense(2, use_bias=False), keras.layers.Dense(2, use_bias=False)
    shared.build((None, 3))
    local.build((None, 3))
    for layer in (shared, local):
        layer.kernel.assign(np.zeros((3, 2), np.float32))
    opt = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(learning_rate=1.0), local_layers=[local])
    grads = [rank_grad((3, 2), hvd.rank()), rank_grad((3, 2), hvd.rank())]
    apply_once(opt, grads, [shared.kernel, local.kernel])
    np.testing.assert_allclose(value(shared.kernel), -mean_over_ranks((3, 2)), rtol=1e-6)
    # scale_local_gradients: the local gradient is divided by the size, like the averaged ones.
    np.testing.assert_allclose(value(local.kernel), -rank_grad((3, 2), hvd.rank()) / size, rtol=1e-6)


def make_model(seed=1234):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])


def test_fit_equals_single_process_training_on_the_global_batch():
    size, rank, per_rank, steps = hvd.size(), hvd.rank(), 4, 5
    rng = np.random.RandomState(0)
    x = rng.randn(steps * size * per_rank, 6).astype(np.float32)
    y = rng.randn(steps * size * per_rank, 1).astype(np.float32)
    rows = np.concatenate([np.arange(k * size * per_rank + rank * per_rank, k * size * per_rank + (rank + 1) * per_rank)
                           for k in range(steps)])
    distributed = make_model()
    distributed.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.5)), "mse")
    distributed.fit(x[rows], y[rows], batch_size=per_rank, shuffle=False, epochs=2, verbose=0)
    reference = make_model()
    reference.compile(keras.optimizers.SGD(0.1, momentum=0.5), "mse")
    reference.fit(x, y, batch_size=size * per_rank, shuffle=False, epochs=2, verbose=0)
    for got, want in zip(distributed.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_value_collectives():
    size, rank = hvd.size(), hvd.rank()
    np.testing.assert_allclose(value(hvd.allreduce(np.full(3, rank, np.float32), name="keras.v.avg")),
                               np.full(3, (size - 1) / 2))
    np.testing.assert_allclose(value(hvd.allreduce(float(rank + 1), name="keras.v.sum", op=hvd.Sum)),
                               size * (size + 1) / 2)
    gathered = value(hvd.allgather(np.full((rank + 1, 2), rank, np.int32), name="keras.v.gather"))
    assert gathered.shape == (size * (size + 1) // 2, 2)
    np.testing.assert_array_equal(value(hvd.broadcast(np.arange(4) + rank, 0, name="keras.v.bcast")),
                                  np.arange(4))
    block = value(hvd.reducescatter(np.ones((size * 2, 3), np.float32), name="keras.v.rs", op=hvd.Sum))
    np.testing.assert_allclose(block, np.full((2, 3), size))


def test_broadcast_variables_and_load_model(tmp_path):
    model = make_model(seed=hvd.rank())
    model.compile(hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), "mse")
    hvd.broadcast_variables(model.variables, root_rank=0)
    root = hvd.broadcast(model.get_weights()[0], 0, name="keras.load.root")
    np.testing.assert_array_equal(model.get_weights()[0], value(root))
    x = np.ones((4, 6), np.float32)
    model.fit(x, np.zeros((4, 1), np.float32), batch_size=4, epochs=2, verbose=0)
    path = tmp_path / f"model-{hvd.rank()}.keras"
    model.save(path)
    loaded = hvd.load_model(str(path))
    assert isinstance(loaded.optimizer, keras.optimizers.Adam)
    assert hasattr(loaded.optimizer, "register_local_var"), "the optimizer is distributed again"
    assert int(value(loaded.optimizer.iterations)) == 2, "the optimizer state is restored"
    for got, want in zip(loaded.optimizer.variables, model.optimizer.variables):
        np.testing.assert_allclose(value(got), value(want))
    loaded.fit(x, np.zeros((4, 1), np.float32), batch_size=4, epochs=1, verbose=0)
    weights = loaded.get_weights()[0]
    np.testing.assert_allclose(value(hvd.broadcast(weights, 0, name="keras.load.after")), weights, rtol=1e-6)


def test_argument_errors_tell_what_to_do():
    from horovod.common.types import ReduceOp

    with pytest.raises(ValueError, match="op currently only supports Average, Sum and Adasum, got MAX"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), op=ReduceOp.MAX)
    with pytest.raises(ValueError, match="Adasum does not support average_aggregated_gradients == True"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd.Adasum, backward_passes_per_step=2,
                                 average_aggregated_gradients=True)
    with pytest.raises(ValueError, match="gradient_predivide_factor not supported with op != Average"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="expects a Keras 3 optimizer"):
        hvd.DistributedOptimizer(object())
    with pytest.raises(ValueError, match="backward_passes_per_step must be >= 1"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=0)
    with pytest.raises(RuntimeError, match="BroadcastGlobalVariablesCallback"):
        hvd.broadcast_global_variables(0)


def test_join_lets_ranks_with_uneven_data_train_to_their_own_end():
    """Rank r applies 2 + r + 1 steps, then joins; a joined rank adds zeros to the others' averages (Average still
    divides by the job's size), and join() returns the last rank to join everywhere."""
    size, rank = hvd.size(), hvd.rank()
    v = keras.Variable(np.zeros(3, np.float32))
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=1.0))
    want = np.zeros(3, np.float32)
    for step in range(2 + rank + 1):
        apply_once(opt, [rank_grad((3,), rank)], [v])
        want -= sum(rank_grad((3,), r) for r in range(size) if step < 2 + r + 1) / size
        np.testing.assert_allclose(value(v), want, rtol=1e-6)       # the ranks that joined add zeros
    assert hvd.join() == size - 1
    last = hvd.allgather(np.array([size - 1], np.int64))
    np.testing.assert_array_equal(value(last), [size - 1] * size)
