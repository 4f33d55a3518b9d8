"""``Compression.powersgd`` in horovod.tensorflow (DistributedGradientTape, the TF1-style DistributedOptimizer run
eagerly) and in the Keras 3 DistributedOptimizer on the TensorFlow backend (``model.fit`` and an eager ``apply``
loop), against the single-process float64 reference of tests/support/powersgd_reference.py: every rank computes
every rank's gradient on its shard, reduces them as PowerSGD would, and its trained weights must match the
reference to rtol 1e-9 (float64 everywhere; the reference orthonormalises with QR, ours with Gram-Schmidt, which
agree up to rounding). On a set of one rank nothing is compressed (the reference then averages plainly)."""
import zlib

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import horovod.tensorflow as hvd  # noqa: E402
import horovod.tensorflow.keras as hvd_keras  # noqa: E402
from tests.support.powersgd_reference import PowerSGDReference  # noqa: E402
from tests.support.process_sets import even_odd_sets  # noqa: E402

SHARD = 3
LR = 0.125   # exact in float32 (the TF1 optimizer and Keras keep the learning rate as float32)
TOL = dict(rtol=1e-9, atol=1e-11)
# ``hidden_w`` (12 x 16, position 1) is compressed at rank 2; ``out_w`` (16 x 3) and the biases are not.
SHAPES = [(16,), (12, 16), (3,), (16, 3)]


def init_values():
    rng = np.random.default_rng(0)
    return [np.zeros(SHAPES[0]), rng.normal(size=SHAPES[1]) * 0.3, np.zeros(SHAPES[2]),
            rng.normal(size=SHAPES[3]) * 0.3]


def loss(params, x, y):
    b1, w1, b2, w2 = params
    h = tf.tanh(tf.matmul(x, w1) + b1)
    return tf.reduce_mean((tf.matmul(h, w2) + b2 - y) ** 2)


def batch(step, rank):
    """Float64 values that float32 holds exactly (Keras' fit casts its numpy inputs to float32)."""
    rng = np.random.default_rng(100 * step + rank)
    return tuple(rng.normal(size=(SHARD, d)).astype(np.float32).astype(np.float64) for d in (12, 3))


def gradients(values, x, y):
    params = [tf.constant(v) for v in values]
    with tf.GradientTape() as tape:
        tape.watch(params)
        value = loss(params, tf.constant(x), tf.constant(y))
    return [g.numpy() for g in tape.gradient(value, params)]


def tf_first_q(name, step, m, r, seed=0):
    """horovod.tensorflow's documented first Q; ``name`` is the gradient's position in the reduced list."""
    key = tf.constant([zlib.crc32(f"{seed}.{name}".encode()) & 0x7FFFFFFF, step], tf.int64)
    return tf.random.stateless_normal((m, r), seed=key, dtype=tf.float32).numpy().astype(np.float64)


def train_reference(compression, steps, ranks, lr=LR, average=True, order=None, passes=1):
    """The weights after ``steps`` updates of SGD on the reference's reduction of ``ranks``' gradients (each the
    sum over ``passes`` consecutive batches). ``order`` maps the weights (in SHAPES order) to their positions in
    the reduced list, when those differ."""
    values = init_values()
    order = order or list(range(len(values)))
    names = [str(order[i]) for i in range(len(values))]
    reference = PowerSGDReference(dict(zip(names, SHAPES)), len(ranks), rank=compression.matrix_approximation_rank,
                                  start=compression.start_powerSGD_iter if len(ranks) > 1 else 10 ** 9,
                                  warm_start=compression.warm_start, average=average, first_q=tf_first_q,
                                  seed=compression.random_seed)
    for i in range(steps):
        per_rank = [dict(zip(names, [sum(gs) for gs in zip(*[gradients(values, *batch(passes * i + k, r))
                                                             for k in range(passes)])]))
                    for r in ranks]
        reduced = reference.step(per_rank)
        values = [v - lr * reduced[name] for v, name in zip(values, names)]
    return values


def assert_close(actual, expected, **tol):
    for a, e in zip(actual, expected, strict=True):
        np.testing.assert_allclose(np.asarray(a), e, **(tol or TOL))


