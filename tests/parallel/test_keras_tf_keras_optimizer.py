"""Keras 2 through tf-keras (``TF_USE_LEGACY_KERAS=1``, so ``tf.keras`` is ``tf_keras``): DistributedOptimizer
for legacy optimizers (``tf.keras.optimizers.legacy.*`` built with ``lr=``) and tf_keras's v2 optimizers, in
``apply_gradients`` (eagerly and in a ``tf.function``) and ``model.fit``; its options, gradient aggregation,
local variables (``var.ref()``), PartialDistributedOptimizer, ``load_model`` and the errors a user sees.

tests/integration/test_keras_suite.py runs this file with TF_USE_LEGACY_KERAS=1; without it the file is skipped.
"""
import os

import numpy as np
import pytest

if os.environ.get("TF_USE_LEGACY_KERAS") != "1":
    pytest.skip("tf-keras bodies: run with TF_USE_LEGACY_KERAS=1 (the keras suite does)", allow_module_level=True)
tf = pytest.importorskip("tensorflow")
pytest.importorskip("tf_keras")
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import horovod.keras as hvd_keras  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402

keras = tf.keras
KINDS = ["legacy", "v2"]


def test_tf_keras_is_keras_2():
    import tf_keras

    assert keras.__name__.startswith("tf_keras") and tf_keras.__version__.startswith("2.")


def sgd(kind, lr, **kwargs):
    """A legacy SGD built the Keras 2 way (``lr=``), or tf_keras's v2 SGD."""
    if kind == "legacy":
        return keras.optimizers.legacy.SGD(lr=lr, **kwargs)
    return keras.optimizers.SGD(learning_rate=lr, **kwargs)


def rank_grad(shape, rank, scale=1.0):
    """A gradient that differs per rank: (rank + 1) * scale * [1, 2, ...]."""
    return np.arange(1, int(np.prod(shape)) + 1, dtype=np.float32).reshape(shape) * (rank + 1) * scale


def mean_over_ranks(shape, scale=1.0):
    return sum(rank_grad(shape, r, scale) for r in range(hvd.size())) / hvd.size()


def apply_once(opt, grads, variables):
    opt.apply_gradients(zip([tf.constant(g) for g in grads], variables))


