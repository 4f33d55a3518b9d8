"""horovod.tensorflow.keras (Keras 3 on TensorFlow): the module's surface, sparse (tf.IndexedSlices) gradients,
TF compression, the optimizer inside a user's tf.function, and a cross-rank mismatch failing on every rank.
The backend-independent behaviour is in test_keras_*.py, which the keras suite runs on every backend."""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import keras  # noqa: E402

import horovod.tensorflow as hvd_tf  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402


def test_surface_matches_upstream():
    for name in ["init", "shutdown", "size", "rank", "local_rank", "cross_rank", "mpi_enabled", "gloo_enabled",
                 "nccl_built", "ProcessSet", "global_process_set", "add_process_set", "Average", "Sum",
                 "Compression", "DistributedOptimizer", "PartialDistributedOptimizer", "broadcast_global_variables",
                 "allreduce", "allgather", "broadcast", "reducescatter", "load_model", "callbacks"]:
        assert hasattr(hvd, name), name
    assert hvd.Compression is hvd_tf.Compression
    for name in ["BroadcastGlobalVariablesCallback", "MetricAverageCallback", "LearningRateWarmupCallback",
                 "LearningRateScheduleCallback", "BestModelCheckpoint"]:
        assert hasattr(hvd.callbacks, name), name
    assert isinstance(hvd.allreduce(np.ones(2, np.float32), name="tfk.eager"), tf.Tensor)


def embedding_grads(rank):
    """Sparse gradients of an embedding lookup whose rows depend on the rank."""
    emb = keras.layers.Embedding(6, 2, embeddings_initializer="zeros")
    emb.build((None,))
    ids = tf.constant([rank % 6, (rank + 2) % 6])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(emb(ids)) * float(rank + 1)
    return emb, tape.gradient(loss, emb.trainable_variables)


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_sparse_gradients_are_averaged(sparse_as_dense):
    size = hvd.size()
    emb, grads = embedding_grads(hvd.rank())
    assert isinstance(grads[0], tf.IndexedSlices)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), sparse_as_dense=sparse_as_dense)
    opt.apply_gradients(zip(grads, emb.trainable_variables))
    expected = np.zeros((6, 2))
    for r in range(size):
        for row in (r % 6, (r + 2) % 6):
            expected[row] -= (r + 1) / size
    np.testing.assert_allclose(emb.embeddings.numpy(), expected, rtol=1e-6)


def test_apply_gradients_inside_a_users_tf_function_with_fp16():
    size = hvd.size()
    var = keras.Variable(np.zeros(4, np.float32))
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), compression=hvd.Compression.fp16)

    @tf.function
    def step(scale):
        grad = tf.range(1.0, 5.0) * scale
        opt.apply_gradients([(grad, var)])

    for _ in range(2):
        step(tf.constant(float(hvd.rank() + 1)))
    mean_scale = (size + 1) / 2
    np.testing.assert_allclose(var.numpy(), -2 * np.arange(1.0, 5.0) * mean_scale, rtol=1e-3)


def test_tf_distributed_optimizer_delegates_keras_optimizers():
    if not hasattr(hvd_tf, "DistributedOptimizer"):
        pytest.skip("horovod.tensorflow.DistributedOptimizer is not available")
    opt = hvd_tf.DistributedOptimizer(keras.optimizers.Adam(0.01), backward_passes_per_step=1)
    assert isinstance(opt, keras.optimizers.Adam) and hasattr(opt, "register_local_var")


def test_a_shape_mismatch_in_fit_fails_on_every_rank():
    if hvd.size() == 1:
        pytest.skip("a cross-rank mismatch needs at least two ranks")
    width = 3 + hvd.rank()            # every rank builds a differently shaped layer
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(width)])
    model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), name="mismatch"), "mse")
    with pytest.raises(tf.errors.OpError) as info:
        model.fit(np.ones((4, 2), np.float32), np.ones((4, width), np.float32), batch_size=4, verbose=0)
    message = str(info.value)
    assert "mismatch" in message and "shape" in message.lower(), message
    out = hvd.allreduce(np.full(2, 1.0, np.float32), name="tfk.after.mismatch", op=hvd.Sum)
    np.testing.assert_allclose(out.numpy(), np.full(2, hvd.size()))