def train_tape(compression, steps, form, op=hvd.Average, lr=LR, process_set=hvd.global_process_set):
    params = [tf.Variable(v) for v in init_values()]

    def step(x, y):
        with tf.GradientTape() as tape:
            value = loss(params, x, y)
        tape = hvd.DistributedGradientTape(tape, compression=compression, op=op, process_set=process_set)
        for p, g in zip(params, tape.gradient(value, params)):
            p.assign_sub(lr * g)

    step = step if form == "eager" else tf.function(step)
    for i in range(steps):
        step(*[tf.constant(a) for a in batch(i, hvd.rank())])
    return [p.numpy() for p in params]


@pytest.mark.parametrize("form", ["eager", "function"])
def test_tape_matches_the_reference(form):
    """Two plain steps, then PowerSGD with warm start and error feedback, eagerly and in one tf.function."""
    compression = hvd.Compression.powersgd(matrix_approximation_rank=2, start_powerSGD_iter=2,
                                           random_seed=7 if form == "eager" else 8)
    trained = train_tape(compression, 5, form)
    assert_close(trained, train_reference(compression, 5, range(hvd.size())))
    if hvd.size() > 1:
        state = hvd.powersgd.shared_state(compression, "DistributedGradientTape", range(hvd.size()))
        assert [int(v.numpy()) for v in state.variables() if v.dtype == tf.int64] == [5]
        assert [tuple(v.shape) for v in state.variables() if v.dtype != tf.int64] == [(16, 2), (12, 16)]


def test_cold_start_sum_on_a_process_set():
    """A new Q every step and the Sum of the ranks' approximations, in a tf.function, on the set of this rank's
    parity (at 3 ranks, [0, 2] compresses and [1] has one rank, which only applies its own gradient)."""
    for this_set, _ in even_odd_sets():
        compression = hvd.Compression.powersgd(matrix_approximation_rank=2, start_powerSGD_iter=0, warm_start=False)
        members = this_set.ranks
        lr = LR / len(members)
        trained = train_tape(compression, 3, "function", op=hvd.Sum, lr=lr, process_set=this_set)
        assert_close(trained, train_reference(compression, 3, members, lr=lr, average=False))


def test_tf1_style_optimizer_eagerly():
    """horovod.tensorflow.DistributedOptimizer over tf.compat.v1.train.GradientDescentOptimizer, eagerly: the
    state is the optimizer's own (two optimizers with equal settings do not share it)."""
    compression = hvd.Compression.powersgd(matrix_approximation_rank=2, start_powerSGD_iter=1)
    results = []
    for _ in range(2):
        params = [tf.Variable(v) for v in init_values()]
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(LR), compression=compression)
        for i in range(3):
            x, y = [tf.constant(a) for a in batch(i, hvd.rank())]
            opt.minimize(lambda params=params, x=x, y=y: loss(params, x, y), var_list=params)
        results.append([p.numpy() for p in params])
    expected = train_reference(compression, 3, range(hvd.size()))
    assert_close(results[0], expected)
    assert_close(results[1], expected)


def keras_model():
    model = keras.Sequential([keras.Input((12,), dtype="float64"),
                              keras.layers.Dense(16, activation="tanh", dtype="float64"),
                              keras.layers.Dense(3, dtype="float64")])
    b1, w1, b2, w2 = init_values()
    model.set_weights([w1, b1, w2, b2])
    return model


