"""horovod.tensorflow.keras's ZeroRedundancyOptimizer (ZeRO-1 for Keras 3 on TensorFlow) against
hvd.DistributedOptimizer.

Every rank builds the same float64 model (same seed) and trains on its own shard of the same global batches;
the variables have uneven sizes (35, 5, 15, 3, 6, 2 elements: at 3 ranks nothing divides evenly, at 4 one rank
owns a single small variable). After a few Adam steps the variables must equal those hvd.DistributedOptimizer
reaches, eagerly and inside a user's tf.function: rtol 1e-9, atol 1e-12 (both average the same per-rank
gradients, a reducescatter against an allreduce, so the runs agree to rounding of float64); in model.fit, whose
compiled loss rounds differently, rtol 1e-6. Each rank's Adam state covers its own variables only. Traces are
few: one tf.function and one model.fit.
"""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import keras  # noqa: E402

import horovod.tensorflow as hvd_tf  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402
from tests.support.process_sets import temporary_sets  # noqa: E402  (turns dynamic process sets on)

PER = 3
STEPS = 3
TOL = dict(rtol=1e-9, atol=1e-12)
# model.fit's train step rounds differently from the custom loop's (up to about 1e-8 relative after three steps):
# a wrong average or owner moves the variables by far more.
FIT_TOL = dict(rtol=1e-6, atol=1e-9)


def model(seed=0):
    keras.utils.set_random_seed(seed)
    m = keras.Sequential([keras.Input((7,), dtype="float64"),
                          keras.layers.Dense(5, activation="tanh", dtype="float64", name="a"),
                          keras.layers.Dense(3, activation="tanh", dtype="float64", name="b"),
                          keras.layers.Dense(2, dtype="float64", name="c")],
                         name="zero_model")      # one name: the optimizer's variables are named after its paths
    return m


def batches(steps=STEPS, seed=42):
    rng = np.random.default_rng(seed)
    size = hvd.size()
    return [(rng.standard_normal((PER * size, 7)), rng.standard_normal((PER * size, 2))) for _ in range(steps)]


def shard(t, rank=None):
    rank = hvd.rank() if rank is None else rank
    return t[rank * PER:(rank + 1) * PER]


LOSS = keras.losses.MeanSquaredError()      # as model.fit's compiled "mse" computes it


def gradients(m, x, y):
    with tf.GradientTape() as tape:
        loss = LOSS(y, m(x))
    return tape.gradient(loss, m.trainable_variables)


def train(m, opt, data, form="eager"):
    def step(x, y):
        opt.apply_gradients(zip(gradients(m, x, y), m.trainable_variables))

    step = tf.function(step) if form == "function" else step
    for x, y in data:
        step(tf.constant(shard(x)), tf.constant(shard(y)))
    return m


REFERENCE = {}


def reference(steps=STEPS, passes=1):
    """hvd.DistributedOptimizer(Adam)'s model after ``steps`` applies, made once per setting (eagerly)."""
    if (steps, passes) not in REFERENCE:
        m = model()
        opt = hvd.DistributedOptimizer(keras.optimizers.Adam(0.01), backward_passes_per_step=passes,
                                       name=f"zero.reference.{passes}")
        REFERENCE[steps, passes] = (train(m, opt, batches(steps)), opt)
    return REFERENCE[steps, passes]


def assert_same_variables(m, ref, **tol):
    for v, w in zip(m.trainable_variables, ref.trainable_variables, strict=True):
        np.testing.assert_allclose(v.numpy(), w.numpy(), err_msg=v.path, **(tol or TOL))


def assert_equal_across_ranks(m, process_set=hvd.global_process_set):
    flat = np.concatenate([v.numpy().reshape(-1) for v in m.trainable_variables])
    rows = hvd_tf.allgather_object(flat, process_set=process_set)
    for r, row in enumerate(rows):
        np.testing.assert_array_equal(row, rows[0], err_msg=f"rank {r}'s variables differ from the first's")


def slot_elements(opt):
    return sum(int(np.prod(v.shape)) for v in opt.variables if len(v.shape))