@pytest.mark.parametrize("kind", KINDS)
def test_horovod_tensorflow_distributed_optimizer_takes_a_tf_keras_optimizer(kind):
    """``horovod.tensorflow.DistributedOptimizer`` hands a tf-keras optimizer to the Keras binding, as upstream."""
    import horovod.tensorflow as hvd_tf

    var = tf.Variable(np.zeros(3, np.float32))
    opt = hvd_tf.DistributedOptimizer(sgd(kind, 1.0))
    assert isinstance(opt, type(sgd(kind, 1.0)))
    apply_once(opt, [rank_grad((3,), hvd.rank())], [var])
    np.testing.assert_allclose(var.numpy(), -mean_over_ranks((3,)), rtol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("op_name", ["Average", "Sum"])
def test_apply_gradients_reduces_across_ranks(kind, op_name):
    op = getattr(hvd, op_name)
    a, b = tf.Variable(np.zeros((2, 3), np.float32)), tf.Variable(np.zeros(4, np.float32))
    opt = hvd.DistributedOptimizer(sgd(kind, 1.0), op=op)
    assert isinstance(opt, type(sgd(kind, 1.0))) and type(opt).__name__ == "SGD"
    assert float(keras.backend.get_value(opt.lr)) == pytest.approx(1.0), "optimizer.lr reads as in Keras 2"
    apply_once(opt, [rank_grad((2, 3), hvd.rank()), rank_grad((4,), hvd.rank(), 2.0)], [a, b])
    factor = hvd.size() if op == hvd.Sum else 1.0
    np.testing.assert_allclose(a.numpy(), -mean_over_ranks((2, 3)) * factor, rtol=1e-6)
    np.testing.assert_allclose(b.numpy(), -mean_over_ranks((4,), 2.0) * factor, rtol=1e-6)
    assert int(opt.iterations.numpy()) == 1


@pytest.mark.parametrize("kind,options", [("legacy", dict(gradient_predivide_factor=4.0)), ("v2", dict(groups=2)),
                                          ("legacy", dict(num_groups=3)), ("v2", dict(compression=hvd.Compression.fp16)),
                                          ("legacy", dict(compression=hvd_keras.Compression.fp16))],
                         ids=["predivide", "int-groups", "num_groups", "tf-fp16", "keras-fp16"])
def test_options_keep_the_average(kind, options):
    variables = [tf.Variable(np.zeros(s, np.float32)) for s in [(3,), (2, 2), (5,), (1,)]]
    opt = hvd.DistributedOptimizer(sgd(kind, 1.0), **options)

    @tf.function
    def step(grads):
        opt.apply_gradients(zip(grads, variables))

    step([tf.constant(rank_grad(v.shape, hvd.rank())) for v in variables])
    for v in variables:
        np.testing.assert_allclose(v.numpy(), -mean_over_ranks(v.shape), rtol=1e-3)


def test_groups_of_variables():
    variables = [tf.Variable(np.zeros(s, np.float32)) for s in [(3,), (2,), (4,)]]
    opt = hvd.DistributedOptimizer(sgd("legacy", 1.0), groups=[[variables[0], variables[2]]])
    apply_once(opt, [rank_grad(v.shape, hvd.rank()) for v in variables], variables)
    for v in variables:
        np.testing.assert_allclose(v.numpy(), -mean_over_ranks(v.shape), rtol=1e-6)


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_sparse_gradients_are_averaged(sparse_as_dense):
    emb = keras.layers.Embedding(6, 2, embeddings_initializer="zeros")
    emb.build((None,))
    ids = tf.constant([hvd.rank() % 6, (hvd.rank() + 2) % 6])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(emb(ids)) * float(hvd.rank() + 1)
    grads = tape.gradient(loss, emb.trainable_variables)
    assert isinstance(grads[0], tf.IndexedSlices)
    opt = hvd.DistributedOptimizer(sgd("legacy", 1.0), sparse_as_dense=sparse_as_dense)
    opt.apply_gradients(zip(grads, emb.trainable_variables))
    expected = np.zeros((6, 2))
    for r in range(hvd.size()):
        for row in (r % 6, (r + 2) % 6):
            expected[row] -= (r + 1) / hvd.size()
    np.testing.assert_allclose(emb.embeddings.numpy(), expected, rtol=1e-6)


class AddGradient(keras.optimizers.legacy.Optimizer):
    """A custom OptimizerV2 that adds the gradient to the variable (so the test reads the applied gradients)."""

    def _create_slots(self, var_list):
        pass

    def _resource_apply_dense(self, grad, var, apply_state=None):
        return var.assign_add(grad)


@pytest.mark.parametrize("average_aggregated,in_function", [(True, False), (False, True)],
                         ids=["averaged-eager", "summed-tf.function"])
def test_gradient_aggregation_applies_every_nth_pass(average_aggregated, in_function):
    passes = 3
    opt = hvd.DistributedOptimizer(AddGradient("add"), backward_passes_per_step=passes,
                                   average_aggregated_gradients=average_aggregated)
    var = tf.Variable([0.0])

    def step(grad):
        opt.apply_gradients([(grad, var)])

    step = tf.function(step) if in_function else step
    mean_rank = (hvd.size() - 1) / 2
    for i in range(2 * passes):
        step(tf.constant([float(hvd.rank()) + i]))
        applied = (i + 1) // passes
        # Each applied step adds the mean over ranks of the sum of its passes' gradients (rank + i).
        per_step = [sum(mean_rank + j for j in range(k * passes, (k + 1) * passes)) for k in range(applied)]
        if average_aggregated:
            per_step = [p / passes for p in per_step]
        np.testing.assert_allclose(var.numpy(), [sum(per_step)], rtol=1e-6, err_msg=f"after pass {i}")
        assert int(opt.iterations.numpy()) == i + 1, "every pass counts"


def test_gradient_aggregation_of_a_v2_optimizer_in_fit():
    x, y = np.ones((8, 3), np.float32), np.ones((8, 1), np.float32)
    model = keras.Sequential([keras.layers.Dense(1, input_shape=(3,), kernel_initializer="zeros")])
    model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=2), "mse")
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    # Two passes, one update with the summed gradient: d/dw mean((w.x - 1)^2) at w = 0 is -2 per pass.
    np.testing.assert_allclose(model.layers[0].kernel.numpy(), np.full((3, 1), 0.4), rtol=1e-5)
    assert int(model.optimizer.iterations.numpy()) == 2