@pytest.mark.parametrize("form", ["fit", "apply", "fit-2-passes"])
def test_keras_matches_the_reference(form):
    """Keras 3 on the TensorFlow backend: ``model.fit`` (its tf.function; also with backward_passes_per_step=2,
    PowerSGD then counts and compresses once per update) or an eager ``apply`` loop. The optimizer reduces the
    weights in Keras' order (kernel, bias, kernel, bias): the 12 x 16 kernel at 0. The loss is float64 too
    (Keras' default computes it in float32)."""
    compression = hvd_keras.Compression.powersgd(matrix_approximation_rank=2, start_powerSGD_iter=1)
    model = keras_model()
    passes = 2 if form == "fit-2-passes" else 1
    opt = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(LR), compression=compression,
                                         backward_passes_per_step=passes)
    steps = 3
    if form.startswith("fit"):
        model.compile(optimizer=opt, loss=keras.losses.MeanSquaredError(dtype="float64"))
        shards = [batch(i, hvd.rank()) for i in range(steps * passes)]
        x = np.concatenate([s[0] for s in shards])
        y = np.concatenate([s[1] for s in shards])
        model.fit(x, y, batch_size=SHARD, epochs=1, shuffle=False, verbose=0)
    else:
        for i in range(steps):
            x, y = [tf.constant(a) for a in batch(i, hvd.rank())]
            with tf.GradientTape() as tape:
                value = tf.reduce_mean((model(x) - y) ** 2)
            opt.apply(tape.gradient(value, model.trainable_variables), model.trainable_variables)
    w1, b1, w2, b2 = model.get_weights()
    expected = train_reference(compression, steps, range(hvd.size()), order=[1, 0, 3, 2], passes=passes)
    assert_close([b1, w1, b2, w2], expected)
    if hvd.size() > 1:
        assert [int(v.numpy()) for v in opt.powersgd_state.variables() if v.dtype == tf.int64] == [steps]


def test_refusals():
    """Adasum (tape, TF1-style and Keras optimizers), a single allreduce, and sparse gradients without
    sparse_as_dense (with it, the dense form is reduced)."""
    compression = hvd.Compression.powersgd(start_powerSGD_iter=0)
    message = "cannot be combined with op=hvd.Adasum"
    with tf.GradientTape() as tape:
        pass
    with pytest.raises(ValueError, match=message):
        hvd.DistributedGradientTape(tape, compression=compression, op=hvd.Adasum)
    with pytest.raises(ValueError, match=message):
        hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1), compression=compression,
                                 op=hvd.Adasum)
    with pytest.raises(ValueError, match=message):
        hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1), compression=compression, op=hvd.Adasum)
    with pytest.raises(ValueError, match="works in hvd.DistributedOptimizer only"):
        hvd.allreduce(tf.ones(3), compression=compression)

    table = tf.Variable(np.ones((40, 8)))

    def sparse_grads(sparse_as_dense):
        with tf.GradientTape() as tape:
            value = tf.reduce_sum(tf.gather(table, [1, 3]))
        tape = hvd.DistributedGradientTape(tape, compression=compression, sparse_as_dense=sparse_as_dense)
        return tape.gradient(value, [table])

    with pytest.raises(ValueError, match="is a tf.IndexedSlices .* Pass sparse_as_dense=True"):
        sparse_grads(False)
    (dense,) = sparse_grads(True)
    assert isinstance(dense, tf.Tensor) and dense.shape == (40, 8)


def test_an_elastic_reset_starts_every_state_again(monkeypatch):
    """horovod.tensorflow's elastic reset (after re-forming the job, on every rank) resets every PowerSGD state
    of the process, the optimizers' and the tapes': step 0, the first Qs, zero error feedback, so that
    survivors and new ranks agree. The re-forming itself is stubbed out: only what follows it is checked."""
    import horovod.tensorflow.elastic as tf_elastic

    compression = hvd.Compression.powersgd(matrix_approximation_rank=2, start_powerSGD_iter=0, random_seed=11)
    params = [tf.Variable(v) for v in init_values()]
    opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(LR), compression=compression)
    for i in range(2):
        x, y = [tf.constant(a) for a in batch(i, hvd.rank())]
        opt.minimize(lambda x=x, y=y: loss(params, x, y), var_list=params)
    tape_state = hvd.powersgd.shared_state(compression, "elastic", [0])
    tape_state._step(("k",)).assign(4)

    class Quiet:
        shutdown = init = staticmethod(lambda: None)

    monkeypatch.setattr(tf_elastic, "basics", Quiet)
    tf_elastic._reset()
    assert int(tape_state._step(("k",)).numpy()) == 0
    state = opt.powersgd_state
    assert [int(v.numpy()) for v in state.variables() if v.dtype == tf.int64] == [0]
    if hvd.size() > 1:          # the 12 x 16 weight (position 1) is compressed
        (slot,) = state._slots.values()
        np.testing.assert_array_equal(slot.q.numpy(), tf_first_q("1", 0, 16, 2, seed=11))
        assert not np.any(slot.error.numpy())