@pytest.mark.parametrize("form", ["eager", "function"])
def test_adam_matches_distributed_optimizer_and_state_is_sharded(form):
    m = model()
    opt = hvd.ZeroRedundancyOptimizer(keras.optimizers.Adam(0.01))
    assert isinstance(opt, keras.optimizers.Adam)
    train(m, opt, batches(), form)
    ref, ref_opt = reference()
    assert_same_variables(m, ref)
    assert_equal_across_ranks(m)
    assert int(opt.iterations.numpy()) == STEPS
    # Adam's m and v of every variable live on exactly one rank, and only for the variables it owns.
    total = 2 * sum(int(np.prod(v.shape)) for v in m.trainable_variables)
    per_rank = hvd_tf.allgather_object(slot_elements(opt))
    assert sum(per_rank) == total == slot_elements(ref_opt)
    owned = {v.path for i, v in enumerate(m.trainable_variables) if opt._hvd_shards.mine(i)}
    assert len(opt._momentums) == len(owned)
    assert {s.name[:-len("_momentum")] for s in opt._momentums} == {p.replace("/", "_") for p in owned}
    if hvd.size() > 1:
        assert max(per_rank) < total


def test_model_fit_matches_distributed_optimizer():
    data = batches()
    x = np.concatenate([shard(x) for x, _ in data])
    y = np.concatenate([shard(y) for _, y in data])

    def fit(optimizer):
        m = model()
        m.compile(optimizer=optimizer, loss="mse")
        m.fit(x, y, batch_size=PER, epochs=1, shuffle=False, verbose=0)
        return m

    m = fit(hvd.ZeroRedundancyOptimizer(keras.optimizers.Adam(0.01), name="zero.fit"))
    assert int(m.optimizer.iterations.numpy()) == STEPS
    assert_same_variables(m, reference()[0], **FIT_TOL)
    assert_equal_across_ranks(m)


def test_backward_passes_per_step_matches_distributed_optimizer():
    m = model()
    opt = hvd.ZeroRedundancyOptimizer(keras.optimizers.Adam(0.01), backward_passes_per_step=2, name="zero.passes")
    train(m, opt, batches(4))
    assert int(opt.iterations.numpy()) == 4
    assert_same_variables(m, reference(4, passes=2)[0])


def test_consolidated_state_equals_distributed_optimizers_and_loads_back():
    m = model()
    opt = hvd.ZeroRedundancyOptimizer(keras.optimizers.Adam(0.01), name="zero.consolidate")
    train(m, opt, batches())
    whole = opt.consolidated_optimizer()
    assert type(whole) is keras.optimizers.Adam
    ref_opt = reference()[1]
    assert [v.name for v in whole.variables] == [v.name for v in ref_opt.variables]
    for v, w in zip(whole.variables, ref_opt.variables):
        np.testing.assert_allclose(v.numpy(), w.numpy(), err_msg=v.name, **TOL)
    fresh = hvd.ZeroRedundancyOptimizer(keras.optimizers.Adam(0.01), name="zero.loaded")
    fresh.build(m.trainable_variables)
    fresh.load_consolidated(whole)
    for v, w in zip(fresh.variables, opt.variables, strict=True):
        np.testing.assert_array_equal(v.numpy(), w.numpy(), err_msg=v.name)


def test_process_set_and_a_rank_outside_it():
    size = hvd.size()
    if size < 2:
        pytest.skip("needs 2 ranks for a set that leaves one out")
    data = batches()
    with temporary_sets(range(size - 1)) as (ps,):
        m = train(model(), hvd.ZeroRedundancyOptimizer(keras.optimizers.Adam(0.01), process_set=ps,
                                                       name="zero.ps"), data)
        if ps.included():
            ref = train(model(), hvd.DistributedOptimizer(keras.optimizers.Adam(0.01), process_set=ps,
                                                          name="dist.ps"), data)
        else:                                           # outside the set: the plain optimizer alone
            ref = train(model(), keras.optimizers.Adam(0.01), data)
        assert_same_variables(m, ref)


def test_unsupported_settings_say_what_to_do():
    with pytest.raises(ValueError, match="global_clipnorm"):
        hvd.ZeroRedundancyOptimizer(keras.optimizers.Adam(0.01, global_clipnorm=1.0))
    with pytest.raises(ValueError, match="use_ema"):
        hvd.ZeroRedundancyOptimizer(keras.optimizers.Adam(0.01, use_ema=True))
    with pytest.raises(ValueError, match="backward_passes_per_step must be >= 1"):
        hvd.ZeroRedundancyOptimizer(keras.optimizers.Adam(0.01), backward_passes_per_step=0)
    with pytest.raises(ValueError, match="Keras 3 optimizer"):
        hvd.ZeroRedundancyOptimizer(object())
    with pytest.raises(ValueError, match="already wrapped"):
        hvd.ZeroRedundancyOptimizer(hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)))