@pytest.mark.parametrize("kind", KINDS)
def test_compute_gradients_returns_reduced_pairs_that_apply_gradients_does_not_reduce_again(kind):
    """Upstream's ``_compute_gradients``: op=Sum shows a second reduction (it would multiply by the size)."""
    var = tf.Variable(np.zeros(3, np.float32))
    opt = hvd.DistributedOptimizer(sgd(kind, 1.0), op=hvd.Sum)
    pairs = opt._compute_gradients(lambda: tf.reduce_sum(var * rank_grad((3,), hvd.rank())), [var],
                                   tape=tf.GradientTape() if kind == "v2" else None)
    total = mean_over_ranks((3,)) * hvd.size()
    [(grad, v)] = pairs
    assert v is var
    np.testing.assert_allclose(grad.numpy(), total, rtol=1e-6)
    opt.apply_gradients(pairs)
    np.testing.assert_allclose(var.numpy(), -total, rtol=1e-6)


def test_compute_gradients_with_aggregation_and_an_infinite_gradient():
    """backward_passes_per_step=2, summed: the second pass applies the sum of both passes' averages; an infinite
    gradient passes through unchanged."""
    var, other = tf.Variable([0.0]), tf.Variable([0.0])
    opt = hvd.DistributedOptimizer(AddGradient("add"), backward_passes_per_step=2, average_aggregated_gradients=False)
    mean_rank = (hvd.size() - 1) / 2
    for i in range(2):
        pairs = opt._compute_gradients(lambda i=i: var * (hvd.rank() + i) + other * np.inf, [var, other])
        opt.apply_gradients(pairs)
    np.testing.assert_allclose(var.numpy(), [2 * mean_rank + 1], rtol=1e-6)
    assert np.isinf(other.numpy()[0])
    assert int(opt.iterations.numpy()) == 2


@pytest.mark.parametrize("passes", [1, 2])
def test_register_local_var_keeps_its_gradient_local(passes):
    shared, local = tf.Variable(np.zeros(3, np.float32)), tf.Variable(np.zeros(3, np.float32))
    opt = hvd.DistributedOptimizer(AddGradient("add"), backward_passes_per_step=passes)
    opt.register_local_var(local)
    for _ in range(passes):
        apply_once(opt, [rank_grad((3,), hvd.rank()), rank_grad((3,), hvd.rank())], [shared, local])
    np.testing.assert_allclose(shared.numpy(), passes * mean_over_ranks((3,)), rtol=1e-6)
    # scale_local_gradients: the local gradient is divided by the size, like the averaged ones.
    np.testing.assert_allclose(local.numpy(), passes * rank_grad((3,), hvd.rank()) / hvd.size(), rtol=1e-6)


def test_partial_distributed_optimizer_with_one_local_layer():
    shared, local = keras.layers.Dense(2, use_bias=False), keras.layers.Dense(2, use_bias=False)
    for layer in (shared, local):
        layer.build((None, 3))
        layer.kernel.assign(np.zeros((3, 2), np.float32))
    opt = hvd_keras.PartialDistributedOptimizer(sgd("legacy", 1.0), local_layers=local)
    apply_once(opt, [rank_grad((3, 2), hvd.rank()), rank_grad((3, 2), hvd.rank())], [shared.kernel, local.kernel])
    np.testing.assert_allclose(shared.kernel.numpy(), -mean_over_ranks((3, 2)), rtol=1e-6)
    np.testing.assert_allclose(local.kernel.numpy(), -rank_grad((3, 2), hvd.rank()) / hvd.size(), rtol=1e-6)


def make_model(seed=1234):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.layers.Dense(8, activation="tanh", input_shape=(6,)), keras.layers.Dense(1)])


@pytest.mark.parametrize("kind", KINDS)
def test_fit_equals_single_process_training_on_the_global_batch(kind):
    size, rank, per_rank, steps = hvd.size(), hvd.rank(), 4, 5
    rng = np.random.RandomState(0)
    x = rng.randn(steps * size * per_rank, 6).astype(np.float32)
    y = rng.randn(steps * size * per_rank, 1).astype(np.float32)
    rows = np.concatenate([np.arange(k * size * per_rank + rank * per_rank, k * size * per_rank + (rank + 1) * per_rank)
                           for k in range(steps)])
    distributed = make_model()
    distributed.compile(hvd.DistributedOptimizer(sgd(kind, 0.1, momentum=0.5)), "mse")
    distributed.fit(x[rows], y[rows], batch_size=per_rank, shuffle=False, epochs=2, verbose=0)
    reference = make_model()
    reference.compile(sgd(kind, 0.1, momentum=0.5), "mse")
    reference.fit(x, y, batch_size=size * per_rank, shuffle=False, epochs=2, verbose=0)
    for got, want in zip(distributed.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_from_config_round_trip():
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(0.01))
    config = opt.get_config()
    assert opt.from_config(config).get_config() == config
    assert type(opt).from_config(config).get_config() == config
    assert opt.variables() == opt.variables, "the v2 optimizer's variables are callable too, as upstream's"


