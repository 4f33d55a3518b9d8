"""SyncBatchNormalization equals keras BatchNormalization applied to the concatenated global batch.

Rank r holds r + 2 samples (ranks hold different batch sizes). Outputs, input gradients, allreduce-summed
gamma/beta gradients and the moving statistics must equal plain BatchNormalization run in one process on all
samples, for loss = sum_r sum(out_r * w_r); eagerly, inside tf.function, with a mask, and in model.fit.
"""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import horovod.tensorflow as hvd  # noqa: E402

TOL = dict(rtol=1e-9, atol=1e-9)
SHAPES = {"nc": ((3,), -1), "nhwc": ((4, 2, 3), -1), "ncl_axis1": ((3, 5), 1)}


def counts(size):
    return [r + 2 for r in range(size)]


def rows(rank, size):
    start = sum(counts(size)[:rank])
    return slice(start, start + counts(size)[rank])


def global_batch(size, feature_shape, seed):
    rng = np.random.default_rng(seed)
    n = sum(counts(size))
    return rng.normal(size=(n,) + feature_shape) * 2 + 1, rng.normal(size=(n,) + feature_shape)


def make_pair(channels, axis, momentum=0.9):
    rng = np.random.default_rng(77)
    kwargs = dict(axis=axis, momentum=momentum, epsilon=1e-3, dtype="float64",
                  gamma_initializer=keras.initializers.Constant(rng.uniform(0.5, 1.5, channels)),
                  beta_initializer=keras.initializers.Constant(rng.normal(size=channels)))
    return hvd.SyncBatchNormalization(**kwargs), keras.layers.BatchNormalization(**kwargs)


def forward_backward(layer, x, w, mask=None, compiled=False):
    def body(x, w):
        with tf.GradientTape() as tape:
            tape.watch(x)
            out = layer(x, training=True, mask=mask)
            loss = tf.reduce_sum(out * w)
        gx, gg, gb = tape.gradient(loss, [x, layer.gamma, layer.beta])
        return out, gx, gg, gb

    fn = tf.function(body) if compiled else body
    return [t.numpy() for t in fn(tf.constant(x), tf.constant(w))]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("kind", list(SHAPES))
def test_matches_batch_norm_on_the_global_batch(kind, compiled):
    rank, size = hvd.rank(), hvd.size()
    feature_shape, axis = SHAPES[kind]
    sync, ref = make_pair(feature_shape[axis - 1 if axis > 0 else axis], axis)  # shapes exclude the batch
    assert isinstance(sync, keras.layers.BatchNormalization)
    mine = rows(rank, size)
    for step in range(2):
        x_all, w_all = global_batch(size, feature_shape, seed=10 + step)
        out, gx, gg, gb = forward_backward(sync, x_all[mine], w_all[mine], compiled=compiled)
        ref_out, ref_gx, ref_gg, ref_gb = forward_backward(ref, x_all, w_all)
        np.testing.assert_allclose(out, ref_out[mine], **TOL)
        np.testing.assert_allclose(gx, ref_gx[mine], **TOL)
        np.testing.assert_allclose(hvd.allreduce(gg, op=hvd.Sum, name=f"sbn.gamma.{kind}.{compiled}.{step}"),
                                   ref_gg, **TOL)
        np.testing.assert_allclose(hvd.allreduce(gb, op=hvd.Sum, name=f"sbn.beta.{kind}.{compiled}.{step}"),
                                   ref_gb, **TOL)
        np.testing.assert_allclose(sync.moving_mean.numpy(), ref.moving_mean.numpy(), **TOL)
        np.testing.assert_allclose(sync.moving_variance.numpy(), ref.moving_variance.numpy(), **TOL)

    # Inference uses the moving statistics, locally, and does not change them.
    x_all, _ = global_batch(size, feature_shape, seed=99)
    before = sync.moving_mean.numpy().copy()
    np.testing.assert_allclose(sync(x_all[mine], training=False).numpy(),
                               ref(x_all[mine], training=False).numpy(), **TOL)
    np.testing.assert_array_equal(sync.moving_mean.numpy(), before)


def test_masked_samples_are_left_out_of_the_global_statistics():
    rank, size = hvd.rank(), hvd.size()
    sync, ref = make_pair(3, -1)
    x_all, w_all = global_batch(size, (4, 3), seed=5)
    mask_all = np.random.default_rng(6).uniform(size=x_all.shape[:-1]) > 0.3
    mine = rows(rank, size)
    out, gx, _, _ = forward_backward(sync, x_all[mine], w_all[mine], mask=tf.constant(mask_all[mine]))
    ref_out, ref_gx, _, _ = forward_backward(ref, x_all, w_all, mask=tf.constant(mask_all))
    # keras adds backend.epsilon() (1e-7) to the masked count; we divide by the exact count
    np.testing.assert_allclose(out, ref_out[mine], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(gx, ref_gx[mine], rtol=1e-6, atol=1e-6)


def test_in_model_fit_the_moving_statistics_cover_all_ranks():
    rank, size = hvd.rank(), hvd.size()
    x_all, _ = global_batch(size, (4,), seed=21)
    x_all = x_all.astype(np.float32).astype(np.float64)   # fit's data adapter passes float inputs as floatx
    y_all = np.zeros((len(x_all), 3))
    kernel = np.random.default_rng(3).normal(size=(4, 3))

    def model(bn):
        m = keras.Sequential([keras.Input((4,), dtype="float64"),
                              keras.layers.Dense(3, kernel_initializer=keras.initializers.Constant(kernel),
                                                 dtype="float64"), bn])
        m.compile(optimizer=keras.optimizers.SGD(learning_rate=0.0), loss="mse")
        return m

    sync, ref = make_pair(3, -1, momentum=0.5)
    mine = rows(rank, size)
    model(sync).fit(x_all[mine], y_all[mine], batch_size=len(x_all), epochs=1, verbose=0, shuffle=False)
    hidden = x_all @ kernel
    np.testing.assert_allclose(sync.moving_mean.numpy(), 0.5 * hidden.mean(axis=0), **TOL)
    np.testing.assert_allclose(sync.moving_variance.numpy(), 0.5 + 0.5 * hidden.var(axis=0), **TOL)


def test_fused_is_refused():
    with pytest.raises(ValueError, match="does not support fused=True"):
        hvd.SyncBatchNormalization(fused=True)


def test_config_round_trip_keeps_the_class():
    layer = hvd.SyncBatchNormalization(momentum=0.8)
    clone = keras.layers.deserialize(keras.layers.serialize(layer))
    assert type(clone) is hvd.SyncBatchNormalization and clone.momentum == 0.8