class ScaledSGD(keras.optimizers.legacy.SGD):
    """A user's optimizer class, which load_model finds through custom_optimizers."""


def scaled_mse(y_true, y_pred):
    return 2.0 * tf.reduce_mean(tf.square(y_true - y_pred))


@pytest.mark.parametrize("kind,suffix,saved_by_horovod", [
    ("legacy", ".h5", True), ("v2", ".keras", True), ("custom", ".h5", True), ("legacy", ".h5", False),
    ("v2", ".keras", False)])
def test_load_model_rewraps_the_optimizer(kind, suffix, saved_by_horovod, tmp_path):
    optimizer = ScaledSGD(lr=0.01, momentum=0.9) if kind == "custom" else (
        sgd("legacy", 0.01, momentum=0.9) if kind == "legacy" else keras.optimizers.Adam(0.01))
    model = make_model(seed=hvd.rank())
    # A model saved by a program without Horovod (its own, on each rank) is made distributed on loading too.
    model.compile(hvd.DistributedOptimizer(optimizer) if saved_by_horovod else optimizer, scaled_mse)
    x, y = np.ones((4, 6), np.float32), np.zeros((4, 1), np.float32)
    model.fit(x, y, batch_size=4, epochs=2, verbose=0)
    path = str(tmp_path / f"model-{hvd.rank()}{suffix}")
    model.save(path)
    custom = dict(custom_optimizers=[ScaledSGD]) if kind == "custom" else {}
    loaded = hvd.load_model(path, custom_objects={"scaled_mse": scaled_mse}, compression=hvd.Compression.fp16,
                            **custom)
    assert type(loaded.optimizer).__name__ == type(optimizer).__name__
    assert type(loaded.optimizer).__module__ == "horovod._keras", "upstream's module for the wrapper class"
    assert isinstance(loaded.optimizer, type(optimizer)) and hasattr(loaded.optimizer, "register_local_var")
    assert int(loaded.optimizer.iterations.numpy()) == 2, "the optimizer state is restored"
    for got, want in zip(loaded.optimizer.variables(), model.optimizer.variables()):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)
    if kind != "custom":                # plain tf_keras reads the file too, with the unwrapped optimizer
        plain = keras.models.load_model(path, custom_objects={"scaled_mse": scaled_mse})
        assert type(plain.optimizer) is type(optimizer) and int(plain.optimizer.iterations.numpy()) == 2
    hvd.broadcast_variables(loaded.variables + loaded.optimizer.variables(), root_rank=0)
    loaded.fit(x, y, batch_size=4, epochs=1, verbose=0)
    weights = loaded.get_weights()[0]
    np.testing.assert_allclose(hvd.broadcast(weights, 0, name="tfk.load.after").numpy(), weights, rtol=1e-6)


def test_errors_tell_what_to_do():
    from horovod.common.types import ReduceOp

    with pytest.raises(ValueError, match="op currently only supports Average, Sum and Adasum, got MIN"):
        hvd.DistributedOptimizer(sgd("legacy", 0.1), op=ReduceOp.MIN)
    with pytest.raises(ValueError, match="Adasum does not support average_aggregated_gradients == True"):
        hvd.DistributedOptimizer(sgd("v2", 0.1), op=hvd_keras.Adasum, average_aggregated_gradients=True)
    with pytest.raises(ValueError, match="gradient_predivide_factor not supported with op != Average"):
        hvd.DistributedOptimizer(sgd("v2", 0.1), op=hvd.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="backward_passes_per_step must be >= 1"):
        hvd.DistributedOptimizer(sgd("legacy", 0.1), backward_passes_per_step=0)
    with pytest.raises(ValueError, match="already a Horovod DistributedOptimizer"):
        hvd.DistributedOptimizer(hvd.DistributedOptimizer(sgd("legacy", 0.1)))
    with pytest.raises(ValueError, match="tf-keras"):
        hvd.DistributedOptimizer(object())
